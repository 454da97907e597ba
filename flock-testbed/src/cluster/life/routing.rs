//! The routing life test: the session options of issue 16 on a real cluster. node1's session
//! has a TCP MD5 password its agent reads from a Secret and graceful restart (the default);
//! node2's runs BFD. What each is for is then made to happen: node1's BIRD is killed under
//! traffic (graceful restart: the router keeps forwarding to the node while its BIRD comes
//! back), node2's BIRD is frozen (BFD: the router gives up on the node within a fraction of a
//! second, not after the hold time), and the agent's access to Secrets is exactly the one
//! Secret.

use std::fmt::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{DEMO_NS, pods};
use crate::cluster::deploy::PASSWORD_SECRET;
use crate::cluster::{FLOCK_SERVICE_ACCOUNT, NODES, Node, site};
use crate::sys;

/// The pid of `n`'s BIRD (flock's DaemonSet sidecar, in the node's network namespace).
fn bird_pid(n: &Node) -> Result<u32> {
    super::pid_in(n, "bird")
}

/// The router's session with `n`: (state, info).
fn session(n: &Node) -> (String, String) {
    site::router_sessions()
        .into_iter()
        .find(|s| s.name == n.name)
        .map(|s| (s.state, s.info))
        .unwrap_or_else(|| ("absent".into(), String::new()))
}

fn established(n: &Node) -> bool {
    session(n).1.starts_with("Established")
}

/// Pings `addr` from pod `from` (demo namespace) every 20 ms for `secs` seconds, in the
/// background.
fn ping_from_pod(from: &str, addr: &str, secs: u64) -> Result<std::process::Child> {
    crate::cluster::kubectl_command()
        .args([
            "-n", DEMO_NS, "exec", from, "--", "ping", "-q", "-i", "0.02", "-w",
        ])
        .arg(secs.to_string())
        .arg(addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn ping in a pod")
}

/// (sent, received) of a finished ping.
fn ping_result(child: std::process::Child) -> Result<(u64, u64)> {
    let out = child.wait_with_output().context("wait for ping")?;
    let text = String::from_utf8_lossy(&out.stdout);
    super::upgrade::ping_counts(&text).with_context(|| format!("no ping statistics: {text:?}"))
}

pub(super) fn routing(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let (gr_node, bfd_node) = match (
        NODES.iter().find(|n| n.password && !n.bfd),
        NODES.iter().find(|n| n.bfd),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            bail!("the cluster needs a node with a password and graceful restart, and one with BFD")
        }
    };
    for n in &NODES {
        if sys::wait_for(Duration::from_secs(30), || established(n)).is_err() {
            bail!(
                "the router's session with {} is not Established: {:?}",
                n.name,
                session(n)
            );
        }
    }

    // The agent may get its one Secret and nothing else of Secrets.
    let can_i = |args: &[&str]| -> String {
        // `can-i` prints yes or no, and exits 1 when the answer is no.
        crate::cluster::kubectl_command()
            .args(["auth", "can-i"])
            .args(args)
            .args(["-n", "kube-system", "--as", FLOCK_SERVICE_ACCOUNT])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|e| format!("? ({e})"))
    };
    let secret = format!("secrets/{PASSWORD_SECRET}");
    let rbac = [
        (format!("get {secret}"), can_i(&["get", &secret]), "yes"),
        (
            "get secrets/another-secret".to_owned(),
            can_i(&["get", "secrets/another-secret"]),
            "no",
        ),
        ("list secrets".to_owned(), can_i(&["list", "secrets"]), "no"),
        (
            "watch secrets".to_owned(),
            can_i(&["watch", "secrets"]),
            "no",
        ),
    ];
    for (what, got, want) in &rbac {
        if got != want {
            failures.push(format!("can the agent {what}? {got}, want {want}"));
        }
    }

    // Graceful restart: node1's BIRD killed while a pod on the other node pings a pod of
    // node1 every 20 ms.
    let anycast = pods(DEMO_NS, "app=anycast")?;
    let target = anycast
        .iter()
        .find(|p| p.node == gr_node.name)
        .context("no anycast pod on the graceful-restart node")?;
    let source = anycast
        .iter()
        .find(|p| p.node != gr_node.name)
        .context("no anycast pod on another node")?;
    let mut pingers = Vec::new();
    for addr in &target.ips {
        pingers.push((addr.clone(), ping_from_pod(&source.name, addr, 20)?));
    }
    std::thread::sleep(Duration::from_secs(2));
    let old = bird_pid(gr_node)?;
    super::signal(old, nix::sys::signal::Signal::SIGKILL)?;
    let killed = Instant::now();
    let mut during = String::new();
    let down = sys::time_until(Duration::from_secs(10), || {
        let (state, info) = session(gr_node);
        during = format!("{state} {info}");
        !info.starts_with("Established")
    });
    let routes_kept = site::router_paths(gr_node.cidr6) > 0;
    let back = sys::time_until(Duration::from_secs(60), || {
        bird_pid(gr_node).is_ok_and(|p| p != old) && established(gr_node)
    });
    let back_after = killed.elapsed();
    let mut gr_rows = Vec::new();
    for (addr, child) in pingers {
        let (sent, got) = ping_result(child)?;
        let lost = sent.saturating_sub(got);
        if lost > 0 {
            failures.push(format!(
                "graceful restart: {lost} of {sent} pings from {} to {addr} lost while {}'s BIRD restarted",
                source.name,
                gr_node.name
            ));
        }
        gr_rows.push(vec![
            format!(
                "{} ({}) -> {} {addr}",
                source.name, source.node, target.name
            ),
            sent.to_string(),
            lost.to_string(),
        ]);
    }
    if back.is_none() {
        failures.push(format!(
            "{}'s BIRD did not come back Established within 60 s",
            gr_node.name
        ));
    }
    if !routes_kept {
        failures.push(format!(
            "the router dropped {} while {}'s BIRD restarted (session {during})",
            gr_node.cidr6, gr_node.name
        ));
    }

    // BFD: node2's BIRD frozen; the router must give up on node2 within a second.
    let frozen = bird_pid(bfd_node)?;
    super::signal(frozen, nix::sys::signal::Signal::SIGSTOP)?;
    let bfd_down = sys::time_until(Duration::from_secs(10), || {
        site::router_paths(bfd_node.cidr6) == 0
    });
    let bfd_session = session(bfd_node);
    super::signal(frozen, nix::sys::signal::Signal::SIGCONT)?;
    let bfd_back = sys::time_until(Duration::from_secs(60), || {
        established(bfd_node) && site::router_paths(bfd_node.cidr6) > 0
    });
    match bfd_down {
        Some(d) if d < Duration::from_secs(1) => {}
        other => failures.push(format!(
            "BFD: the router still routed {} to the frozen {} after {:?} (session {:?})",
            bfd_node.cidr6, bfd_node.name, other, bfd_session
        )),
    }
    if bfd_back.is_none() {
        failures.push(format!(
            "{}'s session did not come back within 60 s of its BIRD thawing",
            bfd_node.name
        ));
    }

    // Without BFD the router notices a frozen BIRD at the hold time only (and, graceful
    // restart being on, keeps the node's routes while it waits): the same freeze on node1.
    std::thread::sleep(Duration::from_secs(1));
    let frozen = bird_pid(gr_node)?;
    super::signal(frozen, nix::sys::signal::Signal::SIGSTOP)?;
    let hold_down = sys::time_until(Duration::from_secs(20), || !established(gr_node));
    let hold_kept = site::router_paths(gr_node.cidr6) > 0;
    super::signal(frozen, nix::sys::signal::Signal::SIGCONT)?;
    let hold_back = sys::time_until(Duration::from_secs(60), || established(gr_node));
    if hold_back.is_none() {
        failures.push(format!(
            "{}'s session did not come back within 60 s of its BIRD thawing",
            gr_node.name
        ));
    }

    let fmt = |d: Option<Duration>| {
        d.map_or("never (limit)".to_owned(), |d| {
            format!("{:.0} ms", d.as_secs_f64() * 1000.0)
        })
    };
    let _ = writeln!(
        out,
        "ROUTING (issue 16 on the cluster: {} with a password from Secret {PASSWORD_SECRET} and graceful restart, {} with BFD)",
        gr_node.name, bfd_node.name
    );
    sys::table(
        out,
        &["may flock's agent …", "answer", "want"],
        &rbac
            .iter()
            .map(|(w, g, want)| vec![w.clone(), g.clone(), (*want).to_owned()])
            .collect::<Vec<_>>(),
    );
    out.push('\n');
    let _ = writeln!(
        out,
        "{}'s BIRD killed (-9) under ping: session down after {}, {} kept at the router: {}, BIRD back and Established after {:.1} s",
        gr_node.name,
        fmt(down),
        gr_node.cidr6,
        if routes_kept { "yes" } else { "NO" },
        back_after.as_secs_f64()
    );
    sys::table(out, &["pings every 20 ms", "sent", "lost"], &gr_rows);
    out.push('\n');
    let _ = writeln!(
        out,
        "A BIRD frozen (SIGSTOP), as a node that hangs: when the router gives up on the node"
    );
    sys::table(
        out,
        &[
            "node",
            "session",
            "router notices after",
            "the node's routes at the router",
            "Established again after the thaw",
        ],
        &[
            vec![
                bfd_node.name.to_owned(),
                "BFD 150 ms x 4, hold 6 s".to_owned(),
                fmt(bfd_down),
                "withdrawn".to_owned(),
                fmt(bfd_back),
            ],
            vec![
                gr_node.name.to_owned(),
                "no BFD, hold 6 s, graceful restart".to_owned(),
                fmt(hold_down),
                if hold_kept {
                    "kept (stale, graceful restart)"
                } else {
                    "withdrawn"
                }
                .to_owned(),
                fmt(hold_back),
            ],
        ],
    );
    out.push('\n');
    Ok(failures)
}
