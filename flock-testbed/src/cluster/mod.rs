//! `cargo xtask cluster [up|down|check|build|gomod|e2e|life|kubectl ARGS…]`: a real Kubernetes
//! cluster on this machine, in network namespaces, with flock deployed into it from `deploy/`.
//!
//! ```text
//!                          flockcluster-router  AS65000, BIRD
//!              2001:db8:c0:1::1 /        | 2001:db8:c0:10::1   \ 2001:db8:c0:2::1
//!   flockcluster-node1              flockcluster-control          flockcluster-node2
//!   2001:db8:c0:1::2                2001:db8:c0:10::2             2001:db8:c0:2::2
//!   containerd 2, kubelet,          etcd, kube-apiserver,         containerd 2, kubelet,
//!   kube-proxy; flock DaemonSet     controller-manager, scheduler kube-proxy; flock DaemonSet
//!   (agent + BIRD, AS64701)                                       (agent + BIRD, AS64702)
//!   pods 2001:db8:c1::/64 10.201.1.0/24                           pods 2001:db8:c2::/64 10.201.2.0/24
//! ```
//!
//! Kubernetes (1.35, 1.36 or 1.37, the newest unless `--kubernetes` names another),
//! containerd 2, runc, etcd, CoreDNS and the reference CNI plugins are each built once from
//! their Go module ([`kube`], [`crate::components`]); the kubelet and kube-proxy run from
//! configuration files, kube-proxy in nftables mode unless `--proxy-mode iptables`. The
//! services are IPv6 (`2001:db8:c5::/108`; IPv4 `10.205.0.0/16` for a dual-stack Service),
//! every node address is IPv6, pods are dual-stack and IPv6-primary (the kubelet orders a
//! pod's addresses by its node IP's family), CoreDNS answers for `cluster.local`. flock's image
//! is built from `deploy/Dockerfile` by podman and the manifests of `deploy/` are applied with
//! only the image reference changed ([`deploy`]). `up` removes a cluster that is up, builds
//! everything, checks it and prints a report ([`report`]); a failed check fails the command
//! and leaves the cluster up for inspection. `down` kills every process (recorded under
//! [`RUN_DIR`], see [`proc`]), removes every namespace, cgroup and file, and the mount points
//! it had to create. Nothing touches the machine's own network namespace.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::sys;
use crate::versions::Kubernetes;

pub use node::ProxyMode;

pub mod bench;
pub mod cni;
mod control;
mod deploy;
pub mod e2e;
pub(crate) mod images;
pub mod kube;
pub mod life;
mod multus;
mod node;
pub mod peers;
mod pki;
mod proc;
mod report;
mod site;

/// Where the cluster keeps its configuration, certificates, state, sockets and logs.
pub const RUN_DIR: &str = "/run/flockcluster";
/// Every network namespace of the cluster starts with this.
pub const NS_PREFIX: &str = "flockcluster-";
/// Debian packages the cluster drives (the build adds its own, see [`kube`]).
const PACKAGES: &[&str] = &[
    "iproute2",
    "iputils-ping",
    "util-linux",
    "procps",
    "curl",
    "openssl",
    "bird2",
    "nftables",
    "iptables",
    "conntrack",
    "busybox-static",
    "podman",
    "mmdebstrap",
];

const ROUTER: &str = "flockcluster-router";
const CONTROL: &str = "flockcluster-control";
const ROUTER_ASN: u32 = 65000;
/// The router's own addresses (on its loopback).
const ROUTER_LO6: &str = "2001:db8:c0::1";
const ROUTER_LO4: &str = "10.200.255.1";
/// The control plane's address (the apiserver's) and its gateway, the router.
const CONTROL_ADDR: &str = "2001:db8:c0:10::2";
const CONTROL_GW: &str = "2001:db8:c0:10::1";
/// The control plane's IPv4 address (on its loopback), its source towards IPv4 pods.
const CONTROL_ADDR4: &str = "10.200.255.10";
/// Services: IPv6 first, IPv4 for a Service that asks for both families (the apiserver makes
/// its ServiceCIDR `kubernetes` of them).
const SERVICE_CIDR: &str = "2001:db8:c5::/108";
const SERVICE_CIDR4: &str = "10.205.0.0/16";
/// The pools' `spec.services`: LoadBalancer addresses flock hands out, the external IPs it
/// announces, and the cluster IP ranges, announced as aggregates from every node.
const LB_CIDR6: &str = "2001:db8:c8::/112";
const LB_CIDR4: &str = "10.204.0.0/24";
const EXTERNAL_CIDR6: &str = "2001:db8:c8:e::/112";
/// The first service address: `kubernetes.default`.
const KUBERNETES_SERVICE_IP: &str = "2001:db8:c5::1";
/// The cluster's DNS domain and the address of its DNS Service (CoreDNS, `kube-system/kube-dns`).
pub(crate) const CLUSTER_DOMAIN: &str = "cluster.local";
pub(crate) const CLUSTER_DNS: &str = "2001:db8:c5::a";
/// The anycast addresses the demo DaemonSet's pods share.
const ANYCAST6: &str = "2001:db8:c3::53";
const ANYCAST4: &str = "10.203.0.53";
/// The identity flock's agents use (`deploy/rbac.yaml`).
const FLOCK_SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:flock";

/// One worker node of the cluster.
pub struct Node {
    /// The Kubernetes node name.
    name: &'static str,
    /// Its ASN and BGP router ID (also on its loopback, its IPv4 identity).
    asn: u32,
    router_id: &'static str,
    /// Its pod CIDRs (its NodeConfig, written by the pool controller).
    cidr6: &'static str,
    cidr4: &'static str,
    /// Its rack pool's IPv4 CIDR, cut into /24s (the IPv6 one is the /48 of `cidr6`).
    pool4: &'static str,
    /// Its address (the node IP) and its gateway, the router's end of the link.
    addr: &'static str,
    gateway: &'static str,
    /// The router's end of the link.
    router_if: &'static str,
    /// Its rack (the label its NodePool selects it by).
    rack: &'static str,
    /// Its session with the router runs BFD (fast failure detection).
    bfd: bool,
    /// Its session with the router has a TCP MD5 password, which flock's agent reads from
    /// the Secret `kube-system/flock-bgp-passwords` (key: the node's name).
    password: bool,
}

const NODES: [Node; 2] = [
    Node {
        name: "node1",
        asn: 64701,
        router_id: "10.200.255.11",
        cidr6: "2001:db8:c1::/64",
        cidr4: "10.201.1.0/24",
        pool4: "10.201.1.0/24",
        addr: "2001:db8:c0:1::2",
        gateway: "2001:db8:c0:1::1",
        router_if: "to-node1",
        rack: "rack1",
        bfd: false,
        password: true,
    },
    Node {
        name: "node2",
        asn: 64702,
        router_id: "10.200.255.12",
        cidr6: "2001:db8:c2::/64",
        cidr4: "10.201.2.0/24",
        pool4: "10.201.2.0/24",
        addr: "2001:db8:c0:2::2",
        gateway: "2001:db8:c0:2::1",
        router_if: "to-node2",
        rack: "rack2",
        bfd: true,
        password: false,
    },
];

/// A third node that is not part of the cluster `up` builds: `cargo xtask cluster life join`
/// boots it into a rack of its own (its pool exists from the start, empty, room for 256
/// nodes), checks that it gets its NodeConfig, runs pods and is routed, then removes it again.
const JOINER: Node = Node {
    name: "node3",
    asn: 64703,
    router_id: "10.200.255.13",
    cidr6: "2001:db8:c7::/64",
    cidr4: "10.202.0.0/24",
    pool4: "10.202.0.0/16",
    addr: "2001:db8:c0:3::2",
    gateway: "2001:db8:c0:3::1",
    router_if: "to-node3",
    rack: "rack3",
    bfd: false,
    password: false,
};

/// Every node the cluster knows of: its two, then the one that joins in `life join`.
fn every_node() -> impl Iterator<Item = &'static Node> {
    NODES.iter().chain(std::iter::once(&JOINER))
}

/// `kubectl` as admin, from the control plane's namespace.
fn kubectl_command() -> Command {
    let mut cmd = proc::Place::Net(CONTROL.to_owned()).command(kube::kubectl());
    cmd.arg(format!("--kubeconfig={}", pki::kubeconfig("admin")));
    cmd
}

/// Runs `kubectl ARGS…` as admin; fails with its stderr unless it exits 0; returns stdout.
pub fn kubectl(args: &[&str]) -> Result<String> {
    sys::output(kubectl_command().args(args))
}

/// Runs `kubectl ARGS…` as admin with `input` on stdin.
pub fn kubectl_stdin(args: &[&str], input: &str) -> Result<String> {
    use std::io::Write as _;
    let mut cmd = kubectl_command();
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("spawn {shown}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("write to {shown}"))?;
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("wait for {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The repository (for `deploy/`).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

const USAGE: &str = "usage: cargo xtask cluster [up [OPTIONS]|down|check [FILTERS]|build [OPTIONS]|gomod|e2e …|life …|kubectl ARGS…]
  up       build what is missing, (re)create the cluster, deploy flock, CoreDNS and the
           workloads, check and print everything (a failed check leaves the cluster up)
  down     remove every namespace, process, mount and file of the cluster
  check    the cluster's scenarios (flock-testbed/tests/cluster.rs: life tests, e2e suites,
           uninstall) under cargo-nextest on one cluster, then down whatever happened (what
           `cargo xtask test` runs last); FILTERS go to nextest (-E 'test(life_upgrade)')
  build    only build (or find in the cache) Kubernetes and its peers, the suites'
           binaries and the add-ons (Multus), printing each one's time
  gomod [NAME…]  rewrite the Go wrapper modules (flock-testbed/go) from
           flock-testbed/src/versions.rs: every one, or those named (helm, etcd, kubernetes-1.37…)
  e2e [--suite network|dns|networkpolicy|dualstack] [--focus REGEX] [--skip REGEX]
      [--pods ipv6|dual] [--parallel N]
           Kubernetes' own e2e suite (e2e.test of the cluster's release) against the cluster
           that is up: sig-network's Networking, Services and Conformance specs unless --suite
           or --focus; skips [Slow], [Serial], [Disruptive], [Flaky], [Feature:…] (but the
           suite's own feature) and the specs of flock-testbed/src/cluster/e2e/exclusions.txt;
           pods IPv6-only unless --pods dual (dualstack: dual); 4 e2e.test processes unless
           --parallel
  e2e --suite cluster-network-policy [--features standard|all|F1,F2] [--focus REGEX]
      [--skip REGEX] [--pods ipv6|dual]
           SIG Network's ClusterNetworkPolicy conformance suite (network-policy-api's
           TestConformance) against the cluster that is up: the features of the installed
           CRD's channel unless --features; --focus/--skip select its tests (CNP…)
  life [upgrade] [ready] [routing] [services] [reboot] [join] [leave] [startup] [policy] [operate] [multus] | life uninstall
           against the cluster that is up (all but uninstall unless named): a rolling update
           of flock under traffic, STATUS as the node's Ready condition, BGP failures
           (graceful restart, BFD), LoadBalancer Service addresses at the router, a node's
           reboot (and one while its Node is deleted), a third node joining and leaving (and
           the pool controller's leader killed mid-assignment), 50 pods started at once with
           flock and with ptp, policy-to-nftables latency and agent memory at 10,000 pods,
           `kubectl flock` against the cluster, flock's secondary networks under Multus
           (installed for the test unless it is); uninstall removes flock as it was installed
           (helm uninstall, or kubectl delete -f deploy/; then the CRDs and flock-agent
           cleanup) and checks nothing of flock is left and kube-proxy's rules are as they were
  kubectl  run kubectl against the cluster as admin
OPTIONS of up and build:
  --kubernetes 1.35|1.36|1.37   the release (the newest unless named)
  --proxy-mode nftables|iptables  kube-proxy's mode (nftables unless named)
  --bins DIR  take flock-agent and flock from DIR instead of `cargo build --release`
  --router bird|frr  the BGP router the nodes peer with: BIRD (unless named) or FRR
  --install helm|manifests  install flock with `helm install` of charts/flock (unless named)
           or `kubectl apply` of deploy/'s manifests (the chart rendered)
  --multus  Multus (thick plugin, built from its module) as the meta-plugin, flock as the
           cluster network behind it (docs/multus.md)
  --cni flock|kube-router|ptp  the pod network: flock (unless named), or a peer it is
           compared with, built from its module and deployed as its project documents it:
           kube-router (BGP to the router) or ptp + host-local (static routes at the router);
           run only in the test bed, never shipped
  --policy kube-network-policies  SIG Network's NetworkPolicy implementation over --cni ptp";

/// `cargo xtask cluster …`.
pub fn cluster(args: &[String]) -> Result<()> {
    let sub = args.first().map(String::as_str);
    match sub {
        None | Some("up") => {
            sys::require_root("cargo xtask cluster up")?;
            let started = Instant::now();
            let options = UpOptions::parse(args.get(1..).unwrap_or_default())?;
            let bins = match &options.bins {
                Some(dir) => dir.clone(),
                None => {
                    sys::ensure_packages(PACKAGES)?;
                    crate::binaries::build(crate::binaries::FLOCK, true)?
                }
            };
            let report = match up(&bins, &options, started) {
                Ok(report) => report,
                Err(e) => bail!(
                    "{e:#}\n(the cluster is left up for inspection: logs under {RUN_DIR}/logs; \
                     `cargo xtask cluster kubectl …`; `cargo xtask cluster down` removes it)"
                ),
            };
            print!("{report}");
            println!(
                "cluster up in {:.0} s, all checks passed; `cargo xtask cluster kubectl get pods -A` \
                 to look around, `cargo xtask cluster down` removes it",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some("check") => check(&args[1..]),
        Some("down") => {
            sys::require_root("cargo xtask cluster down")?;
            down()
        }
        Some("build") => {
            sys::require_root("cargo xtask cluster build")?;
            let options = UpOptions::parse(args.get(1..).unwrap_or_default())?;
            kube::ensure_release(options.kubernetes)?.with_e2e()?;
            crate::components::ensure_all(&crate::components::suites())?;
            crate::components::ensure_all(&crate::components::addons())?;
            crate::components::ensure_all(&crate::components::peers())?;
            Ok(())
        }
        Some("gomod") => crate::gomod::write_named(&args[1..]),
        Some("e2e") => e2e::run(&args[1..]),
        Some("life") => life::run(&args[1..]),
        Some("kubectl") => {
            let status = kubectl_command()
                .args(&args[1..])
                .status()
                .context("run kubectl")?;
            if !status.success() {
                std::process::exit(status.code().unwrap_or(1));
            }
            Ok(())
        }
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown cluster command {other:?}\n{USAGE}"),
    }
}

/// `cargo xtask cluster check [FILTERS…]`, also the last step of `cargo xtask test`: the
/// cluster's scenarios (`flock-testbed/tests/cluster.rs`, under cargo-nextest, one cluster for
/// all), then the cluster down whatever happened. `FILTERS` go to nextest
/// (`-E 'test(life_upgrade)'`).
pub fn check(filters: &[String]) -> Result<()> {
    sys::require_root("cargo xtask cluster check")?;
    sys::ensure_packages(PACKAGES)?;
    let started = Instant::now();
    // Everything the scenarios run is built before them (a scenario runs no build: under
    // `cargo test` the target folder is locked while tests run), and a cluster left up by
    // hand, with other binaries, is not reused.
    let options = UpOptions::from_env()?;
    step("Kubernetes and its peers", || {
        kube::ensure_release(options.kubernetes)
    })?;
    step("the add-ons the scenarios install (Multus)", || {
        crate::components::ensure_all(&crate::components::addons())
    })?;
    crate::binaries::build(crate::binaries::FLOCK, false)?;
    crate::binaries::build(&[life::OPERATOR_TOOLS], false)?;
    down()?;
    // The `cluster` profile of .config/nextest.toml selects the scenarios; FILTERS narrow it.
    let mut args: Vec<String> = [
        "nextest",
        "run",
        "-p",
        "flock-testbed",
        "--features",
        "cluster",
        "--profile",
        "cluster",
    ]
    .map(String::from)
    .to_vec();
    args.extend(filters.iter().cloned());
    let result = sys::run(&mut sys::cargo_command(&args));
    let cleanup = down();
    result?;
    cleanup?;
    println!(
        "cluster check passed in {:.0} s (the scenarios on one cluster, then down)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What `up` (and `build`) is told: `--kubernetes 1.N`, `--proxy-mode nftables|iptables`,
/// `--bins DIR`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The release to run (the newest unless named).
    pub kubernetes: Kubernetes,
    /// kube-proxy's mode (nftables unless named).
    pub proxy_mode: ProxyMode,
    /// flock's binaries, instead of `cargo build --release`.
    pub bins: Option<PathBuf>,
    /// The router: BIRD unless named.
    pub router: crate::router::Kind,
    /// How flock is installed: Helm unless named.
    pub installer: deploy::Installer,
    /// Multus as the meta-plugin, flock behind it (`--multus`).
    pub multus: bool,
    /// The pod network: flock unless named (`--cni`).
    pub cni: cni::Cni,
    /// A NetworkPolicy engine over a CNI without one (`--policy`).
    pub policy: Option<cni::Policy>,
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            kubernetes: Kubernetes::newest(),
            proxy_mode: ProxyMode::Nftables,
            bins: None,
            router: crate::router::Kind::Bird,
            installer: deploy::Installer::Helm,
            multus: false,
            cni: cni::Cni::Flock,
            policy: None,
        }
    }
}

impl UpOptions {
    /// The options of the scenarios' cluster, from the environment
    /// (`FLOCK_TESTBED_KUBERNETES`, `FLOCK_TESTBED_PROXY_MODE`, `FLOCK_TESTBED_ROUTER`,
    /// `FLOCK_TESTBED_INSTALL`), on the
    /// debug binaries.
    pub fn from_env() -> Result<UpOptions> {
        let mut options = UpOptions::default();
        if let Ok(k) = std::env::var("FLOCK_TESTBED_KUBERNETES") {
            options.kubernetes = Kubernetes::parse(&k).context("FLOCK_TESTBED_KUBERNETES")?;
        }
        if let Ok(mode) = std::env::var("FLOCK_TESTBED_PROXY_MODE") {
            options.proxy_mode = ProxyMode::parse(&mode).context("FLOCK_TESTBED_PROXY_MODE")?;
        }
        if let Ok(router) = std::env::var("FLOCK_TESTBED_ROUTER") {
            options.router = router.parse().context("FLOCK_TESTBED_ROUTER")?;
        }
        if let Ok(installer) = std::env::var("FLOCK_TESTBED_INSTALL") {
            options.installer = installer.parse().context("FLOCK_TESTBED_INSTALL")?;
        }
        options.bins = Some(crate::lab::debug_bins());
        Ok(options)
    }

    /// Parses `up`'s options; an unknown one, or one without its value, is an error naming it.
    pub fn parse(args: &[String]) -> Result<UpOptions> {
        let mut options = UpOptions::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .with_context(|| format!("{flag} needs a value\n{USAGE}"))
            };
            match flag.as_str() {
                "--kubernetes" => options.kubernetes = Kubernetes::parse(value()?)?,
                "--proxy-mode" => options.proxy_mode = ProxyMode::parse(value()?)?,
                "--bins" => options.bins = Some(PathBuf::from(value()?)),
                "--router" => options.router = value()?.parse()?,
                "--install" => options.installer = value()?.parse()?,
                "--multus" => options.multus = true,
                "--cni" => options.cni = value()?.parse()?,
                "--policy" => options.policy = Some(value()?.parse()?),
                other => bail!("unknown option {other:?}\n{USAGE}"),
            }
        }
        cni::check_combination(options.cni, options.policy)?;
        if options.multus && options.cni != cni::Cni::Flock {
            bail!("--multus runs flock behind Multus: it goes with --cni flock only");
        }
        Ok(options)
    }
}

/// Prints a step's name and, when it ends, how long it took.
fn step<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    eprintln!("cluster: {what} …");
    let out = f().with_context(|| format!("cluster step: {what}"))?;
    eprintln!(
        "cluster: {what}: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(out)
}

/// Builds the cluster with flock's binaries from `bins` (after removing any cluster already
/// up), checks it and returns the printed report. Fails (with the report in the error) when
/// a check fails; the cluster stays up until [`down`] (`cluster up` leaves it for
/// inspection, `cluster check` removes it).
pub fn up(bins: &Path, options: &UpOptions, started: Instant) -> Result<String> {
    for bin in ["flock-agent", "flock"] {
        if !bins.join(bin).exists() {
            bail!("{} is not built", bins.join(bin).display());
        }
    }
    sys::ensure_packages(PACKAGES)?;
    sys::ensure_packages(options.router.packages())?;
    let kube = step("Kubernetes and its peers", || {
        kube::ensure_release(options.kubernetes)
    })?;
    let cnp_crd = step("ClusterNetworkPolicy CRD", deploy::cnp_crd)?;
    if options.installer == deploy::Installer::Helm {
        step("Helm", crate::helm::helm)?;
    }
    step("remove the previous cluster", down)?;
    std::fs::create_dir_all(RUN_DIR).with_context(|| format!("create {RUN_DIR}"))?;
    kube::record(options.kubernetes)?;
    options.proxy_mode.record()?;
    site::record_router(options.router)?;
    options.cni.record()?;
    cni::Policy::record(options.policy)?;
    let repo = repo_root();
    let mut timings = vec![("build and clean up", started.elapsed())];
    let t = Instant::now();
    // The images build (podman, on the machine) while the site and control plane come up.
    let (archives, control) = std::thread::scope(|s| {
        let images = s.spawn(|| {
            step("images", || {
                let mut archives = images::build_all(bins, &repo, &kube)?;
                archives.extend(peers::build_images(options.cni, options.policy)?);
                Ok(archives)
            })
        });
        let control = (|| -> Result<()> {
            step("site: router, namespaces, links", site::build)?;
            step("certificates", pki::make_all)?;
            step("control plane", || control::start(&kube))
        })();
        let archives = images
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the image build panicked")));
        (archives, control)
    });
    control?;
    let archives = archives?;
    timings.push(("site, control plane, images", t.elapsed()));
    let t = Instant::now();
    node::prepare_mount_points()?;
    std::thread::scope(|s| {
        let started: Vec<_> = NODES
            .iter()
            .map(|n| {
                let (kube, archives) = (&kube, &archives);
                s.spawn(move || {
                    step(
                        &format!("{}: containerd, kubelet, kube-proxy", n.name),
                        || node::start(n, kube, archives),
                    )
                })
            })
            .collect();
        started
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a node's start panicked")))
            })
            .collect::<Result<Vec<()>>>()
    })?;
    timings.push(("nodes (both at once)", t.elapsed()));
    let t = Instant::now();
    match options.cni {
        cni::Cni::Flock => {
            step("flock from deploy/", || {
                deploy::install_flock(&repo, &cnp_crd, options.installer)
            })?;
            timings.push(("flock", t.elapsed()));
        }
        peer => {
            let what = match options.policy {
                Some(p) => format!("{} and {}", peer.as_str(), p.as_str()),
                None => peer.as_str().to_owned(),
            };
            step(&what, || peers::install(peer, options.policy))?;
            timings.push(("the pod network", t.elapsed()));
        }
    }
    if options.multus {
        let t = Instant::now();
        step("Multus (thick), flock behind it", multus::install)?;
        timings.push(("Multus", t.elapsed()));
    }
    let t = Instant::now();
    step("CoreDNS", deploy::start_dns)?;
    timings.push(("CoreDNS", t.elapsed()));
    let t = Instant::now();
    step("workloads", deploy::start_workloads)?;
    timings.push(("workloads", t.elapsed()));
    let t = Instant::now();
    let report = step("checks", || Ok(report::run()))?;
    timings.push(("checks", t.elapsed()));
    let mut text = report.text;
    report::timings(&mut text, &timings);
    if report.failures.is_empty() {
        Ok(text)
    } else {
        bail!(
            "{text}\ncluster checks failed:\n  {}",
            report.failures.join("\n  ")
        )
    }
}

/// Removes the cluster: kills every process, removes the tracked cgroups, the namespaces,
/// [`RUN_DIR`] and the mount points `up` created on the machine. Does nothing when no cluster
/// is up.
pub fn down() -> Result<()> {
    let namespaces = proc::namespaces();
    let was_up = Path::new(RUN_DIR).exists() || !namespaces.is_empty();
    let killed = proc::kill_all()?;
    for ns in &namespaces {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let deleted = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if deleted || !Path::new("/run/netns").join(ns).exists() {
                break;
            }
            if Instant::now() > deadline {
                bail!("cannot delete namespace {ns}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Nothing of the cluster is mounted in the machine's namespace (the nodes' mounts died
    // with their mount namespaces); anything left under RUN_DIR is a bug worth failing on.
    let mounts =
        sys::output(Command::new("findmnt").args(["-rn", "-o", "TARGET"])).unwrap_or_default();
    let stray: Vec<&str> = mounts.lines().filter(|m| m.starts_with(RUN_DIR)).collect();
    if !stray.is_empty() {
        bail!("mounts under {RUN_DIR} survived their namespaces: {stray:?}");
    }
    let kept = node::remove_created_mount_points();
    if Path::new(RUN_DIR).exists() {
        std::fs::remove_dir_all(RUN_DIR).with_context(|| format!("remove {RUN_DIR}"))?;
    }
    if was_up {
        eprintln!(
            "cluster: down: killed {} processes, removed {}{}",
            killed.len(),
            if namespaces.is_empty() {
                "no namespaces".to_owned()
            } else {
                namespaces.join(" ")
            },
            if kept.is_empty() {
                String::new()
            } else {
                format!(" (kept {} : not empty)", kept.join(" "))
            }
        );
    }
    Ok(())
}
