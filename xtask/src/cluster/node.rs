//! A worker node: a network namespace wired to the router, and one private mount namespace
//! and UTS namespace (its hostname: the node's name) shared by its containerd 1.6, its kubelet
//! and its kube-proxy.
//!
//! The mount namespace is held by a `sleep` (the node's "mounts" daemon) started with
//! `unshare --mount --uts --propagation slave`, so what the node mounts (volumes, sandbox netns
//! pins, overlay snapshots) exists only there and dies with the node, while the machine's
//! own mounts stay visible. Inside it, per-node directories under `RUN_DIR/nodes/NODE/host`
//! are bind-mounted over the host paths a node's software uses: the DaemonSet's hostPaths
//! (`/etc/cni/net.d`, `/opt/cni/bin`, `/var/lib/flock`, `/run/flock`, `/var/run/netns`) work
//! unchanged, and nothing a node writes reaches the machine's own directories (containerd's
//! `/run/containerd`, libcni's `/var/lib/cni`, the kubelet's `/var/log/pods`). Where a host
//! path does not exist, its mount point is created and recorded so `down` removes it.
//!
//! The kubelet writes a few machine-wide kernel tunables at start (`vm.overcommit_memory`,
//! `kernel.panic`, …): inside the node, each that differs from what the kubelet wants is
//! covered by a bind-mounted file holding that value, so the kubelet finds it set and the
//! machine's value never changes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::kube::KubeBuild;
use super::proc::{self, Place};
use super::{Node, RUN_DIR, images, pki};
use crate::sys;

/// Host paths each node gets its own copy of: (path, directory name under the node's `host`).
const BINDS: &[(&str, &str)] = &[
    ("/etc/cni/net.d", "etc-cni-net.d"),
    ("/opt/cni/bin", "opt-cni-bin"),
    ("/var/lib/flock", "var-lib-flock"),
    ("/run/flock", "run-flock"),
    ("/etc/flock", "etc-flock"),
    ("/run/netns", "run-netns"),
    ("/var/lib/cni", "var-lib-cni"),
    ("/run/containerd", "run-containerd"),
    ("/var/log/pods", "var-log-pods"),
    ("/var/log/containers", "var-log-containers"),
];

/// What the kubelet 1.20 sets at start unless `--protect-kernel-defaults`
/// (`pkg/kubelet/cm/container_manager_linux.go`, `setupKernelTunables`).
const KUBELET_TUNABLES: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Host directories created as mount points (one per line, parents first).
const CREATED_DIRS: &str = "created-host-dirs";
/// How long a node's daemons may take to answer.
const START_LIMIT: Duration = Duration::from_secs(60);
/// The reference plugin containerd's CRI plugin runs for every sandbox's loopback.
const LOOPBACK_PLUGIN: &str = "/usr/lib/cni/loopback";

/// `RUN_DIR/nodes/NODE`.
pub fn dir(node: &Node) -> PathBuf {
    Path::new(RUN_DIR).join("nodes").join(node.name)
}

/// containerd's socket on `node`.
pub fn containerd_socket(node: &Node) -> PathBuf {
    dir(node).join("containerd/containerd.sock")
}

fn mounts_daemon(node: &Node) -> String {
    format!("{}-mounts", node.name)
}

/// Starts the node: its mount namespace and bind mounts, containerd (with `images`
/// imported), the kubelet and kube-proxy.
pub fn start(node: &Node, kube: &KubeBuild, archives: &[PathBuf]) -> Result<()> {
    let dir = dir(node);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let holder = start_mount_namespace(node)?;
    let here = Place::Node(holder);
    for (path, sub) in BINDS {
        let source = dir.join("host").join(sub);
        std::fs::create_dir_all(&source).with_context(|| format!("create {}", source.display()))?;
        let source = source.to_string_lossy();
        here.run(&["mount", "--bind", &source, path])?;
    }
    // A node's CNI directory holds the loopback plugin, as the distribution's package of
    // the reference plugins puts it there; flock's installer adds the rest.
    let bin = dir.join("host/opt-cni-bin/loopback");
    std::fs::copy(LOOPBACK_PLUGIN, &bin)
        .with_context(|| format!("copy {LOOPBACK_PLUGIN} to {}", bin.display()))?;
    cover_kernel_tunables(node, &here)?;
    // Shared inside the node, as on a systemd machine: mounts the node makes (containerd's
    // netns pins under /var/run/netns) reach the containers that mount a host path with
    // HostToContainer propagation (the flock agent), and containerd accepts such mounts only
    // from a shared or slave mount. The machine's mounts are private, so nothing of the
    // node's propagates back to it.
    here.run(&["mount", "--make-rshared", "/"])?;
    start_containerd(node, &here)?;
    for archive in archives {
        images::import(&containerd_socket(node), archive)
            .with_context(|| format!("import {} on {}", archive.display(), node.name))?;
    }
    start_kubelet(node, &here, kube)?;
    start_kube_proxy(node, &here, kube)?;
    wait_registered(node)?;
    wait_service_rules(node, &here)
}

/// What a node keeps across a reboot is on disk; these host paths are tmpfs on a real
/// machine (`/run`), and so are emptied when the node powers off.
const VOLATILE: &[&str] = &["run-flock", "run-netns", "run-containerd"];

/// Powers `node` off: every process of it killed at once (no shutdown, as a power cut),
/// its pods' cgroups removed, its `/run` emptied (with the pins of its pods' network
/// namespaces: the namespaces die, and with them each pod's veth) and its network namespace
/// deleted (its routes, neighbours, nftables: all of the kernel's state of the node).
/// The disk stays: the kubelet's, containerd's and flock's state directories.
pub fn power_off(node: &Node) -> Result<usize> {
    let killed = proc::kill_node(node.name, &node.ns())?;
    for sub in VOLATILE {
        let d = dir(node).join("host").join(sub);
        if d.exists() {
            std::fs::remove_dir_all(&d).with_context(|| format!("empty {}", d.display()))?;
        }
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    let state = dir(node).join("containerd/state");
    if state.exists() {
        std::fs::remove_dir_all(&state).with_context(|| format!("empty {}", state.display()))?;
    }
    sys::output(Command::new("ip").args(["netns", "del", &node.ns()]))?;
    Ok(killed.len())
}

/// Boots `node` again after [`power_off`]: its network namespace as the machine makes it,
/// then containerd (its images still on disk), the kubelet and kube-proxy.
pub fn boot(node: &Node, kube: &KubeBuild) -> Result<()> {
    super::site::node_net(node)?;
    start(node, kube, &[])
}

/// Creates the host paths of [`BINDS`] that the machine lacks (as mount points), once for
/// every node, before the nodes start.
pub fn prepare_mount_points() -> Result<()> {
    for (path, _) in BINDS {
        ensure_mount_point(Path::new(path))?;
    }
    Ok(())
}

fn start_mount_namespace(node: &Node) -> Result<u32> {
    let name = mounts_daemon(node);
    // The node's hostname in its own UTS namespace: what its host-network pods (and the
    // e2e suite's checks of them) see, as on a machine of its own.
    let pid = proc::spawn(
        &name,
        &Place::NewMounts(node.ns()),
        "sh",
        &[
            "-c",
            &format!("hostname {} && exec sleep infinity", node.name),
        ],
        &[],
    )?;
    let ours = std::fs::read_link("/proc/self/ns/mnt").context("read our mount namespace")?;
    proc::wait_daemon(
        &name,
        "the node's private mount namespace",
        Duration::from_secs(10),
        || {
            std::fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|ns| ns != ours)
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
        },
    )?;
    Ok(pid)
}

/// Creates `path` on the machine when it is missing (a mount point), recording each
/// directory created so that `down` removes it again.
fn ensure_mount_point(path: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = Some(path);
    while let Some(dir) = p {
        if dir.exists() {
            break;
        }
        missing.push(dir.to_path_buf());
        p = dir.parent();
    }
    let record = Path::new(RUN_DIR).join(CREATED_DIRS);
    for dir in missing.iter().rev() {
        std::fs::create_dir(dir).with_context(|| format!("create {}", dir.display()))?;
        let mut text = std::fs::read_to_string(&record).unwrap_or_default();
        text.push_str(&format!("{}\n", dir.display()));
        std::fs::write(&record, text).with_context(|| format!("write {}", record.display()))?;
    }
    Ok(())
}

/// Removes the host directories [`ensure_mount_point`] created (children first); returns
/// those that could not be removed (not empty: someone else uses them now).
pub fn remove_created_mount_points() -> Vec<String> {
    let record = Path::new(RUN_DIR).join(CREATED_DIRS);
    let text = std::fs::read_to_string(record).unwrap_or_default();
    let mut kept = Vec::new();
    for dir in text.lines().rev() {
        if Path::new(dir).exists() && std::fs::remove_dir(dir).is_err() {
            kept.push(dir.to_owned());
        }
    }
    kept
}

fn cover_kernel_tunables(node: &Node, here: &Place) -> Result<()> {
    let dir = dir(node).join("tunables");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    for (name, wanted) in KUBELET_TUNABLES {
        let proc_path = format!("/proc/sys/{name}");
        let current =
            std::fs::read_to_string(&proc_path).with_context(|| format!("read {proc_path}"))?;
        if current.trim() == *wanted {
            continue;
        }
        let file = dir.join(name.replace('/', "."));
        std::fs::write(&file, format!("{wanted}\n"))
            .with_context(|| format!("write {}", file.display()))?;
        here.run(&[
            "mount",
            "--bind",
            "-o",
            "ro",
            &file.to_string_lossy(),
            &proc_path,
        ])?;
    }
    Ok(())
}

fn containerd_config(node: &Node) -> String {
    let d = dir(node).join("containerd");
    let q = |p: PathBuf| serde_json::Value::String(p.to_string_lossy().into_owned()).to_string();
    format!(
        r#"# containerd 1.6 of {name}: its own root, state and sockets; the CNI directories are the
# node's (bind-mounted over /etc/cni/net.d and /opt/cni/bin in its mount namespace).
version = 2
root = {root}
state = {state}
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Root here lacks CAP_SYS_RESOURCE: no negative oom_score_adj.
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
"#,
        name = node.name,
        root = q(d.join("root")),
        state = q(d.join("state")),
        socket = q(d.join("containerd.sock")),
        ttrpc = q(d.join("containerd.sock.ttrpc")),
        opt = q(d.join("opt")),
        pause = images::PAUSE,
    )
}

fn start_containerd(node: &Node, here: &Place) -> Result<()> {
    let d = dir(node).join("containerd");
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    let config = d.join("config.toml");
    std::fs::write(&config, containerd_config(node))
        .with_context(|| format!("write {}", config.display()))?;
    let name = format!("{}-containerd", node.name);
    proc::spawn(
        &name,
        here,
        "containerd",
        &["--config", &config.to_string_lossy()],
        &[],
    )?;
    let socket = containerd_socket(node);
    proc::wait_daemon(&name, "containerd to answer", START_LIMIT, || {
        socket.exists()
            && Command::new("ctr")
                .arg("--address")
                .arg(&socket)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
    })?;
    Ok(())
}

fn start_kubelet(node: &Node, here: &Place, kube: &KubeBuild) -> Result<()> {
    let d = dir(node);
    let root = d.join("kubelet");
    let plugins = d.join("volume-plugins");
    for p in [&root, &plugins] {
        std::fs::create_dir_all(p).with_context(|| format!("create {}", p.display()))?;
    }
    let name = format!("{}-kubelet", node.name);
    proc::spawn(
        &name,
        here,
        kube.tool("kubelet"),
        &[
            format!(
                "--kubeconfig={}",
                pki::kubeconfig(&format!("kubelet-{}", node.name))
            ),
            "--container-runtime=remote".to_owned(),
            format!(
                "--container-runtime-endpoint=unix://{}",
                containerd_socket(node).display()
            ),
            format!("--root-dir={}", root.display()),
            format!("--volume-plugin-dir={}", plugins.display()),
            format!("--node-ip={}", node.addr),
            format!("--hostname-override={}", node.name),
            // Its rack: the label its NodePool selects it by.
            format!("--node-labels={}={}", super::deploy::RACK_LABEL, node.rack),
            format!("--address={}", node.addr),
            "--healthz-bind-address=127.0.0.1".to_owned(),
            "--read-only-port=0".to_owned(),
            format!("--client-ca-file={}", pki::file("ca.crt")),
            "--anonymous-auth=false".to_owned(),
            "--authorization-mode=Webhook".to_owned(),
            // cgroup v1, no systemd, no QoS hierarchy: pods' cgroups go under
            // /flockcluster/NODE, where `down` finds (and removes) them.
            "--cgroup-driver=cgroupfs".to_owned(),
            "--cgroups-per-qos=false".to_owned(),
            format!("--cgroup-root=/{}/{}", proc::CGROUP, node.name),
            "--enforce-node-allocatable=".to_owned(),
            "--fail-swap-on=false".to_owned(),
            "--eviction-hard=".to_owned(),
            // The images cannot be pulled again: never collect them.
            "--image-gc-high-threshold=100".to_owned(),
            "--image-gc-low-threshold=99".to_owned(),
            "--oom-score-adj=0".to_owned(),
            format!("--pod-infra-container-image={}", images::PAUSE),
            "--node-status-update-frequency=4s".to_owned(),
            // 100 pods of the policy benchmark besides the demo's: more than the default 110.
            "--max-pods=250".to_owned(),
            "--feature-gates=IPv6DualStack=true".to_owned(),
        ],
        &[],
    )?;
    Ok(())
}

fn wait_registered(node: &Node) -> Result<()> {
    let name = node.name;
    proc::wait_daemon(
        &format!("{name}-kubelet"),
        &format!("{name}'s kubelet to register the node with the apiserver"),
        START_LIMIT,
        || super::kubectl(&["get", "node", name, "-o", "name"]).is_ok(),
    )?;
    Ok(())
}

fn start_kube_proxy(node: &Node, here: &Place, kube: &KubeBuild) -> Result<()> {
    let name = format!("{}-kube-proxy", node.name);
    proc::spawn(
        &name,
        here,
        kube.tool("kube-proxy"),
        &[
            format!("--kubeconfig={}", pki::kubeconfig("kube-proxy")),
            format!("--hostname-override={}", node.name),
            // IPv6 first: the node's address picks the proxier's primary family.
            format!("--bind-address={}", node.addr),
            "--proxy-mode=iptables".to_owned(),
            // Machine-wide conntrack settings are not the node's to change.
            "--conntrack-max-per-core=0".to_owned(),
            "--conntrack-tcp-timeout-established=0".to_owned(),
            "--conntrack-tcp-timeout-close-wait=0".to_owned(),
            "--feature-gates=IPv6DualStack=true".to_owned(),
            "--profiling=false".to_owned(),
        ],
        &[],
    )?;
    Ok(())
}

/// kube-proxy's service chain (`KUBE-SERVICES` of the nat table) in `place`, as `tables`
/// (`ip6tables` or `iptables`) lists it.
pub fn kube_services(place: &Place, tables: &str) -> Result<String> {
    place.run(&[tables, "-t", "nat", "-S", "KUBE-SERVICES"])
}

fn wait_service_rules(node: &Node, here: &Place) -> Result<()> {
    let name = format!("{}-kube-proxy", node.name);
    let place = here.clone();
    proc::wait_daemon(
        &name,
        "kube-proxy to program the service rules (KUBE-SERVICES in ip6tables)",
        START_LIMIT,
        || kube_services(&place, "ip6tables").is_ok_and(|s| s.contains("KUBE-SVC")),
    )?;
    Ok(())
}
