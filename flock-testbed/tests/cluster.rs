//! The cluster's scenarios, each a cargo test against one shared cluster
//! ([`flock_testbed::scenario`]): the life tests, Kubernetes' own e2e suites and the uninstall.
//! Each prints its tables (the figures) and fails with what missed its goal.
//!
//! ```sh
//! cargo nextest run -p flock-testbed --features cluster -E 'test(life_upgrade)'
//! cargo test -p flock-testbed --features cluster -- --nocapture e2e_
//! cargo xtask cluster down      # the scenarios leave the cluster up for the next
//! ```
#![cfg(feature = "cluster")]

use flock_testbed::cluster::{e2e, life};
use flock_testbed::scenario;

/// Runs the life test `name` on the shared cluster, prints its tables, fails with its misses.
fn life(name: &str) {
    let _cluster = scenario::cluster().expect("the cluster");
    let mut out = String::new();
    let failures = life::tests(&[name], &mut out);
    print!("{out}");
    assert!(failures.is_empty(), "{name}:\n  {}", failures.join("\n  "));
}

/// Runs `cargo xtask cluster e2e ARGS` on the shared cluster; fails unless every spec in focus
/// passed or was excluded with its reason.
fn e2e(args: &[&str]) {
    let _cluster = scenario::cluster().expect("the cluster");
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    if let Err(e) = e2e::run(&args) {
        panic!("cargo xtask cluster e2e {}: {e:#}", args.join(" "));
    }
}

#[test]
fn life_upgrade() {
    life("upgrade");
}

#[test]
fn life_ready() {
    life("ready");
}

#[test]
fn life_routing() {
    life("routing");
}

#[test]
fn life_services() {
    life("services");
}

#[test]
fn life_reboot() {
    life("reboot");
}

#[test]
fn life_join() {
    life("join");
}

#[test]
fn life_leave() {
    life("leave");
}

#[test]
fn life_startup() {
    life("startup");
}

#[test]
fn life_policy() {
    life("policy");
}

#[test]
fn life_operate() {
    life("operate");
}

#[test]
fn life_multus() {
    life("multus");
}

#[test]
fn life_security() {
    life("security");
}

#[test]
fn e2e_network() {
    e2e(&["--suite", "network", "--pods", "ipv6"]);
}

#[test]
fn e2e_networkpolicy() {
    // Most of a NetworkPolicy spec is waiting out connections that must fail: more processes.
    e2e(&[
        "--suite",
        "networkpolicy",
        "--pods",
        "ipv6",
        "--parallel",
        "6",
    ]);
}

/// Removes flock from the cluster; a scenario after it gets a new cluster. Last by name, so
/// that a whole run needs one cluster.
#[test]
fn z_uninstall() {
    let cluster = scenario::cluster().expect("the cluster");
    cluster.spoil();
    let mut out = String::new();
    let failures = life::uninstall(&mut out, &flock_testbed::lab::debug_bins()).expect("uninstall");
    print!("{out}");
    assert!(
        failures.is_empty(),
        "uninstall:\n  {}",
        failures.join("\n  ")
    );
}
