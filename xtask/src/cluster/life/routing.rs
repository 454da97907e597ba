//! The routing life test: the session options of issue 16 on a real cluster. node1's session
//! has a TCP MD5 password its agent reads from a Secret and graceful restart (the default);
//! node2's runs BFD. What each is for is then made to happen: node1's BIRD is killed under
//! traffic (graceful restart: the router keeps forwarding to the node while its BIRD comes
//! back), node2's BIRD is frozen (BFD: the router gives up on the node within a fraction of a
//! second, not after the hold time), and the agent's access to Secrets is exactly the one
//! Secret.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{DEMO_NS, pods};
use crate::cluster::deploy::PASSWORD_SECRET;
use crate::cluster::proc::Place;
use crate::cluster::{FLOCK_SERVICE_ACCOUNT, NODES, Node, ROUTER, site};
use crate::sys;

/// The pid of `n`'s BIRD (flock's DaemonSet sidecar, in the node's network namespace).
fn bird_pid(n: &Node) -> Result<u32> {
    let out = sys::output(Command::new("ip").args(["netns", "pids", &n.ns()]))?;
    out.split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "bird")
        })
        .with_context(|| format!("no BIRD runs in {}", n.ns()))
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) -> Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
        .with_context(|| format!("send {sig} to {pid}"))
}

/// The router's session with `n`: (state, info).
fn session(n: &Node) -> (String, String) {
    site::router_sessions()
        .into_iter()
        .find(|(name, _, _)| name == n.name)
        .map(|(_, state, info)| (state, info))
        .unwrap_or_else(|| ("absent".into(), String::new()))
}

fn established(n: &Node) -> bool {
    session(n).1.starts_with("Established")
}

/// Pings `addr` from the router every 50 ms for `secs` seconds, in the background.
fn ping_from_router(addr: &str, secs: u64) -> Result<std::process::Child> {
    Place::Net(ROUTER.to_owned())
        .command("ping")
        .args(["-q", "-i", "0.05", "-w", &secs.to_string(), addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn ping in the router")
}

/// (sent, received) of a finished ping.
fn ping_result(child: std::process::Child) -> Result<(u64, u64)> {
    let out = child.wait_with_output().context("wait for ping")?;
    let text = String::from_utf8_lossy(&out.stdout);
    super::ping_counts(&text).with_context(|| format!("no ping statistics: {text:?}"))
}

/// Polls `done` every 10 ms for at most `limit`; returns how long it took.
fn time_until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if done() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

pub(super) fn routing(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let (gr_node, bfd_node) = match (
        NODES.iter().find(|n| n.password && !n.bfd),
        NODES.iter().find(|n| n.bfd),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => bail!("the cluster needs a node with a password and graceful restart, and one with BFD"),
    };
    for n in &NODES {
        if sys::wait_for(Duration::from_secs(30), || established(n)).is_err() {
            bail!("the router's session with {} is not Established: {:?}", n.name, session(n));
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
        ("watch secrets".to_owned(), can_i(&["watch", "secrets"]), "no"),
    ];
    for (what, got, want) in &rbac {
        if got != want {
            failures.push(format!("can the agent {what}? {got}, want {want}"));
        }
    }

    // Graceful restart: node1's BIRD killed while the router pings a pod of node1.
    let target = pods(DEMO_NS, "app=anycast")?
        .into_iter()
        .find(|p| p.node == gr_node.name)
        .context("no anycast pod on the graceful-restart node")?;
    let mut pingers = Vec::new();
    for addr in &target.ips {
        pingers.push((addr.clone(), ping_from_router(addr, 20)?));
    }
    std::thread::sleep(Duration::from_secs(2));
    let old = bird_pid(gr_node)?;
    signal(old, nix::sys::signal::Signal::SIGKILL)?;
    let killed = Instant::now();
    let mut during = String::new();
    let down = time_until(Duration::from_secs(10), || {
        let (state, info) = session(gr_node);
        during = format!("{state} {info}");
        !info.starts_with("Established")
    });
    let routes_kept = site::router_paths(gr_node.cidr6) > 0;
    let back = time_until(Duration::from_secs(60), || {
        bird_pid(gr_node).is_ok_and(|p| p != old) && established(gr_node)
    });
    let back_after = killed.elapsed();
    let mut gr_rows = Vec::new();
    for (addr, child) in pingers {
        let (sent, got) = ping_result(child)?;
        let lost = sent.saturating_sub(got);
        if lost > 0 {
            failures.push(format!(
                "graceful restart: {lost} of {sent} pings from the router to {addr} lost while {}'s BIRD restarted",
                gr_node.name
            ));
        }
        gr_rows.push(vec![
            format!("router -> {} {addr}", target.name),
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
    signal(frozen, nix::sys::signal::Signal::SIGSTOP)?;
    let bfd_down = time_until(Duration::from_secs(10), || {
        site::router_paths(bfd_node.cidr6) == 0
    });
    let bfd_session = session(bfd_node);
    signal(frozen, nix::sys::signal::Signal::SIGCONT)?;
    let bfd_back = time_until(Duration::from_secs(60), || {
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
        "{}'s BIRD killed (-9) under ping every 50 ms: session down after {}, {} kept at the router: {}, BIRD back and Established after {:.1} s",
        gr_node.name,
        fmt(down),
        gr_node.cidr6,
        if routes_kept { "yes" } else { "NO" },
        back_after.as_secs_f64()
    );
    sys::table(out, &["pings", "sent", "lost"], &gr_rows);
    out.push('\n');
    let _ = writeln!(
        out,
        "{}'s BIRD frozen (SIGSTOP): the router withdrew {} after {} (BFD; hold time 6 s), back {} after the thaw",
        bfd_node.name,
        bfd_node.cidr6,
        fmt(bfd_down),
        fmt(bfd_back)
    );
    out.push('\n');
    Ok(failures)
}
