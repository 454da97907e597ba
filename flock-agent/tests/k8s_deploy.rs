//! What a cluster installs: the CRD, the manifests under `deploy/`, and what
//! `flock-agent install-cni` writes on every node.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use flock_agent::daemon::defaults;
use flock_agent::install::{
    CONFLIST_NAME, Chained, DEFAULT_CHAIN, DEFAULT_CNI_VERSION, InstallPlan, conflist, install,
};
use flock_cni_proto::{CniVersion, Conflist, NetConf};
use flock_rpc::FlockNetConf;
use flock_rpc::defaults::{DEFAULT_AGENT_SOCKET, DEFAULT_DEL_QUEUE_DIR};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};

mod deploy_support;
use deploy_support::{committed_crd, documents, read, typed};

#[test]
fn committed_crd_is_what_flock_agent_crd_prints() {
    let printed = flock_agent::crd::node_config_yaml();
    let committed = committed_crd("nodeconfigs.flock.fritzlab.net.yaml");
    assert!(
        printed == committed,
        "the chart's charts/flock/crds/nodeconfigs.flock.fritzlab.net.yaml is stale: regenerate it with \
         `cargo run -p flock-agent -- crd > charts/flock/crds/nodeconfigs.flock.fritzlab.net.yaml`, then \
         `cargo xtask helm render`"
    );
    insta::assert_snapshot!(printed);
}

#[test]
fn crd_schema_validates_what_it_can() {
    let crd: serde_yaml::Value =
        serde_yaml::from_str(&flock_agent::crd::node_config_yaml()).expect("the CRD is YAML");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "nc");
    assert_eq!(
        version["subresources"]["status"],
        serde_yaml::Value::Mapping(Default::default())
    );
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    for cidr in ["cidr6", "cidr4"] {
        assert_eq!(spec[cidr]["format"], "cidr", "{cidr}");
        assert!(spec[cidr]["pattern"].is_string(), "{cidr}");
    }
    let bgp = &spec["bgp"]["properties"];
    for asn in [&bgp["asn"], &bgp["neighbors"]["items"]["properties"]["asn"]] {
        assert_eq!(asn["minimum"].as_f64(), Some(1.0));
        assert_eq!(asn["maximum"].as_f64(), Some(4294967295.0));
    }
    assert_eq!(bgp["routerId"]["format"], "ipv4");
    // The new neighbor options are range-checked by the API server already.
    let neighbor = &bgp["neighbors"]["items"]["properties"];
    let gr = &neighbor["gracefulRestart"]["properties"];
    assert_eq!(gr["restartTime"]["maximum"].as_f64(), Some(4095.0));
    assert_eq!(
        gr["longLivedStaleTime"]["maximum"].as_f64(),
        Some(16777215.0)
    );
    assert_eq!(neighbor["bfdIntervalMs"]["maximum"].as_f64(), Some(60000.0));
    assert_eq!(neighbor["bfdMultiplier"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(neighbor["interface"]["maxLength"].as_u64(), Some(15));
    let secret_ref = &neighbor["passwordSecretRef"];
    let mut required: Vec<&str> = secret_ref["required"]
        .as_sequence()
        .expect("required keys")
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["key", "name", "namespace"]);
    let columns: Vec<String> = version["additionalPrinterColumns"]
        .as_sequence()
        .expect("printer columns")
        .iter()
        .map(|c| c["jsonPath"].as_str().expect("jsonPath").to_owned())
        .collect();
    for path in [
        ".spec.cidr6",
        ".spec.cidr4",
        ".status.allocated6",
        ".status.allocated4",
    ] {
        assert!(
            columns.iter().any(|c| c == path),
            "no printer column {path}"
        );
    }
    assert!(columns.iter().any(|c| c.starts_with(".status.bgp")));
}

#[test]
fn example_nodeconfig_is_valid() {
    let nc: flock_k8s_api::NodeConfig =
        serde_yaml::from_str(&read("deploy/nodeconfig-example.yaml")).expect("parses");
    let settings = nc.settings().expect("validates");
    assert!(settings.cidr6.is_some() && settings.bgp.is_some());
}

fn image_of_dockerfile() -> String {
    let dockerfile = read("deploy/Dockerfile");
    let tag = dockerfile
        .split_whitespace()
        .skip_while(|w| *w != "-t")
        .nth(1)
        .expect("the Dockerfile says how to build and tag the image (`-t IMAGE`)")
        .to_owned();
    assert!(
        dockerfile.contains("/usr/local/bin/flock-agent")
            && dockerfile.contains("/usr/local/bin/flock\n"),
        "the image holds the agent and the shim under /usr/local/bin"
    );
    assert!(
        dockerfile.contains("bird2"),
        "the image holds bird and birdc"
    );
    tag
}

fn env(c: &Container, name: &str) -> Option<String> {
    c.env
        .as_deref()?
        .iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn mount_paths(c: &Container) -> BTreeSet<String> {
    c.volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|m| m.mount_path.clone())
        .collect()
}

fn parent(path: &str) -> String {
    Path::new(path)
        .parent()
        .expect("parent")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn daemonset_uses_one_image_and_the_code_defaults() {
    let ds: DaemonSet = typed(&documents("deploy/daemonset.yaml")[0]);
    let ds_namespace = ds.metadata.namespace.clone();
    let pod = ds.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(
        pod.host_network,
        Some(true),
        "flock programs the node's namespace"
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("flock"));
    let image = image_of_dockerfile();
    assert_eq!(
        image,
        format!("ghcr.io/fritzlab/flock:v{}", env!("CARGO_PKG_VERSION"))
    );
    let init = pod.init_containers.clone().unwrap_or_default();
    let all: Vec<&Container> = init.iter().chain(pod.containers.iter()).collect();
    assert_eq!(all.len(), 2, "install-cni, agent");
    for c in &all {
        assert_eq!(
            c.image.as_deref(),
            Some(image.as_str()),
            "container {}",
            c.name
        );
    }

    let install = init
        .iter()
        .find(|c| c.name == "install-cni")
        .expect("install-cni");
    let args = install.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("install-cni"));
    let arg = |flag: &str| {
        args.iter()
            .skip_while(|a| *a != flag)
            .nth(1)
            .cloned()
            .unwrap_or_else(|| panic!("install-cni {flag}"))
    };
    assert_eq!(arg("--shim"), "/usr/local/bin/flock");
    let host_path = |volume_of_mount: &str| {
        let mount = install
            .volume_mounts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|m| m.mount_path == volume_of_mount)
            .unwrap_or_else(|| panic!("nothing mounted at {volume_of_mount}"));
        pod.volumes
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
            .expect("a hostPath volume")
    };
    assert_eq!(host_path(&arg("--bin-dir")), defaults::CNI_BIN_DIR);
    assert_eq!(host_path(&arg("--conf-dir")), defaults::CNI_CONF_DIR);

    let agent = pod
        .containers
        .iter()
        .find(|c| c.name == "agent")
        .expect("agent");
    assert_eq!(
        agent.args.as_deref(),
        Some(&["run".to_owned()][..]),
        "Kubernetes mode"
    );
    let node_name = agent
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == "FLOCK_NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node_name.as_deref(), Some("spec.nodeName"));
    for (var, default) in [
        ("FLOCK_SOCKET", defaults::SOCKET),
        ("FLOCK_STATE_DIR", defaults::STATE_DIR),
        ("FLOCK_BIRD_CONFIG", defaults::BIRD_CONFIG),
        ("FLOCK_BIRD_SOCKET", defaults::BIRD_SOCKET),
        ("FLOCK_METRICS_ADDR", defaults::METRICS_ADDR),
    ] {
        if let Some(value) = env(agent, var) {
            assert_eq!(value, default, "{var}");
        }
    }
    let agent_mounts = mount_paths(agent);
    for dir in [
        parent(defaults::SOCKET),
        defaults::STATE_DIR.to_owned(),
        parent(defaults::BIRD_CONFIG),
    ] {
        assert!(agent_mounts.contains(&dir), "the agent mounts {dir}");
    }
    let port = defaults::METRICS_ADDR.rsplit(':').next().expect("port");
    for probe in [
        &agent.readiness_probe,
        &agent.liveness_probe,
        &agent.startup_probe,
    ] {
        let http = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(
            serde_json::to_value(&http.port).expect("port"),
            serde_json::json!(port.parse::<u16>().expect("port"))
        );
    }

    // BIRD: its own DaemonSet, so that an upgrade of the agent leaves it (and its sessions)
    // running; same image, no API access.
    let bird_ds: DaemonSet = typed(&documents("deploy/daemonset.yaml")[1]);
    assert_eq!(bird_ds.metadata.name.as_deref(), Some("flock-bird"));
    assert_eq!(bird_ds.metadata.namespace, ds_namespace);
    let bird_pod = bird_ds.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(bird_pod.host_network, Some(true));
    assert_eq!(bird_pod.automount_service_account_token, Some(false));
    let [bird] = bird_pod.containers.as_slice() else {
        panic!("one container in flock-bird");
    };
    assert_eq!(bird.image.as_deref(), Some(image.as_str()));
    let script = bird.args.clone().unwrap_or_default().join(" ");
    assert!(
        script.contains(&format!("-c {}", defaults::BIRD_CONFIG)),
        "{script}"
    );
    assert!(
        script.contains(&format!("-s {}", defaults::BIRD_SOCKET)),
        "{script}"
    );
    let bird_mounts = mount_paths(bird);
    for dir in [parent(defaults::BIRD_SOCKET), parent(defaults::BIRD_CONFIG)] {
        assert!(bird_mounts.contains(&dir), "BIRD mounts {dir}");
    }

    // The agent and BIRD are Burstable, never BestEffort: a BestEffort container's CPU weight
    // (2 against an ordinary process's 1024) starved BIRD past BFD's 300 ms on a busy node.
    // No CPU limit: throttling would do the same.
    let agent = pod
        .containers
        .iter()
        .find(|c| c.name == "agent")
        .expect("the agent container");
    for c in [agent, bird] {
        let resources = c.resources.clone().unwrap_or_default();
        let requests = resources.requests.unwrap_or_default();
        for what in ["cpu", "memory"] {
            assert!(
                requests.contains_key(what),
                "container {} requests no {what}",
                c.name
            );
        }
        let limits = resources.limits.unwrap_or_default();
        assert!(
            !limits.contains_key("cpu"),
            "container {} has a CPU limit",
            c.name
        );
    }
    // The agent and BIRD share the config and control-socket directories: the same host
    // paths, from two pods.
    for dir in [parent(defaults::BIRD_SOCKET), parent(defaults::BIRD_CONFIG)] {
        let host_path = |c: &Container, volumes: &[k8s_openapi::api::core::v1::Volume]| {
            let mount = c
                .volume_mounts
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|m| m.mount_path == dir)
                .map(|m| m.name.clone())?;
            volumes
                .iter()
                .find(|v| v.name == mount)
                .and_then(|v| v.host_path.as_ref())
                .map(|h| h.path.clone())
        };
        let a = host_path(agent, pod.volumes.as_deref().unwrap_or_default());
        let b = host_path(bird, bird_pod.volumes.as_deref().unwrap_or_default());
        assert!(a.is_some() && a == b, "{dir}: agent {a:?}, BIRD {b:?}");
    }
}

#[test]
fn rbac_grants_exactly_what_the_agent_uses() {
    let docs = documents("deploy/rbac.yaml");
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding"
        ]
    );
    let sa: ServiceAccount = typed(&docs[0]);
    let role: ClusterRole = typed(&docs[1]);
    let binding: ClusterRoleBinding = typed(&docs[2]);
    assert!(role.aggregation_rule.is_none());
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap_or_default() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    granted.insert(format!("{group}/{resource}:{verb}"));
                }
            }
        }
    }
    let allowed: BTreeSet<String> = [
        "/pods:list",
        "/pods:watch",
        "/namespaces:list",
        "/namespaces:watch",
        "networking.k8s.io/networkpolicies:list",
        "networking.k8s.io/networkpolicies:watch",
        "policy.networking.k8s.io/clusternetworkpolicies:list",
        "policy.networking.k8s.io/clusternetworkpolicies:watch",
        "flock.fritzlab.net/nodeconfigs:list",
        "flock.fritzlab.net/nodeconfigs:watch",
        "flock.fritzlab.net/nodeconfigs/status:patch",
        // Service announcing: Services, their EndpointSlices, events on refused addresses.
        "/services:list",
        "/services:watch",
        "discovery.k8s.io/endpointslices:list",
        "discovery.k8s.io/endpointslices:watch",
        "events.k8s.io/events:create",
        "events.k8s.io/events:patch",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(granted, allowed);
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        Some(binding.role_ref.name.as_str()),
        role.metadata.name.as_deref()
    );
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.metadata.namespace);
    let ds: DaemonSet = typed(&documents("deploy/daemonset.yaml")[0]);
    assert_eq!(ds.metadata.namespace, sa.metadata.namespace);

    // BGP passwords: `get` on one named Secret, in its namespace, nothing else.
    let secrets: Role = typed(&docs[3]);
    let secrets_binding: RoleBinding = typed(&docs[4]);
    let rules = secrets.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["secrets".to_owned()][..])
    );
    assert_eq!(rules[0].verbs, ["get"]);
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["flock-bgp-passwords".to_owned()][..]),
        "the agent may read only the named password Secret"
    );
    assert_eq!(secrets.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(
        secrets_binding.metadata.namespace,
        secrets.metadata.namespace
    );
    assert_eq!(secrets_binding.role_ref.kind, "Role");
    assert_eq!(
        Some(secrets_binding.role_ref.name.as_str()),
        secrets.metadata.name.as_deref()
    );
    let subjects = secrets_binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.metadata.namespace);
}

fn plan(root: &Path, mtu: Option<u32>) -> InstallPlan {
    let shim = root.join("build/flock");
    std::fs::create_dir_all(shim.parent().expect("dir")).expect("mkdir");
    std::fs::write(&shim, b"#!/bin/sh\necho stand-in shim\n").expect("shim");
    let bin_dir = root.join("host/opt/cni/bin");
    stand_in_plugins(&bin_dir);
    InstallPlan {
        shim,
        bin_dir,
        conf_dir: root.join("host/etc/cni/net.d"),
        network: "flock".into(),
        cni_version: DEFAULT_CNI_VERSION,
        agent_socket: DEFAULT_AGENT_SOCKET.into(),
        del_queue_dir: DEFAULT_DEL_QUEUE_DIR.into(),
        mtu,
        chain: DEFAULT_CHAIN.to_vec(),
    }
}

/// A node's CNI binary directory as the reference plugins' package leaves it: stand-ins for
/// the plugins `install-cni` may chain.
fn stand_in_plugins(bin_dir: &Path) {
    std::fs::create_dir_all(bin_dir).expect("mkdir");
    for plugin in Chained::ALL {
        std::fs::write(bin_dir.join(plugin.name()), b"#!/bin/sh\n").expect("plugin");
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn install_cni_conflist_snapshot() {
    let root = tempfile::tempdir().expect("tmp");
    let plan = plan(root.path(), Some(1500));
    install(&plan).expect("install");
    let text = std::fs::read_to_string(plan.conf_dir.join(CONFLIST_NAME)).expect("conflist");
    let parsed: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(parsed, conflist(&plan));
    insta::assert_snapshot!(text);
}

/// containerd 1.6 and 1.7 (libcni 1.1) ignore `cniVersions`, run the list in its `cniVersion`
/// and fail every pod on a result newer than 1.0.0; a runtime that knows CNI 1.1 picks 1.1.0.
#[test]
fn installed_conflist_runs_in_1_0_0_under_containerd_1_6_and_1_1_0_where_known() {
    let root = tempfile::tempdir().expect("tmp");
    let plan = plan(root.path(), Some(1500));
    install(&plan).expect("install");
    let text = std::fs::read(plan.conf_dir.join(CONFLIST_NAME)).expect("conflist");
    let list = Conflist::from_slice(&text).expect("a valid conflist");
    assert_eq!(list.cni_version, CniVersion::V1_0_0);
    let libcni_1_1 = [CniVersion::V0_4_0, CniVersion::V1_0_0];
    assert_eq!(list.version_for(&libcni_1_1), CniVersion::V1_0_0);
    assert_eq!(list.version_for(&CniVersion::SUPPORTED), CniVersion::V1_1_0);
    // The shim reads the plugin's config as intended, the DEL queue included.
    let conf = NetConf::from_value(&list.plugin_config(0, None).expect("one plugin"))
        .expect("plugin config");
    let flock = FlockNetConf::from_netconf(&conf).expect("flock's config");
    assert_eq!(flock.agent_socket, Path::new(DEFAULT_AGENT_SOCKET));
    assert_eq!(flock.del_queue_dir, Path::new(DEFAULT_DEL_QUEUE_DIR));
    assert_eq!(flock.mtu, Some(1500));
}

/// Until the agent's `run` flags take their defaults from `flock_rpc::defaults`, they
/// must at least agree with them: the shim falls back to these when the conflist is silent.
#[test]
fn the_agents_defaults_are_the_shims() {
    assert_eq!(defaults::SOCKET, DEFAULT_AGENT_SOCKET);
    assert_eq!(
        flock_rpc::defaults::del_queue_dir(Path::new(defaults::STATE_DIR)),
        Path::new(DEFAULT_DEL_QUEUE_DIR)
    );
}

/// Runs `flock-agent install-cni` with a stand-in shim into `root`'s bin and conf dirs, no
/// `FLOCK_*` variable but `env`.
fn install_cni(root: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let shim = root.join("build/flock");
    std::fs::create_dir_all(shim.parent().expect("dir")).expect("mkdir");
    std::fs::write(&shim, b"#!/bin/sh\n").expect("shim");
    stand_in_plugins(&root.join("bin"));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flock-agent"));
    cmd.env_clear()
        .envs(env.iter().copied())
        .arg("install-cni")
        .arg("--shim")
        .arg(&shim)
        .arg("--bin-dir")
        .arg(root.join("bin"))
        .arg("--conf-dir")
        .arg(root.join("net.d"))
        .args(args);
    cmd.output().expect("run flock-agent install-cni")
}

fn installed(root: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(root.join("net.d").join(CONFLIST_NAME)).expect("conflist");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn install_cni_flags_set_the_version_and_the_del_queue() {
    // No flags: the library's plan with every default.
    let root = tempfile::tempdir().expect("tmp");
    let out = install_cni(root.path(), &[], &[]);
    assert!(out.status.success(), "{out:?}");
    let defaults_plan = plan(root.path(), None);
    assert_eq!(installed(root.path()), conflist(&defaults_plan));
    // no mtu: the agent gives pods the uplink's
    assert!(installed(root.path())["plugins"][0].get("mtu").is_none());
    assert_eq!(installed(root.path())["cniVersion"], "1.0.0");
    assert_eq!(
        installed(root.path())["cniVersions"],
        serde_json::json!(["1.0.0", "1.1.0"])
    );

    // The queue follows the agent's state dir, flag or env, unless given itself.
    for (args, env, queue) in [
        (
            &["--state-dir", "/srv/flock"][..],
            &[][..],
            "/srv/flock/del-queue",
        ),
        (
            &[],
            &[("FLOCK_STATE_DIR", "/srv/flock")],
            "/srv/flock/del-queue",
        ),
        (
            &["--state-dir", "/srv/flock", "--del-queue-dir", "/srv/q"],
            &[],
            "/srv/q",
        ),
        (&[], &[("FLOCK_DEL_QUEUE_DIR", "/srv/q")], "/srv/q"),
    ] {
        let root = tempfile::tempdir().expect("tmp");
        let out = install_cni(root.path(), args, env);
        assert!(out.status.success(), "{args:?} {env:?}: {out:?}");
        assert_eq!(
            installed(root.path())["plugins"][0]["delQueueDir"],
            queue,
            "{args:?} {env:?}"
        );
    }

    for (args, env, version, versions) in [
        (
            &["--cni-version", "1.1.0"][..],
            &[][..],
            "1.1.0",
            &["1.1.0"][..],
        ),
        (
            &[],
            &[("FLOCK_CNI_VERSION", "0.4.0")],
            "0.4.0",
            &["0.4.0", "1.0.0", "1.1.0"],
        ),
    ] {
        let root = tempfile::tempdir().expect("tmp");
        let out = install_cni(root.path(), args, env);
        assert!(out.status.success(), "{args:?} {env:?}: {out:?}");
        let list = installed(root.path());
        assert_eq!(list["cniVersion"], version);
        assert_eq!(list["cniVersions"], serde_json::json!(versions));
    }

    // portmap by default; --chain (or FLOCK_CNI_CHAIN) names the chain, `none` leaves flock
    // alone. Each chained plugin carries the capability the runtime fills in for it.
    for (args, env, chain) in [
        (&[][..], &[][..], &[("portmap", "portMappings")][..]),
        (&["--chain", "none"], &[], &[]),
        (
            &["--chain", "bandwidth,portmap"],
            &[],
            &[("bandwidth", "bandwidth"), ("portmap", "portMappings")],
        ),
        (
            &[],
            &[("FLOCK_CNI_CHAIN", "bandwidth")],
            &[("bandwidth", "bandwidth")],
        ),
    ] {
        let root = tempfile::tempdir().expect("tmp");
        let out = install_cni(root.path(), args, env);
        assert!(out.status.success(), "{args:?} {env:?}: {out:?}");
        let list = installed(root.path());
        let plugins = list["plugins"].as_array().expect("plugins");
        assert_eq!(plugins[0]["type"], "flock", "{args:?} {env:?}");
        let chained: Vec<(String, String)> = plugins[1..]
            .iter()
            .map(|p| {
                let caps = p["capabilities"].as_object().expect("capabilities");
                assert_eq!(caps.len(), 1, "{p}");
                let (cap, on) = caps.iter().next().expect("one capability");
                assert_eq!(on, true, "{p}");
                (p["type"].as_str().expect("type").to_owned(), cap.clone())
            })
            .collect();
        let want: Vec<(String, String)> = chain
            .iter()
            .map(|(t, c)| ((*t).to_owned(), (*c).to_owned()))
            .collect();
        assert_eq!(chained, want, "{args:?} {env:?}");
    }
}

/// A chained plugin the node lacks would fail every pod's ADD: install-cni refuses, names the
/// missing binary and what to do, and installs nothing.
#[test]
fn install_cni_refuses_a_chain_whose_plugin_the_node_lacks() {
    let root = tempfile::tempdir().expect("tmp");
    let good = plan(root.path(), Some(1500));
    std::fs::remove_file(good.bin_dir.join("portmap")).expect("remove portmap");
    let e = install(&good).expect_err("portmap is missing");
    let missing = good.bin_dir.join("portmap");
    assert!(
        matches!(&e, flock_agent::Error::Install { op, path, .. }
            if *op == "find the chained plugin" && *path == missing),
        "{e:?}"
    );
    let line = flock_cni_proto::error::cause_chain(&e);
    assert!(
        line.contains("reference CNI plugins") && line.contains("--chain none"),
        "{line}"
    );
    assert!(!good.bin_dir.join("flock").exists(), "no shim installed");
    assert!(!good.conf_dir.exists(), "no conflist installed");
    // Without portmap in the chain, the same node takes flock alone.
    let alone = InstallPlan {
        chain: Vec::new(),
        ..good
    };
    install(&alone).expect("flock alone");
    assert_eq!(
        installed_at(&alone)["plugins"].as_array().map(Vec::len),
        Some(1)
    );
}

fn installed_at(plan: &InstallPlan) -> serde_json::Value {
    let text = std::fs::read_to_string(plan.conf_dir.join(CONFLIST_NAME)).expect("conflist");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn install_cni_refuses_what_the_shim_would_refuse_and_writes_nothing() {
    for (args, env, needles) in [
        (
            &["--cni-version", "0.3.1"][..],
            &[][..],
            &["--cni-version", "0.3.1", "0.4.0, 1.0.0, 1.1.0"][..],
        ),
        (
            &[],
            &[("FLOCK_CNI_VERSION", "1.1")],
            &["--cni-version", "\"1.1\""],
        ),
        (
            &["--agent-socket", "run/agent.sock"],
            &[],
            &["check the conflist", "agentSocket", "run/agent.sock"],
        ),
        (
            &["--del-queue-dir", "q"],
            &[],
            &["check the conflist", "delQueueDir", "\"q\""],
        ),
        (&["--mtu", "40"], &[], &["check the conflist", "mtu 40"]),
        (
            &["--chain", "portmap,tuning"],
            &[],
            &["--chain", "\"tuning\"", "portmap, bandwidth, or none"],
        ),
        (
            &[],
            &[("FLOCK_CNI_CHAIN", "")],
            &["\"\"", "portmap, bandwidth, or none"],
        ),
    ] {
        let root = tempfile::tempdir().expect("tmp");
        let out = install_cni(root.path(), args, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} {env:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?} {env:?}: {stderr}");
        }
        assert!(
            !root.path().join("bin/flock").exists() && !root.path().join("net.d").exists(),
            "{args:?} {env:?}: nothing is installed"
        );
    }
}

#[test]
fn install_failures_are_install_errors_naming_the_step_and_path() {
    let root = tempfile::tempdir().expect("tmp");
    let good = plan(root.path(), Some(1500));
    let in_the_way = root.path().join("a-file");
    std::fs::write(&in_the_way, b"").expect("file");
    let taken = root.path().join("taken");
    // The conflist's name is taken by a directory that is not empty: the rename fails.
    std::fs::create_dir_all(taken.join(CONFLIST_NAME).join("x")).expect("dir");
    for (plan, step, path) in [
        (
            InstallPlan {
                shim: root.path().join("no-such-shim"),
                ..good.clone()
            },
            "read the shim",
            root.path().join("no-such-shim"),
        ),
        (
            InstallPlan {
                bin_dir: in_the_way.join("bin"),
                chain: Vec::new(),
                ..good.clone()
            },
            "create directory",
            in_the_way.join("bin"),
        ),
        (
            InstallPlan {
                conf_dir: taken.clone(),
                ..good.clone()
            },
            "write the conflist",
            taken.join(CONFLIST_NAME),
        ),
    ] {
        let e = install(&plan).expect_err(step);
        assert!(
            matches!(&e, flock_agent::Error::Install { op, path: p, .. } if *op == step && *p == path),
            "{e:?}"
        );
        let line = flock_cni_proto::error::cause_chain(&e);
        assert!(
            line.starts_with(&format!("install-cni: {step} {}: ", path.display())),
            "{line}"
        );
        assert!(!line.contains("allocation store"), "{line}");
    }
}

#[test]
fn install_cni_twice_is_idempotent_and_leaves_no_temporary_file() {
    let (a, b) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let (pa, pb) = (plan(a.path(), Some(1500)), plan(b.path(), Some(1500)));
    let first = install(&pa).expect("install");
    let conf = std::fs::read(pa.conf_dir.join(CONFLIST_NAME)).expect("conf");
    let shim = std::fs::read(pa.bin_dir.join("flock")).expect("shim");
    assert_eq!(install(&pa).expect("again"), first);
    assert_eq!(
        std::fs::read(pa.conf_dir.join(CONFLIST_NAME)).expect("conf"),
        conf
    );
    assert_eq!(std::fs::read(pa.bin_dir.join("flock")).expect("shim"), shim);
    assert_eq!(shim, std::fs::read(&pa.shim).expect("source"));
    // Another node (directory) gets byte-identical files.
    install(&pb).expect("install b");
    assert_eq!(
        std::fs::read(pb.conf_dir.join(CONFLIST_NAME)).expect("conf"),
        conf
    );
    for p in [&pa, &pb] {
        assert_eq!(
            names(&p.bin_dir),
            ["bandwidth", "flock", "portmap"],
            "no temporary file left"
        );
        assert_eq!(
            names(&p.conf_dir),
            [CONFLIST_NAME],
            "no temporary file left"
        );
        let mode = std::fs::metadata(p.bin_dir.join("flock"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "the shim is executable");
    }
}

#[test]
fn install_cni_replaces_files_by_rename_never_in_place() {
    let root = tempfile::tempdir().expect("tmp");
    let old_plan = plan(root.path(), Some(1500));
    install(&old_plan).expect("install");
    let conf_path = old_plan.conf_dir.join(CONFLIST_NAME);
    let shim_path = old_plan.bin_dir.join("flock");
    // A runtime that opened the old files keeps reading them whole.
    let mut old_conf = std::fs::File::open(&conf_path).expect("open");
    let mut old_shim = std::fs::File::open(&shim_path).expect("open");
    let (conf_ino, shim_ino) = (
        std::fs::metadata(&conf_path).expect("m").ino(),
        std::fs::metadata(&shim_path).expect("m").ino(),
    );
    let expected_old = std::fs::read_to_string(&conf_path).expect("read");
    let new_plan = InstallPlan {
        mtu: Some(9000),
        ..old_plan.clone()
    };
    std::fs::write(
        &new_plan.shim,
        b"#!/bin/sh\necho a newer shim, longer than before\n",
    )
    .expect("new shim");
    install(&new_plan).expect("reinstall");
    assert_ne!(
        std::fs::metadata(&conf_path).expect("m").ino(),
        conf_ino,
        "renamed over"
    );
    assert_ne!(
        std::fs::metadata(&shim_path).expect("m").ino(),
        shim_ino,
        "renamed over"
    );
    let mut text = String::new();
    old_conf.read_to_string(&mut text).expect("read old");
    assert_eq!(text, expected_old, "the old file is untouched, whole");
    let mut bytes = Vec::new();
    old_shim.read_to_end(&mut bytes).expect("read old shim");
    assert_eq!(bytes, b"#!/bin/sh\necho stand-in shim\n");
    let new: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&conf_path).expect("read")).expect("json");
    assert_eq!(new["plugins"][0]["mtu"], 9000);
}

/// No container of flock is privileged: each drops every capability and adds back only what
/// docs/install.md ("Privileges") says it needs, on a read-only root filesystem, in a pod under
/// the runtime's default seccomp profile; the controller is not root.
#[test]
fn every_container_runs_with_least_privilege() {
    let mut seen = BTreeSet::new();
    for (file, index) in [
        ("deploy/daemonset.yaml", 0),
        ("deploy/daemonset.yaml", 1),
        ("deploy/controller.yaml", 0),
    ] {
        let docs = documents(file);
        let pod = docs[index]["spec"]["template"]["spec"].clone();
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{file}#{index}"
        );
        let containers = pod["initContainers"]
            .as_sequence()
            .into_iter()
            .flatten()
            .chain(pod["containers"].as_sequence().into_iter().flatten());
        for c in containers {
            let name = c["name"].as_str().expect("name").to_owned();
            let sc = &c["securityContext"];
            assert_ne!(sc["privileged"].as_bool(), Some(true), "{name}");
            assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{name}");
            let caps = |key: &str| -> Vec<String> {
                sc["capabilities"][key]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .map(|v| v.as_str().expect("a capability").to_owned())
                    .collect()
            };
            assert_eq!(caps("drop"), ["ALL"], "{name}");
            let want: &[&str] = match name.as_str() {
                "agent" => &["NET_ADMIN", "SYS_ADMIN"],
                "bird" => &["NET_ADMIN", "NET_BIND_SERVICE"],
                "install-cni" | "controller" => &[],
                other => panic!("a container nobody expects: {other}"),
            };
            assert_eq!(caps("add"), want, "{name}");
            if name == "controller" {
                assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true));
            }
            seen.insert(name);
        }
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
}
