//! `cargo xtask lab [up|down|check|faults] [--router bird|frr] [--bins DIR]`: a small routed site
//! in network namespaces, from one command. The router is BIRD or FRR (zebra, bfdd and bgpd, as
//! real fabrics' top-of-rack routers run it), rendered from one description
//! ([`crate::router`]); `check` runs the lab with each in turn. `faults` runs the measured
//! failure tests of `flock-bird/tests/faults.rs` (graceful restart, BFD, passwords, unnumbered
//! sessions) and prints their figures.
//!
//! ```text
//!                       flocklab-router (AS65000, BIRD or FRR)
//!                  2001:db8:f1:1::1 /      \ fe80::1 (link-local only)
//!                                  /        \
//!   flocklab-node1 (AS64601)  2001:db8:f1:1::2   fe80::2          flocklab-node2 (AS64602)
//!   flock-agent + BIRD                                         flock-agent + BIRD
//!   pods 2001:db8:a1::/64 10.101.1.0/24                  pods 2001:db8:a2::/64 10.101.2.0/24
//!     flocklab-web-1  (ip-algo workload)                   flocklab-web-2 (ip-algo workload)
//!     flocklab-dns-1  (anycast 2001:db8:53::53, 10.53.0.53) flocklab-dns-2 (same anycast)
//! ```
//!
//! Every session is IPv6 and carries both families (IPv4 with extended next hop). node2's is
//! unnumbered: its link has link-local addresses only (`fe80::1` at the router, `fe80::2` at
//! the node), its NodeConfig names the router as `fe80::1` on `uplink`, and its IPv4 routes
//! cross the session with a link-local IPv6 next hop; FRR peers with it as `neighbor to-node2
//! interface`, learning the node's address from the router advertisements flock's BIRD sends.
//! node1's session has a TCP MD5 password, which its agent reads from a file
//! (`passwordFile`), BFD (100 ms x 3), communities, and no graceful restart; node2's has
//! graceful restart. Each node
//! runs the standalone agent on its own NodeConfig file, and BIRD on the configuration the
//! agent renders; the pods are created by exec'ing the real shim in the node namespace exactly
//! as a runtime does (testkit's libcni-like runtime: conflist, `CNI_*`, pod annotations as the
//! `io.kubernetes.cri.pod-annotations` capability). Everything lives in namespaces named
//! `flocklab-*` and under [`LAB_DIR`]; nothing touches the machine's own namespace. `up` first
//! removes a lab that is already up; `down` removes every namespace, process and file.
//!
//! [`up`] returns an error if any check fails (a session not Established, the anycast route
//! without two next hops, a lost ping, a BGP option the router does not see, BFD slower than
//! 1 s, pings lost across a BIRD crash under graceful restart), so `cargo xtask test` runs it
//! as a check too ([`ci`]) with the debug binaries, with each router.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::sys;

mod bringup;
mod checks;
mod topology;

use bringup::{add_pod, build_network, start_node, start_router};
use checks::{
    report_agent_restart, report_anycast, report_bgp_options, report_faults, report_pings,
    report_pods, report_router_routes, report_sessions, wait_converged,
};
use topology::{NODES, PODS};

use crate::router::Kind;

/// Where the lab keeps its configuration, sockets, state and logs.
pub const LAB_DIR: &str = "/run/flocklab";
/// Every namespace of the lab starts with this.
pub const NS_PREFIX: &str = "flocklab-";
/// Debian packages the lab drives (the router's besides: [`Kind::packages`]).
const PACKAGES: &[&str] = &["bird2", "iproute2", "iputils-ping", "util-linux"];

/// Installs what the lab and a router of `kinds` need.
fn ensure_packages(kinds: &[Kind]) -> Result<()> {
    let mut packages = PACKAGES.to_vec();
    for kind in kinds {
        packages.extend(kind.packages());
    }
    sys::ensure_packages(&packages)
}

/// The options of `cargo xtask lab`.
#[derive(Default)]
struct Options<'a> {
    /// `--router bird|frr`.
    router: Option<Kind>,
    /// `--bins DIR`: `flock-agent` and `flock` from DIR rather than a release build.
    bins: Option<PathBuf>,
    /// The command (`up`, `down`, `check`, `faults`).
    command: Option<&'a str>,
}

impl<'a> Options<'a> {
    fn parse(args: &'a [String]) -> Result<Options<'a>> {
        let mut options = Options::default();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
                _ => (arg.as_str(), None),
            };
            let mut value = || {
                inline
                    .or_else(|| iter.next().map(String::as_str))
                    .with_context(|| format!("{flag} needs a value"))
            };
            match flag {
                "--router" => options.router = Some(value()?.parse()?),
                "--bins" => options.bins = Some(PathBuf::from(value()?)),
                command if options.command.is_none() && !command.starts_with('-') => {
                    options.command = Some(command);
                }
                other => bail!("unknown lab argument {other:?}\n{USAGE}"),
            }
        }
        Ok(options)
    }
}

const USAGE: &str =
    "usage: cargo xtask lab [up|down|check|faults] [--router bird|frr] [--bins DIR]";

/// `cargo xtask lab [up|down|check|faults] [--router bird|frr] [--bins DIR]` (`check`: up on
/// the debug binaries, then down; with each router unless `--router` names one).
pub fn lab(args: &[String]) -> Result<()> {
    let Options {
        router,
        bins,
        command,
    } = Options::parse(args)?;
    match command {
        None | Some("up") => {
            sys::require_root("cargo xtask lab")?;
            let kind = router.unwrap_or_default();
            ensure_packages(&[kind])?;
            let bins = match bins {
                Some(dir) => dir,
                None => crate::binaries::build(crate::binaries::FLOCK, true)?,
            };
            let started = Instant::now();
            let report = match up(&bins, kind) {
                Ok(report) => report,
                Err(e) => bail!(
                    "{e:#}\n(the lab is left up for inspection: logs under {LAB_DIR}; \
                     `cargo xtask lab down` removes it)"
                ),
            };
            print!("{report}");
            println!(
                "lab up in {:.1} s (after the build); `cargo xtask lab down` removes it",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some("check") => {
            // What `cargo xtask test` runs: the debug binaries, up, checks, down.
            sys::require_root("cargo xtask lab check")?;
            let kinds = router.map_or_else(|| ROUTERS.to_vec(), |k| vec![k]);
            ci(
                &crate::binaries::build(crate::binaries::FLOCK, false)?,
                &kinds,
            )
        }
        Some("down") => {
            sys::require_root("cargo xtask lab down")?;
            down()
        }
        Some("faults") => {
            // Graceful restart, BFD, passwords and unnumbered sessions measured with real BIRD
            // (flock-bird/tests/faults.rs; `cargo xtask test` runs it too).
            sys::require_root("cargo xtask lab faults")?;
            ensure_packages(&[])?;
            sys::cargo([
                "nextest",
                "run",
                "-p",
                "flock-bird",
                "--features",
                "root-tests",
                "--test",
                "faults",
                "--no-capture",
            ])
        }
        Some(other) => {
            bail!("unknown lab command {other:?}\n{USAGE}")
        }
    }
}

/// `target/debug`, where `cargo build --workspace --bins` puts the binaries.
pub fn debug_bins() -> PathBuf {
    crate::binaries::target_dir().join("debug")
}

/// Every router the lab runs.
pub const ROUTERS: [Kind; 2] = [Kind::Bird, Kind::Frr];

/// The lab as a check of `cargo xtask test`: with each router of `kinds` in turn (their
/// packages installed when missing), [`ci_one`].
pub fn ci(bins: &Path, kinds: &[Kind]) -> Result<()> {
    ensure_packages(kinds)?;
    for kind in kinds {
        ci_one(bins, *kind)?;
    }
    Ok(())
}

/// Up with the binaries in `bins` (the debug build) and the router `kind`, the report
/// printed, then down whatever happened.
fn ci_one(bins: &Path, kind: Kind) -> Result<()> {
    let started = Instant::now();
    let result = up(bins, kind);
    let cleanup = down();
    let report = result.with_context(|| format!("the lab with {kind} as the router"))?;
    print!("{report}");
    println!(
        "lab with {kind} as the router: up and checked in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    cleanup
}

/// Builds the lab with `flock-agent` and `flock` from `bins` and `kind` as the router (after
/// removing any lab already up), checks it and returns the printed report. Fails (with the report in the error) when a
/// check fails; the lab stays up until [`down`] (`lab up` leaves it for inspection, the
/// test run removes it).
pub fn up(bins: &Path, kind: Kind) -> Result<String> {
    for bin in ["flock-agent", "flock"] {
        if !bins.join(bin).exists() {
            bail!("{} is not built", bins.join(bin).display());
        }
    }
    down().context("remove the previous lab")?;
    std::fs::create_dir_all(LAB_DIR).with_context(|| format!("create {LAB_DIR}"))?;
    build_network()?;
    start_router(kind)?;
    for node in &NODES {
        start_node(node, bins)?;
    }
    let mut pods = Vec::new();
    for pod in &PODS {
        pods.push(add_pod(pod, bins)?);
    }
    let mut failures = Vec::new();
    let mut report = String::new();
    report_pods(&mut report, &pods);
    wait_converged(kind, &mut failures);
    report_sessions(kind, &mut report, &mut failures)?;
    report_router_routes(kind, &mut report, &mut failures)?;
    report_pings(&mut report, &pods, &mut failures);
    report_anycast(&mut report, &mut failures);
    report_agent_restart(kind, &mut report, &pods, bins, &mut failures)?;
    report_bgp_options(kind, &mut report, bins, &mut failures)?;
    report_faults(kind, &mut report, &pods, &mut failures)?;
    if failures.is_empty() {
        Ok(report)
    } else {
        bail!("{report}\nlab checks failed:\n  {}", failures.join("\n  "))
    }
}

/// Removes every `flocklab-*` namespace (killing what runs inside: agents, BIRD) and
/// [`LAB_DIR`]. Does nothing when no lab is up.
pub fn down() -> Result<()> {
    let namespaces: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(NS_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    let mut killed = Vec::new();
    for ns in &namespaces {
        let pids = sys::output(Command::new("ip").args(["netns", "pids", ns])).unwrap_or_default();
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
            killed.push(pid.to_owned());
        }
    }
    // Dead means gone or a zombie waiting for init (BIRD and the agents are not our children).
    let dead = |pid: &String| !pid.parse().is_ok_and(flock_testkit::is_alive);
    sys::wait_for(Duration::from_secs(5), || killed.iter().all(dead))
        .with_context(|| format!("lab processes {killed:?} did not die"))?;
    for ns in &namespaces {
        // A process just killed may still hold the namespace for a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let deleted = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if deleted || !Path::new("/run/netns").join(ns).exists() {
                break;
            }
            if Instant::now() > deadline {
                bail!("cannot delete namespace {ns}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if Path::new(LAB_DIR).exists() {
        std::fs::remove_dir_all(LAB_DIR).with_context(|| format!("remove {LAB_DIR}"))?;
    }
    if !namespaces.is_empty() {
        eprintln!("lab: removed {}", namespaces.join(" "));
    }
    Ok(())
}
