//! A worker node: a network namespace wired to the router, and one private mount namespace
//! and UTS namespace (its hostname: the node's name) shared by its containerd, its kubelet and
//! its kube-proxy.
//!
//! The mount namespace is held by a `sleep` (the node's "mounts" daemon) started with
//! `unshare --mount --uts --propagation slave`, so what the node mounts (volumes, sandbox netns
//! pins, overlay snapshots) exists only there and dies with the node, while the machine's
//! own mounts stay visible. Inside it, per-node directories under `RUN_DIR/nodes/NODE/host`
//! are bind-mounted over the host paths a node's software uses: the DaemonSet's hostPaths
//! (`/etc/cni/net.d`, `/opt/cni/bin`, `/var/lib/flock`, `/run/flock`, `/var/run/netns`) work
//! unchanged, and nothing a node writes reaches the machine's own directories (containerd's
//! `/run/containerd`, libcni's `/var/lib/cni`, the kubelet's `/var/log/pods` and its device
//! plugin socket). Where a host
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

use flock_e2e::ContainerdConfig;

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
    ("/var/log/flock", "var-log-flock"),
    // Multus (`life multus`): its daemon's socket, the device information it keeps, and the
    // configuration folder its DaemonSet mounts
    ("/run/multus", "run-multus"),
    ("/run/k8s.cni.cncf.io", "run-k8s.cni.cncf.io"),
    ("/etc/cni/multus", "etc-cni-multus"),
    // containerd's NRI socket, which kube-network-policies (`--policy`) connects to
    ("/run/nri", "run-nri"),
    // The kubelet's device plugin socket is here whatever its --root-dir: two nodes starting
    // at once raced for one socket ("bind: address already in use").
    (
        "/var/lib/kubelet/device-plugins",
        "var-lib-kubelet-device-plugins",
    ),
];

/// What the kubelet sets at start unless `protectKernelDefaults`
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

/// `RUN_DIR/nodes/NODE`.
pub fn dir(node: &Node) -> PathBuf {
    Path::new(RUN_DIR).join("nodes").join(node.name)
}

/// containerd's socket on `node`.
pub fn containerd_socket(node: &Node) -> PathBuf {
    dir(node).join("containerd/containerd.sock")
}

/// Where the node runs its software: its network, mount and UTS namespaces.
pub fn place(node: &Node) -> Result<Place> {
    proc::alive(&mounts_daemon(node))
        .map(Place::Node)
        .with_context(|| format!("{} is not running", node.name))
}

/// Where `node`'s own copy of the host path `path` (one of [`BINDS`]) is on the machine.
pub fn host_path(node: &Node, path: &str) -> Option<PathBuf> {
    BINDS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, sub)| dir(node).join("host").join(sub))
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
    // A node's CNI directory holds the reference plugins, as the distribution's package puts
    // them there: containerd runs loopback for every sandbox, flock's conflist chains portmap
    // (hostPort) and may chain bandwidth. flock's installer adds its shim; a peer's pods need
    // its plugins beside them (bridge or ptp, and host-local).
    let cni = super::cni::Cni::current();
    for plugin in ["loopback", "portmap", "bandwidth"]
        .iter()
        .chain(cni.node_plugins())
    {
        let bin = dir.join("host/opt-cni-bin").join(plugin);
        let source = kube.cni_plugin(plugin);
        std::fs::copy(&source, &bin)
            .with_context(|| format!("copy {} to {}", source.display(), bin.display()))?;
    }
    cover_kernel_tunables(node, &here)?;
    // Shared inside the node, as on a systemd machine: mounts the node makes (containerd's
    // netns pins under /var/run/netns) reach the containers that mount a host path with
    // HostToContainer propagation (the flock agent), and containerd accepts such mounts only
    // from a shared or slave mount. The machine's mounts are private, so nothing of the
    // node's propagates back to it.
    here.run(&["mount", "--make-rshared", "/"])?;
    start_containerd(node, &here, kube)?;
    for archive in archives {
        images::import(kube, &containerd_socket(node), archive)
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

/// containerd's configuration on `node` (version 3): its own root, state and sockets; the CNI
/// directories are the node's (bind-mounted over `/etc/cni/net.d` and `/opt/cni/bin` in its
/// mount namespace), and sandbox network namespaces are pinned under `/var/run/netns`, where
/// the flock agent opens them, as on any node.
fn containerd_config(node: &Node, kube: &KubeBuild) -> String {
    let mut config = ContainerdConfig::in_dir(
        &dir(node).join("containerd"),
        Path::new("/opt/cni/bin"),
        Path::new("/etc/cni/net.d"),
        images::PAUSE,
    );
    config.runc = Some(kube.runc());
    config.netns_under_state = false;
    // where an NRI plugin looks for it (kube-network-policies): the node's own `/run/nri`
    config.nri_socket = PathBuf::from("/run/nri/nri.sock");
    format!("# containerd of {}\n{}", node.name, config.render())
}

/// The CPU cgroup containerd puts pods' containers in, and its weight: 2 cores' worth.
const PODS_CPU_CGROUP: &str = "k8s.io";
const PODS_CPU_SHARES: u32 = 2048;

/// Kills `node`'s containerd (SIGKILL; its shims and so the pods' containers live on) and
/// starts it again; returns once it answers.
pub fn restart_containerd(node: &Node, kube: &KubeBuild) -> Result<()> {
    let here = place(node)?;
    proc::kill_daemon(&format!("{}-containerd", node.name))?;
    start_containerd(node, &here, kube)
}

fn start_containerd(node: &Node, here: &Place, kube: &KubeBuild) -> Result<()> {
    let d = dir(node).join("containerd");
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    let config = d.join("config.toml");
    std::fs::write(&config, containerd_config(node, kube))
        .with_context(|| format!("write {}", config.display()))?;
    // The pods' containers go to the CPU cgroup `k8s.io` (containerd's default parent: this
    // kubelet runs without its QoS hierarchy), one for both nodes, which competes with every
    // process of the control plane and the test client on the machine's 2 cores. A kubelet
    // with its QoS hierarchy gives `kubepods` its allocatable CPU in shares (2 cores: 2048);
    // so does this. At 1024 (one process's weight) against a busy e2e run, BIRD in a pod
    // missed BFD's 300 ms and the router dropped node2's session.
    proc::cpu_weight(PODS_CPU_CGROUP, PODS_CPU_SHARES)?;
    let name = format!("{}-containerd", node.name);
    // containerd finds its shim on PATH.
    let path = format!(
        "{}:{}",
        kube.containerd_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    proc::spawn(
        &name,
        here,
        kube.containerd_bin().join("containerd"),
        &["--config", &config.to_string_lossy()],
        &[("PATH", &path)],
    )?;
    let socket = containerd_socket(node);
    proc::wait_daemon(&name, "containerd to answer", START_LIMIT, || {
        socket.exists()
            && Command::new(kube.ctr())
                .arg("--address")
                .arg(&socket)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
    })?;
    Ok(())
}

/// The kubelet's configuration on `node`, as a user writes it (`--config`): cgroup v1 through
/// cgroupfs (no systemd here), no QoS hierarchy, pods' cgroups under `/flockcluster/NODE`
/// (where `down` finds and removes them), no eviction, no image garbage collection (the images
/// cannot be pulled again), the cluster DNS.
fn kubelet_config(node: &Node) -> String {
    let plugins = dir(node).join("volume-plugins");
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine runs cgroup v1, which the kubelet refuses since 1.35 unless told.
failCgroupV1: false
containerRuntimeEndpoint: unix://{socket}
address: "{addr}"
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupsPerQOS: false
cgroupRoot: /{cgroup}/{name}
enforceNodeAllocatable: []
failSwapOn: false
evictionHard: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
oomScoreAdj: 0
nodeStatusUpdateFrequency: 4s
volumePluginDir: {plugins}
# 100 pods of the policy benchmark besides the demo's: more than the default 110.
maxPods: 250
clusterDomain: {domain}
clusterDNS: ["{dns}"]
"#,
        socket = containerd_socket(node).display(),
        addr = node.addr,
        ca = pki::file("ca.crt"),
        cgroup = proc::CGROUP,
        name = node.name,
        plugins = plugins.display(),
        domain = super::CLUSTER_DOMAIN,
        dns = super::CLUSTER_DNS,
    )
}

fn start_kubelet(node: &Node, here: &Place, kube: &KubeBuild) -> Result<()> {
    let d = dir(node);
    let root = d.join("kubelet");
    let plugins = d.join("volume-plugins");
    for p in [&root, &plugins] {
        std::fs::create_dir_all(p).with_context(|| format!("create {}", p.display()))?;
    }
    let config = d.join("kubelet.yaml");
    std::fs::write(&config, kubelet_config(node))
        .with_context(|| format!("write {}", config.display()))?;
    let name = format!("{}-kubelet", node.name);
    proc::spawn(
        &name,
        here,
        kube.tool("kubelet"),
        &[
            format!("--config={}", config.display()),
            format!(
                "--kubeconfig={}",
                pki::kubeconfig(&format!("kubelet-{}", node.name))
            ),
            format!("--root-dir={}", root.display()),
            // A dual-stack node, IPv6 first: the kubelet lists a dual-stack pod's addresses, and
            // the node's own, in this order. Its IPv4 address is its identity on its loopback
            // (routed by the router): the dual-stack suite needs a node of both families (a
            // pod's hostIPs, NodePorts of a Service's secondary family).
            format!("--node-ip={},{}", node.addr, node.router_id),
            format!("--hostname-override={}", node.name),
            // Its rack: the label its NodePool selects it by.
            format!("--node-labels={}={}", super::deploy::RACK_LABEL, node.rack),
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

/// kube-proxy's configuration on `node`: nftables mode unless the cluster was brought up with
/// iptables; the node's address first (IPv6: the proxier's primary family); the machine-wide
/// conntrack settings left alone. Traffic is local when it comes in on a flock veth (`flock*`;
/// a peer CNI's pod interfaces in a peer's cluster, [`super::cni::Cni::kube_proxy_local`]),
/// so kube-proxy masquerades a cluster IP's traffic from outside the cluster: the fabric routes
/// the Service ranges to any node, whose endpoint may be on another node, and the answer has to
/// come back through the node that translated it (docs/services.md).
fn kube_proxy_config(node: &Node, mode: ProxyMode, cni: super::cni::Cni) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: {mode}
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {name}
bindAddress: "{addr}"
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
detectLocalMode: {local_mode}
detectLocal:
  {local}
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        mode = mode.as_str(),
        kubeconfig = pki::kubeconfig("kube-proxy"),
        name = node.name,
        addr = node.addr,
        local_mode = cni.kube_proxy_local().0,
        local = cni.kube_proxy_local().1,
    )
}

fn start_kube_proxy(node: &Node, here: &Place, kube: &KubeBuild) -> Result<()> {
    let config = dir(node).join("kube-proxy.yaml");
    std::fs::write(
        &config,
        kube_proxy_config(node, ProxyMode::current(), super::cni::Cni::current()),
    )
    .with_context(|| format!("write {}", config.display()))?;
    let name = format!("{}-kube-proxy", node.name);
    proc::spawn(
        &name,
        here,
        kube.tool("kube-proxy"),
        &[format!("--config={}", config.display())],
        &[],
    )?;
    Ok(())
}

/// kube-proxy's mode, chosen at `up` (`--proxy-mode`), recorded for the cluster's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// nftables (GA since 1.33): tables `ip kube-proxy` and `ip6 kube-proxy`. The default.
    Nftables,
    /// iptables (through Debian's nftables-backed `iptables`).
    Iptables,
}

impl ProxyMode {
    /// The name kube-proxy and `--proxy-mode` use.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
        }
    }

    /// `nftables` or `iptables`.
    pub fn parse(text: &str) -> Result<ProxyMode> {
        match text {
            "nftables" => Ok(ProxyMode::Nftables),
            "iptables" => Ok(ProxyMode::Iptables),
            other => anyhow::bail!("--proxy-mode {other:?}: nftables or iptables"),
        }
    }

    fn file() -> PathBuf {
        Path::new(RUN_DIR).join("proxy-mode")
    }

    /// The mode of the cluster that is up (nftables when none was recorded).
    pub fn current() -> ProxyMode {
        std::fs::read_to_string(Self::file())
            .ok()
            .and_then(|t| ProxyMode::parse(t.trim()).ok())
            .unwrap_or(ProxyMode::Nftables)
    }

    /// Records the mode of the cluster that is coming up.
    pub fn record(self) -> Result<()> {
        std::fs::write(Self::file(), self.as_str())
            .with_context(|| format!("write {}", Self::file().display()))
    }
}

/// kube-proxy's rules for the Services of `family` in `place`, as text: its nftables table,
/// or the `KUBE-SERVICES` chain of its iptables nat table. Either names each Service in a
/// comment (`"NAMESPACE/NAME:PORT…"`).
pub fn kube_services(place: &Place, family: Family) -> Result<String> {
    match ProxyMode::current() {
        ProxyMode::Nftables => place.run(&["nft", "list", "table", family.nft(), "kube-proxy"]),
        ProxyMode::Iptables => place.run(&[family.iptables(), "-t", "nat", "-S", "KUBE-SERVICES"]),
    }
}

/// Whether kube-proxy in `place` forwards the Service address `ip` (of `family`) to
/// endpoints. A Service without endpoints is rejected instead (nftables: its address is in
/// the `no-endpoint-services` map, not in `service-ips`; iptables: a REJECT in the filter
/// table, nothing in the nat table's `KUBE-SERVICES`).
pub fn forwards(place: &Place, family: Family, ip: &str) -> bool {
    match ProxyMode::current() {
        ProxyMode::Nftables => place
            .run(&[
                "nft",
                "list",
                "map",
                family.nft(),
                "kube-proxy",
                "service-ips",
            ])
            .is_ok_and(|map| map.contains(&format!("{ip} . "))),
        ProxyMode::Iptables => kube_services(place, family).is_ok_and(|rules| {
            let dest = format!("-d {ip}/{} ", family.bits());
            rules
                .lines()
                .any(|l| l.contains(&dest) && l.contains("-j KUBE-SVC-"))
        }),
    }
}

/// An IP family, as the tools that list kube-proxy's rules name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv6.
    V6,
    /// IPv4.
    V4,
}

impl Family {
    fn nft(self) -> &'static str {
        match self {
            Family::V6 => "ip6",
            Family::V4 => "ip",
        }
    }

    fn iptables(self) -> &'static str {
        match self {
            Family::V6 => "ip6tables",
            Family::V4 => "iptables",
        }
    }

    fn bits(self) -> u8 {
        match self {
            Family::V6 => 128,
            Family::V4 => 32,
        }
    }
}

fn wait_service_rules(node: &Node, here: &Place) -> Result<()> {
    let name = format!("{}-kube-proxy", node.name);
    let place = here.clone();
    proc::wait_daemon(
        &name,
        "kube-proxy to program the service of the apiserver",
        START_LIMIT,
        || forwards(&place, Family::V6, super::KUBERNETES_SERVICE_IP),
    )?;
    Ok(())
}
