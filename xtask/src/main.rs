//! Project automation, run as `cargo xtask <command>`.
//!
//! - `test`: install the Debian packages the suite needs (only when missing)
//!   and run every check and test of the workspace, the root-only kernel
//!   tests included. This is the README's test command and all `.ci/run` calls.
//! - `bench`: end-to-end CNI latency and throughput of every subject (the
//!   reference plugins, flock) through one runtime stand-in, written into
//!   `BENCHMARKS.md` (`flock_testbed::bench`); `bench cluster`: flock beside
//!   kube-router and kube-network-policies on the same cluster, a table of
//!   ratios (`flock_testbed::cluster::bench`).
//! - `lab [up|down|check|faults]`: two routed nodes, a router and four pods in network
//!   namespaces, checked and printed as tables (`flock_testbed::lab`).
//! - `cluster [up|down|check|build|gomod|e2e|life|kubectl ARGS…]`: a real Kubernetes cluster
//!   (1.35-1.37, built with containerd 2 and the rest from Go modules) in network namespaces,
//!   flock installed into it with Helm (or from `deploy/`), and its scenarios
//!   (`flock_testbed::cluster`).
//! - `helm [render|check|lint]`: the chart `charts/flock`, and `deploy/` rendered from it
//!   (`flock_testbed::helm`).
//! - `fuzz [TARGET…] [--minutes N]`: the fuzz targets of `fuzz/` under cargo-fuzz on nightly
//!   (`flock_testbed::fuzz`).
//!
//! xtask is only the dispatcher: everything it runs lives in the `flock-testbed` crate.

use std::process::Command;

use anyhow::{Result, bail};

use flock_testbed::{bench, binaries, cluster, components, lab, sys};

/// Debian packages the test suite drives for real.
const TEST_PACKAGES: &[&str] = &[
    "iproute2",
    "iputils-ping",
    "procps",
    "curl",
    "bird2",
    // FRR, the lab's other router (`vtysh -C` checks its rendered configuration).
    "frr",
    "busybox-static",
    "protobuf-compiler",
    "nftables",
    // The portmap plugin's rules, in the chain tests (not on every fresh Debian).
    "iptables",
    // The shim is linked against musl (flock-plugin/musl.specs).
    "musl-dev",
];

/// The crates published for other CNI authors (every other crate is `publish = false`).
const PUBLISHED_LIBRARIES: &[&str] = &[
    "flock-cni-proto",
    "flock-embed",
    "flock-ipam",
    "flock-bird",
    "flock-policy",
    "flock-netns",
    "flock-k8s-api",
];

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match command.as_str() {
        "test" => test(&rest),
        "bench" if rest.first().map(String::as_str) == Some("cluster") => {
            cluster::bench::run(&rest[1..])
        }
        "bench" => bench::bench(&rest),
        "lab" => lab::lab(&rest),
        "cluster" => cluster::cluster(&rest),
        "helm" => flock_testbed::helm::helm_command(&rest),
        "fuzz" => flock_testbed::fuzz::fuzz(&rest),
        bench::HANDOFF_DAEMON => bench::handoff_daemon(&rest),
        _ => {
            eprintln!(
                "usage: cargo xtask test [nextest filters…]\n\
                 \x20      cargo xtask bench [--pods N] [--concurrency C] [--rss-pods N] [--rounds R] [--subjects reference,flock] [--no-write]\n\
                 \x20      cargo xtask bench cluster [--rounds R] [--setups …] [--bins DIR] [--no-netpol] [--no-write]\n\
                 \x20      cargo xtask lab [up|down|check|faults]\n\
                 \x20      cargo xtask cluster [up|down|check|build|kubectl ARGS…]\n\
                 \x20      cargo xtask helm [render|check|lint]\n\
                 \x20      cargo xtask fuzz [TARGET…] [--minutes N]\n\
                 \n  test   install what the suite needs and run every test (as root)\
                 \n  bench  ADD/DEL latency and pods/s of each subject, written into BENCHMARKS.md (as root);\
                 \n         `bench cluster`: the same scenarios on a cluster with flock, kube-router and ptp + kube-network-policies in turn, a table of ratios (as root)\
                 \n  lab    two routed nodes, a router and four pods in namespaces; `down` removes them, `check` = up + down on debug builds (as root)\
                 \n  helm   the chart charts/flock: render deploy/ from it, or lint it and check deploy/ against it\
                 \n  fuzz   every fuzz target (or those named) for N minutes each (1 unless said) with cargo-fuzz on nightly; a table of executions and crashes\
                 \n  cluster  Kubernetes 1.35-1.37 in namespaces with flock deployed from deploy/; `cargo xtask cluster help` (as root)"
            );
            if command.is_empty() || command == "help" || command == "--help" {
                Ok(())
            } else {
                bail!("unknown xtask command {command:?}")
            }
        }
    }
}

/// `cargo xtask test [ARGS…]`: extra arguments go to `cargo nextest run`.
fn test(filters: &[String]) -> Result<()> {
    sys::require_root("cargo xtask test")?;
    // In CI every run is a fresh clone with an empty target/: its Rust build is cached per
    // machine beside the Go components' instead, so a warm machine rebuilds only the
    // workspace's own crates, not their dependencies.
    if std::env::var_os("CI").is_some() && std::env::var_os("CARGO_TARGET_DIR").is_none() {
        let dir = components::cache_dir().join("cargo-target");
        eprintln!("xtask: CI: cargo's target folder is {}", dir.display());
        sys::use_target_dir(dir);
    }
    sys::ensure_packages(TEST_PACKAGES)?;
    for ns in flock_testkit::sweep_stale() {
        eprintln!("xtask: removed stale test namespace {ns}");
    }
    // The cluster's own components (Kubernetes, etcd, CoreDNS: most of an hour of Go on a
    // fresh machine's 2 cores) build under `nice -n 19` beside the Rust build and tests, which
    // leave cores idle while they wait on the kernel, BIRD and containerd; the scenarios at
    // the end find them built. Kubernetes first: it is the longest. Its suites' binaries only
    // when the scenarios run the suites (not in CI, see `ci_scenario_filter`). Those the tests
    // themselves run are built below, on their own, so that no component is built twice at
    // once.
    let prebuild = filters.is_empty().then(|| {
        let k = cluster::UpOptions::from_env().map(|o| o.kubernetes);
        std::thread::spawn(move || -> Result<()> {
            let k = k?;
            let mut list = vec![
                components::kubernetes(k),
                components::etcd(),
                components::coredns(),
                components::helm(),
            ];
            if ci_scenario_filter().is_empty() {
                list.push(components::kubernetes_e2e(k));
            }
            for c in list {
                c.ensure_built()?;
            }
            Ok(())
        })
    });
    sys::cargo(["fmt", "--all", "--", "--check"])?;
    sys::cargo([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    // The library crates as crates.io would get them: packaged, then built from the package
    // alone (each against its workspace dependencies as packaged too).
    let mut package: Vec<&str> = vec!["package", "--allow-dirty"];
    for library in PUBLISHED_LIBRARIES {
        package.extend(["-p", library]);
    }
    sys::cargo(package)?;
    // Tests exec the shim and the agent as a runtime does: build them first.
    sys::cargo(["build", "--workspace", "--bins", "--all-features"])?;
    // The shim as a node has it (static, musl): the tests exec this copy, which the next
    // cargo build cannot overwrite, since cargo puts its own link of the shim back in
    // target/debug.
    let shim = binaries::build_shim_copy()?;
    // The workspace is virtual: without `-p`, nextest runs every member, and an explicit
    // `--workspace` would override a `-p` among the filters. The cluster's scenarios are not
    // in nextest's default filter (.config/nextest.toml): they run on their own, last.
    ensure_nextest()?;
    let mut nextest: Vec<String> = ["nextest", "run", "--all-features"]
        .map(String::from)
        .to_vec();
    if std::env::var_os("CI").is_some() {
        nextest.extend(["--profile", "ci"].map(String::from));
    }
    nextest.extend(filters.iter().cloned());
    // The runtime and the plugins the tests drive for real: containerd 2, runc and the
    // reference CNI plugins, built from their Go modules (cached per version); containerd 1.7
    // for the test of the installed conflist on it.
    let containerd = components::containerd().ensure_built()?;
    let containerd_1_7 = components::containerd_1_7().ensure_built()?;
    let runc = components::runc().ensure_built()?;
    let plugins = components::cni_plugins().ensure_built()?;
    let path = format!(
        "{}:{}:{}",
        containerd.bin.display(),
        runc.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    sys::run(
        sys::cargo_command(&nextest)
            .env("FLOCK_SHIM_BIN", &shim)
            .env("PATH", path)
            .env(flock_testkit::REFERENCE_PLUGINS_ENV, &plugins.bin)
            // flock_e2e::CONTAINERD_1_7_DIR_ENV
            .env("FLOCK_CONTAINERD_1_7_DIR", &containerd_1_7.bin),
    )?;
    if filters.is_empty() {
        // The lab end to end on the debug binaries (replaces a lab that is up); the shim is
        // relinked statically, as every build of a node's binaries has it.
        // With BIRD as the router, then FRR.
        lab::ci(&binaries::build(binaries::FLOCK, false)?, &lab::ROUTERS)?;
        sys::cargo(["test", "--doc", "--workspace", "--all-features"])?;
        if let Some(prebuild) = prebuild {
            prebuild
                .join()
                .map_err(|_| anyhow::anyhow!("the build of the cluster's components panicked"))??;
        }
        // The chart lints clean and deploy/ is what it renders.
        flock_testbed::helm::check()?;
        // The fuzz targets build, and pass over their corpora (crash inputs kept with fixes).
        flock_testbed::fuzz::check()?;
        // Last, the cluster's scenarios on the debug binaries, one cluster for all of them
        // (the first run on a machine builds Kubernetes and its peers into /var/cache/flock),
        // then the cluster down whatever happened.
        cluster::check(&ci_scenario_filter())?;
    }
    Ok(())
}

/// The scenarios CI leaves out, as nextest filter arguments: Kubernetes' own suites
/// (`e2e_network`, `e2e_networkpolicy`: some 20 minutes, and some 3.5 minutes of Kubernetes'
/// build for their binaries), so that a fresh machine's run, which first builds Kubernetes and its
/// peers on 2 cores, stays within CI's limit. `cargo xtask cluster check` runs them with
/// every other scenario.
fn ci_scenario_filter() -> Vec<String> {
    if std::env::var_os("CI").is_some() {
        vec!["-E".into(), "not test(/^e2e_/)".into()]
    } else {
        Vec::new()
    }
}

/// Installs cargo-nextest (from crates.io, once per machine) when it is missing: it runs each
/// test in a process of its own, with the per-test time limits and groups of
/// `.config/nextest.toml`.
fn ensure_nextest() -> Result<()> {
    if has_nextest() {
        return Ok(());
    }
    // Without optimisation: it mostly waits for the tests it runs, and a release build of it
    // costs a fresh machine's 2 cores some ten minutes.
    eprintln!("xtask: cargo-nextest not found; installing it (once per machine)");
    sys::cargo(["install", "--locked", "--debug", "cargo-nextest"])
}

fn has_nextest() -> bool {
    Command::new("cargo")
        .args(["nextest", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
