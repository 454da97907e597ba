//! flock installed as a user installs it (`deploy/`, only the image reference changed), one
//! NodeConfig per node peering with the router, and the demo workloads; before flock, the
//! ClusterNetworkPolicy CRD of SIG Network's network-policy-api, which flock enforces.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::components;
use crate::sys;

use super::{
    ANYCAST4, ANYCAST6, EXTERNAL_CIDR6, LB_CIDR4, LB_CIDR6, NODES, Node, ROUTER_ASN, images,
    kubectl, kubectl_stdin,
};

/// The namespace of the demo workloads.
pub const DEMO_NS: &str = "demo";
/// The replicas of the `web` Deployment.
pub const WEB_REPLICAS: usize = 6;

/// The cluster IP of the demo's `web` Service.
pub fn web_service_ip() -> Result<String> {
    let ip = kubectl(&[
        "-n",
        DEMO_NS,
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    Ok(ip.trim().to_owned())
}

/// `deploy/daemonset.yaml` with every `image:` set to `image`; fails unless it names one.
pub fn with_image(manifest: &str, image: &str) -> Result<String> {
    let mut changed = 0;
    let out: Vec<String> = manifest
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let rest = trimmed.strip_prefix("- ").unwrap_or(trimmed);
            match rest.strip_prefix("image:") {
                Some(_) => {
                    changed += 1;
                    let indent = &line[..line.len() - rest.len()];
                    format!("{indent}image: {image}")
                }
                None => line.to_owned(),
            }
        })
        .collect();
    if changed == 0 {
        bail!("the DaemonSet manifest names no image");
    }
    Ok(out.join("\n") + "\n")
}

/// Each change the test bed makes to a manifest of another project's (a peer's, Multus'):
/// (what upstream has, what replaces it). Every one must be found, or the manifest is refused.
pub type Edits<'a> = &'a [(String, String)];

/// `text` with each of `edits` made; an edit whose text is missing is an error naming it.
pub fn edited(what: &Path, text: &str, edits: Edits<'_>) -> Result<String> {
    let mut out = text.to_owned();
    for (from, to) in edits {
        if !out.contains(from) {
            bail!("{} has no {from:?}", what.display());
        }
        out = out.replace(from, to);
    }
    Ok(out)
}

/// One NodePool per rack (each node its own rack here, each rack its own link to the router):
/// the rack's IPv6 /48 cut into /64s and its IPv4 pool into /24s, the nodes labelled with the
/// rack, and the router's end of the rack's link as the BGP neighbor. The pool controller
/// writes each node's NodeConfig from it. The third rack's pool waits for the node that
/// joins in `life join`.
pub fn nodepools() -> String {
    super::every_node()
        .map(|node| {
            let v6: ipnet::Ipv6Net = node.cidr6.parse().expect("a node's cidr6");
            let pool6 = ipnet::Ipv6Net::new(v6.network(), 48)
                .expect("a /48")
                .trunc();
            format!(
                "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodePool
metadata:
  name: {rack}
spec:
  cidr6: {pool6}
  nodePrefix6: 64
  cidr4: {cidr4}
  nodePrefix4: 24
  nodeSelector:
    matchLabels: {{ {RACK_LABEL}: {rack} }}
  defaults: {{ ipv6: true, ipv4: true }}
  bgp:
    asn: {asn}
    neighbors:
      - {{ address: \"{gateway}\", asn: {ROUTER_ASN}{extra} }}
    timers: {{ hold: 6, keepalive: 2, connectRetry: 1 }}
  services:
    loadBalancerCIDRs: [\"{LB_CIDR6}\", \"{LB_CIDR4}\"]
    externalIPCIDRs: [\"{EXTERNAL_CIDR6}\"]
    followServiceCIDRs: true
  networks:
    - name: {STORAGE_NETWORK}
      cidr6: {storage6}
      nodePrefix6: 64
      cidr4: {storage4}
      nodePrefix4: 24
      routes: [{storage_routes}]
",
                extra = neighbor_options(node),
                rack = node.rack,
                cidr4 = node.pool4,
                asn = node.asn,
                gateway = node.gateway,
                storage6 = storage_space(node).0,
                storage4 = storage_space(node).1,
                storage_routes = STORAGE_SPACE
                    .iter()
                    .map(|r| format!("\"{r}\""))
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The secondary network every rack's pool has (`life multus` attaches pods to it through
/// Multus): a space of its own per rack, in one space of the cluster that every pod routes
/// through its interface on it.
pub const STORAGE_NETWORK: &str = "storage";
/// The storage network's space, what every pod routes through its interface on it: the
/// racks' IPv6 /48s `2001:db8:d<rack>::/48`, and IPv4 their pools' ranges with the second
/// octet 10 higher (`10.201.1.0/24` → `10.211.1.0/24`, node3's `10.202.0.0/16` →
/// `10.212.0.0/16`).
pub const STORAGE_SPACE: &[&str] = &["2001:db8:d0::/44", "10.211.0.0/16", "10.212.0.0/16"];

/// `node`'s rack's part of the storage network: (IPv6, IPv4), at the place of its pools.
pub fn storage_space(node: &Node) -> (String, String) {
    let v6: ipnet::Ipv6Net = node.cidr6.parse().expect("a node's cidr6");
    let rack = v6.network().segments()[2] & 0xf;
    let v4: ipnet::Ipv4Net = node.pool4.parse().expect("a rack's pool4");
    let [a, b, c, d] = v4.network().octets();
    (
        format!("2001:db8:d{rack:x}::/48"),
        format!("{a}.{}.{c}.{d}/{}", b + 10, v4.prefix_len()),
    )
}

/// The label a rack's pool selects its nodes by (the kubelets set it).
pub const RACK_LABEL: &str = "topology.kubernetes.io/zone";

/// The Secret with the session passwords (`kube-system/flock-bgp-passwords`, one key per
/// node whose session has one; the name `deploy/rbac.yaml` lets the agent get).
pub const PASSWORD_SECRET: &str = "flock-bgp-passwords";

/// The options of `node`'s neighbor beyond address and ASN: BFD, the password's Secret.
fn neighbor_options(node: &Node) -> String {
    let mut extra = String::new();
    if node.bfd {
        // 150 ms × 4: the router gives up on a dead node within 600 ms, which `life routing`
        // checks against its goal of a second. flock's default, 100 ms × 3, leaves 300 ms,
        // and on this machine's 2 cores, with the control plane, an e2e suite and a build
        // beside the nodes, BIRD was now and then not scheduled for that long: the session
        // dropped, and node2's pods with it, in the middle of a suite.
        extra.push_str(", bfd: true, bfdIntervalMs: 150, bfdMultiplier: 4");
    }
    if node.password {
        extra.push_str(&format!(
            ", passwordSecretRef: {{ name: {PASSWORD_SECRET}, namespace: kube-system, key: {} }}",
            node.name
        ));
    }
    extra
}

/// The Secret holding the passwords of the router's sessions.
fn password_secret() -> Result<String> {
    let mut data = String::new();
    for n in &NODES {
        if let Some(p) = super::site::password(n)? {
            data.push_str(&format!("  {}: \"{p}\"\n", n.name));
        }
    }
    Ok(format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{ name: {PASSWORD_SECRET}, namespace: kube-system }}\nstringData:\n{data}"
    ))
}

/// The pool controller's release grace here (`deploy/controller.yaml` says `10m`): long enough
/// that `life reboot`'s node, its Node deleted while it is off, is back before it (about a
/// minute), short enough that `life join` and `life leave` see a deleted node's prefixes
/// return within minutes.
pub const RELEASE_GRACE: &str = "90s";

/// `deploy/controller.yaml` with [`RELEASE_GRACE`].
fn with_release_grace(manifest: &str) -> Result<String> {
    let shipped = "{ name: FLOCK_RELEASE_GRACE, value: \"10m\" }";
    anyhow::ensure!(
        manifest.contains(shipped),
        "deploy/controller.yaml has no `{shipped}` for the test bed to shorten"
    );
    Ok(manifest.replace(
        shipped,
        &format!("{{ name: FLOCK_RELEASE_GRACE, value: {RELEASE_GRACE} }}"),
    ))
}

/// A release channel of network-policy-api's CRDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CnpChannel {
    /// The fields every implementation has: tiers, priorities, pod and namespace selectors,
    /// `networks`, TCP/UDP/SCTP ports. Its conformance tests are the suite's standard set.
    Standard,
    /// The standard fields and the experimental ones (egress `nodes` and `domainNames` peers,
    /// `destinationNamedPort`), whose conformance tests then run too.
    Experimental,
}

/// The channel of the ClusterNetworkPolicy CRD the cluster installs (and whose features the
/// conformance suite claims by default).
pub const CNP_CHANNEL: CnpChannel = CnpChannel::Standard;

/// The ClusterNetworkPolicy CRD's name.
pub const CNP_CRD: &str = "clusternetworkpolicies.policy.networking.k8s.io";

impl CnpChannel {
    /// Its folder under the module's `config/crd/`, and the value of the CRDs' annotation
    /// `policy.networking.k8s.io/channel`.
    pub fn name(self) -> &'static str {
        match self {
            CnpChannel::Standard => "standard",
            CnpChannel::Experimental => "experimental",
        }
    }

    /// The CRD file of this channel inside the network-policy-api module `source`.
    pub fn crd_file(self, source: &Path) -> PathBuf {
        source.join(format!(
            "config/crd/{}/policy.networking.k8s.io_clusternetworkpolicies.yaml",
            self.name()
        ))
    }
}

/// The ClusterNetworkPolicy CRD of [`CNP_CHANNEL`], from the network-policy-api module of
/// [`crate::versions::NETWORK_POLICY_API`] (Go's module cache; downloaded through the module
/// proxy the first time, checked against its wrapper module's `go.sum`).
pub fn cnp_crd() -> Result<PathBuf> {
    let source = components::network_policy_api().source_dir()?;
    let file = CNP_CHANNEL.crd_file(&source);
    if !file.exists() {
        bail!(
            "{} has no ClusterNetworkPolicy CRD of channel {}",
            source.display(),
            CNP_CHANNEL.name()
        );
    }
    Ok(file)
}

/// Applies the CRD file `file` and waits until the apiserver serves its resource `crd`.
fn apply_crd(file: &Path, crd: &str) -> Result<()> {
    kubectl(&["apply", "-f", &file.to_string_lossy()])?;
    // Not `kubectl wait --for=condition=Established`: it fails at once, instead of waiting,
    // while the apiserver has not yet given the new CRD any conditions.
    let mut last = String::new();
    sys::wait_for(Duration::from_secs(60), || {
        last = kubectl(&[
            "get",
            &format!("crd/{crd}"),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ])
        .unwrap_or_default();
        last.trim() == "True"
    })
    .with_context(|| format!("the CRD {crd} is not served (Established: {last:?})"))
}

/// Installs the ClusterNetworkPolicy CRD `file` ([`cnp_crd`]); a no-op when it is installed.
pub fn install_cnp_crd(file: &Path) -> Result<()> {
    apply_crd(file, CNP_CRD)
}

/// How the test bed installs flock: with Helm from `charts/flock` (the default), or
/// `deploy/`'s manifests with `kubectl apply` (`cargo xtask cluster up --install manifests`).
/// Both install the same objects: `deploy/` is the chart rendered with its defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Installer {
    /// `helm install`.
    #[default]
    Helm,
    /// `kubectl apply -f deploy/…`.
    Manifests,
}

impl Installer {
    /// `helm` or `manifests`.
    pub fn as_str(self) -> &'static str {
        match self {
            Installer::Helm => "helm",
            Installer::Manifests => "manifests",
        }
    }
}

impl std::str::FromStr for Installer {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Installer> {
        match s {
            "helm" => Ok(Installer::Helm),
            "manifests" => Ok(Installer::Manifests),
            other => bail!("--install {other:?}: helm or manifests"),
        }
    }
}

/// Where the installer of the cluster that is up is recorded.
fn installer_file() -> PathBuf {
    Path::new(super::RUN_DIR).join("installer")
}

/// How flock was installed in the cluster that is up (Helm when nothing was recorded).
pub fn installed_with() -> Installer {
    std::fs::read_to_string(installer_file())
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_default()
}

/// The values the test bed installs the chart with: the image built here, the shorter
/// release grace ([`RELEASE_GRACE`]) and a NodePool per rack ([`nodepools`]).
pub fn helm_values() -> Result<String> {
    let (repository, tag) = images::FLOCK
        .rsplit_once(':')
        .context("flock's image has no tag")?;
    let mut pools = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&nodepools()) {
        let v: serde_yaml::Value = serde::Deserialize::deserialize(doc).context("a NodePool")?;
        pools.push(serde_yaml::to_value(std::collections::BTreeMap::from([
            ("name", v["metadata"]["name"].clone()),
            ("spec", v["spec"].clone()),
        ]))?);
    }
    let values = serde_yaml::to_value(std::collections::BTreeMap::from([
        (
            "image",
            serde_yaml::to_value(std::collections::BTreeMap::from([
                ("repository", repository),
                ("tag", tag),
            ]))?,
        ),
        (
            "controller",
            serde_yaml::to_value(std::collections::BTreeMap::from([(
                "releaseGrace",
                RELEASE_GRACE,
            )]))?,
        ),
        ("pools", serde_yaml::Value::Sequence(pools)),
    ]))?;
    Ok(serde_yaml::to_string(&values)?)
}

/// The values file of the cluster's release.
pub fn helm_values_file() -> PathBuf {
    Path::new(super::RUN_DIR).join("flock-values.yaml")
}

/// `helm ARGS…` as admin from the control plane's namespace; its stdout.
pub fn helm(args: &[&str]) -> Result<String> {
    let mut cmd = super::proc::Place::Net(super::CONTROL.to_owned()).command(crate::helm::helm()?);
    crate::helm::configure(&mut cmd);
    cmd.current_dir(crate::binaries::workspace_root())
        .env("KUBECONFIG", super::pki::kubeconfig("admin"))
        .args(args);
    sys::output(&mut cmd)
}

/// Installs flock with `installer`, then waits until the pool controller has written every
/// node's NodeConfig and the DaemonSets' pods are ready on every node. The
/// ClusterNetworkPolicy CRD `cnp_crd` goes first: the agents start with the resource served.
/// The BGP password Secret is the cluster's own (the chart references it).
pub fn install_flock(repo: &Path, cnp_crd: &Path, installer: Installer) -> Result<()> {
    std::fs::write(installer_file(), installer.as_str())
        .with_context(|| format!("write {}", installer_file().display()))?;
    install_cnp_crd(cnp_crd)?;
    kubectl_stdin(&["apply", "-f", "-"], &password_secret()?)?;
    match installer {
        Installer::Helm => {
            let values = helm_values_file();
            std::fs::write(&values, helm_values()?)
                .with_context(|| format!("write {}", values.display()))?;
            helm(&[
                "install",
                crate::helm::RELEASE,
                crate::helm::CHART,
                "--namespace",
                crate::helm::NAMESPACE,
                "--values",
                &values.to_string_lossy(),
            ])?;
            wait_node_configs()?;
        }
        Installer::Manifests => install_manifests(repo)?,
    }
    for ds in ["ds/flock", "ds/flock-bird"] {
        kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            ds,
            "--timeout=180s",
        ])
        .with_context(|| format!("wait for {ds}'s pods to be ready on every node"))?;
    }
    Ok(())
}

/// Applies the CRDs, the RBAC, the NodePools, the controller and the DaemonSet from
/// `repo/deploy`, the DaemonSet once the controller has written every NodeConfig.
fn install_manifests(repo: &Path) -> Result<()> {
    let deploy = repo.join("deploy");
    for crd in [
        "nodeconfigs.flock.fritzlab.net",
        "nodepools.flock.fritzlab.net",
    ] {
        apply_crd(&deploy.join(format!("crds/{crd}.yaml")), crd)?;
    }
    // The pools, and the controller that writes each node's NodeConfig from its pool.
    kubectl_stdin(&["apply", "-f", "-"], &nodepools())?;
    apply_controller(repo, images::FLOCK)?;
    wait_node_configs()?;
    apply_daemonsets(repo, images::FLOCK)
}

/// The RBAC and the controller's Deployment of `repo/deploy`, running `image`.
fn apply_controller(repo: &Path, image: &str) -> Result<()> {
    let deploy = repo.join("deploy");
    kubectl(&["apply", "-f", &deploy.join("rbac.yaml").to_string_lossy()])?;
    kubectl(&[
        "apply",
        "-f",
        &deploy.join("controller-rbac.yaml").to_string_lossy(),
    ])?;
    let controller_path = deploy.join("controller.yaml");
    let controller = std::fs::read_to_string(&controller_path)
        .with_context(|| format!("read {}", controller_path.display()))?;
    let controller = with_image(&controller, image)?;
    // a revision from before the release grace has none to shorten
    let controller = if controller.contains("FLOCK_RELEASE_GRACE") {
        with_release_grace(&controller)?
    } else {
        controller
    };
    kubectl_stdin(&["apply", "-f", "-"], &controller)?;
    Ok(())
}

/// The DaemonSets of `repo/deploy`, running `image`.
fn apply_daemonsets(repo: &Path, image: &str) -> Result<()> {
    let ds_path = repo.join("deploy/daemonset.yaml");
    let ds =
        std::fs::read_to_string(&ds_path).with_context(|| format!("read {}", ds_path.display()))?;
    kubectl_stdin(&["apply", "-f", "-"], &with_image(&ds, image)?)?;
    Ok(())
}

/// Rolls flock to the version whose sources are `repo` (its RBAC, controller and DaemonSets,
/// as `kubectl apply` of its `deploy/`), running `image`. The CRDs stay the newest: a
/// rollback of the software leaves the API's schema as it is (as Helm does with a chart's
/// CRDs). Waits for nothing.
pub fn apply_version(repo: &Path, image: &str) -> Result<()> {
    apply_controller(repo, image)?;
    apply_daemonsets(repo, image)
}

/// Waits (up to 300 s) until flock's two DaemonSets and the controller's Deployment are rolled
/// out.
pub fn wait_rolled_out() -> Result<()> {
    for what in [
        "daemonset/flock",
        "daemonset/flock-bird",
        "deployment/flock-controller",
    ] {
        kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            what,
            "--timeout=300s",
        ])
        .with_context(|| format!("the rollout of {what}"))?;
    }
    Ok(())
}

/// Waits until the pool controller has written each node's NodeConfig.
fn wait_node_configs() -> Result<()> {
    for node in &NODES {
        sys::wait_for(Duration::from_secs(120), || {
            kubectl(&[
                "get",
                "nodeconfig",
                node.name,
                "-o",
                "jsonpath={.spec.cidr6} {.spec.cidr4}",
            ])
            .is_ok_and(|got| got.trim() == format!("{} {}", node.cidr6, node.cidr4))
        })
        .with_context(|| {
            format!(
                "the pool controller wrote no NodeConfig {} with {} and {} (its log: \
                 `cargo xtask cluster kubectl -n kube-system logs deploy/flock-controller`)",
                node.name, node.cidr6, node.cidr4
            )
        })?;
    }
    Ok(())
}

/// The demo workloads: a Deployment (ip-algo `workload`) spread over both nodes, a DaemonSet
/// whose pods share an anycast address, and a ClusterIP Service in front of the Deployment.
pub fn workloads() -> String {
    let container = format!(
        "      terminationGracePeriodSeconds: 3
      # No cluster DNS here: the node's resolv.conf.
      dnsPolicy: Default
      enableServiceLinks: false
      automountServiceAccountToken: false
      containers:
        - name: net
          image: {image}
          imagePullPolicy: Never
          ports: [{{ containerPort: 80 }}]
          readinessProbe:
            httpGet: {{ path: /, port: 80 }}
            periodSeconds: 2
          # Serve on while kube-proxy drops the endpoint of a pod being deleted (it lags the
          # EndpointSlice by up to a sync): what a workload does to scale down without failing
          # a request. A CI run of `life upgrade` lost one Service GET of ~650 without it.
          lifecycle:
            preStop:
              exec: {{ command: [sleep, \"2\"] }}",
        image = images::NET
    );
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{ name: {DEMO_NS} }}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: web, namespace: {DEMO_NS} }}
spec:
  replicas: {WEB_REPLICAS}
  selector: {{ matchLabels: {{ app: web }} }}
  template:
    metadata:
      labels: {{ app: web }}
      annotations: {{ flock.fritzlab.net/ip-algo: workload }}
    spec:
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector: {{ matchLabels: {{ app: web }} }}
{container}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{ name: anycast, namespace: {DEMO_NS} }}
spec:
  selector: {{ matchLabels: {{ app: anycast }} }}
  template:
    metadata:
      labels: {{ app: anycast }}
      annotations: {{ flock.fritzlab.net/anycast: \"{ANYCAST6},{ANYCAST4}\" }}
    spec:
{container}
---
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: {DEMO_NS} }}
spec:
  selector: {{ app: web }}
  ports: [{{ port: 80, targetPort: 80 }}]
"
    )
}

/// Applies [`workloads`] and waits until every pod is ready.
/// The test bed's CoreDNS manifest (`flock-testbed/deploy/coredns.yaml`).
pub const COREDNS_MANIFEST: &str = include_str!("../../deploy/coredns.yaml");

/// Deploys CoreDNS and waits until it answers: both replicas ready.
pub fn start_dns() -> Result<()> {
    kubectl_stdin(&["apply", "-f", "-"], COREDNS_MANIFEST)?;
    kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "deployment/coredns",
        "--timeout=180s",
    ])
    .context("wait for CoreDNS's pods to be ready")?;
    Ok(())
}

pub fn start_workloads() -> Result<()> {
    kubectl_stdin(&["apply", "-f", "-"], &workloads())?;
    for what in ["deployment/web", "ds/anycast"] {
        kubectl(&["-n", DEMO_NS, "rollout", "status", what, "--timeout=180s"])
            .with_context(|| format!("wait for {what}'s pods to be ready"))?;
    }
    Ok(())
}

/// Scales `web` to `replicas` and returns how long until that many pods were ready.
pub fn scale_web(replicas: usize, limit: Duration) -> Result<Duration> {
    let started = std::time::Instant::now();
    kubectl(&[
        "-n",
        DEMO_NS,
        "scale",
        "deployment/web",
        &format!("--replicas={replicas}"),
    ])?;
    let mut last = String::new();
    while started.elapsed() < limit {
        last = kubectl(&[
            "-n",
            DEMO_NS,
            "get",
            "deployment/web",
            "-o",
            "jsonpath={.status.readyReplicas}/{.status.replicas}/{.status.updatedReplicas}",
        ])
        .unwrap_or_default();
        // The status leaves out a count of 0 (`//` for a Deployment scaled to zero).
        let counts: Vec<usize> = last
            .trim()
            .split('/')
            .map(|c| c.parse().unwrap_or(0))
            .collect();
        if counts.len() == 3 && counts.iter().all(|c| *c == replicas) {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!(
        "web did not have {replicas} ready replicas within {limit:?} (ready/replicas/updated: {last})"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_values_carry_the_image_grace_and_every_rack_pool() {
        let v: serde_yaml::Value = serde_yaml::from_str(&helm_values().unwrap()).unwrap();
        assert_eq!(v["image"]["repository"], "localhost/flock");
        assert_eq!(v["image"]["tag"], "cluster");
        assert_eq!(v["controller"]["releaseGrace"], RELEASE_GRACE);
        let pools = v["pools"].as_sequence().unwrap();
        assert_eq!(pools.len(), 3);
        assert_eq!(pools[0]["name"], "rack1");
        assert_eq!(pools[0]["spec"]["cidr6"], "2001:db8:c1::/48");
        assert!(pools[0]["spec"]["bgp"]["neighbors"][0]["passwordSecretRef"].is_mapping());
    }

    #[test]
    fn installers_read_back_as_written() {
        for i in [Installer::Helm, Installer::Manifests] {
            assert_eq!(i.as_str().parse::<Installer>().unwrap(), i);
        }
        let e = "kubectl".parse::<Installer>().unwrap_err();
        assert!(e.to_string().contains("\"kubectl\""), "{e}");
    }

    #[test]
    fn dns_service_is_the_kubelets_cluster_dns_and_the_image_the_one_made_here() {
        assert!(
            COREDNS_MANIFEST.contains(&format!("clusterIP: {}\n", crate::cluster::CLUSTER_DNS))
        );
        assert!(COREDNS_MANIFEST.contains(&format!(
            "image: {}\n",
            crate::cluster::images::coredns_image()
        )));
    }

    #[test]
    fn the_cnp_crd_of_a_channel_is_the_one_the_module_ships() {
        let source = Path::new("/m/sigs.k8s.io/network-policy-api@v0.3.0");
        assert_eq!(
            CnpChannel::Standard.crd_file(source),
            source.join("config/crd/standard/policy.networking.k8s.io_clusternetworkpolicies.yaml")
        );
        assert!(
            CnpChannel::Experimental
                .crd_file(source)
                .starts_with(source.join("config/crd/experimental"))
        );
        assert!(CNP_CRD.starts_with("clusternetworkpolicies."));
    }

    #[test]
    fn only_the_image_changes() {
        let ds = "spec:\n  containers:\n    - name: a\n      image: ghcr.io/x:1\n    - image: ghcr.io/x:1\n      name: b\n";
        let out = with_image(ds, "localhost/y:2").unwrap();
        assert_eq!(
            out,
            "spec:\n  containers:\n    - name: a\n      image: localhost/y:2\n    - image: localhost/y:2\n      name: b\n"
        );
    }

    #[test]
    fn every_image_of_the_shipped_daemonset_is_replaced() {
        let ds = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml"),
        )
        .unwrap();
        let out = with_image(&ds, "localhost/flock:test").unwrap();
        assert_eq!(
            out.matches("image: localhost/flock:test").count(),
            ds.matches("image:").count()
        );
        assert!(ds.matches("image:").count() >= 3);
        let before: Vec<&str> = ds.lines().filter(|l| !l.contains("image:")).collect();
        let after: Vec<&str> = out.lines().filter(|l| !l.contains("image:")).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn each_rack_pool_selects_its_node_and_peers_with_the_router() {
        let text = nodepools();
        for node in crate::cluster::every_node() {
            assert!(text.contains(&format!("name: {}", node.rack)));
            // The lowest /24 of the rack's IPv4 pool is the node's.
            assert!(text.contains(&format!("cidr4: {}\n", node.pool4)));
            assert!(node.cidr4.split('/').next() == node.pool4.split('/').next());
            assert!(text.contains(&format!("{RACK_LABEL}: {}", node.rack)));
            assert!(text.contains(&format!("address: \"{}\", asn: {ROUTER_ASN}", node.gateway)));
            // The lowest /64 of the rack's /48 is the node's.
            let v6: ipnet::Ipv6Net = node.cidr6.parse().unwrap();
            assert!(text.contains(&format!("cidr6: {}/48", v6.network())));
        }
    }
}
