//! The lab's checks, each printed as a table: BGP sessions, the router's routes, the ping
//! matrix, anycast from the router and an agent restart that nothing may notice.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::sys;

use super::bringup::{PodUp, in_ns, spawn_agent};
use super::topology::{
    ANYCAST4, ANYCAST6, NODES, ROUTER, ROUTER_LO4, ROUTER_LO6, node_dir, node_ns,
};
use super::{LAB_DIR, NS_PREFIX};

/// How long sessions, routes and pings may take to converge.
const CONVERGE: Duration = Duration::from_secs(30);

fn birdc(ns: &str, ctl: &Path, args: &[&str]) -> Result<String> {
    let ctl = ctl.to_string_lossy();
    let mut all = vec!["birdc", "-s", &ctl];
    all.extend_from_slice(args);
    in_ns(ns, &all)
}

fn router_ctl() -> PathBuf {
    Path::new(LAB_DIR).join("router/bird.ctl")
}

/// The BGP sessions of `birdc show protocols` (read by flock-bird's parser): (name, state,
/// info). None when birdc fails or prints no protocol table.
fn bgp_sessions(ns: &str, ctl: &Path) -> Vec<(String, String, String)> {
    let text = birdc(ns, ctl, &["show", "protocols"]).unwrap_or_default();
    flock_bird::parse_show_protocols(&text)
        .unwrap_or_default()
        .into_iter()
        .filter(|row| row.is_bgp())
        .map(|row| (row.name, row.state, row.info))
        .collect()
}

fn route_paths(prefix: &str) -> usize {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    in_ns(ROUTER, &["ip", family, "route", "show", prefix])
        .map(|out| out.lines().filter(|l| l.contains("nexthop")).count())
        .unwrap_or(0)
}

/// Waits until every session is Established, the anycast addresses have two paths at the
/// router and each node has the other's pod prefixes; records what did not happen.
pub(super) fn wait_converged(failures: &mut Vec<String>) {
    let all_established = || {
        let mut sessions = bgp_sessions(ROUTER, &router_ctl());
        for node in &NODES {
            sessions.extend(bgp_sessions(
                &node_ns(node),
                &node_dir(node).join("run/bird.ctl"),
            ));
        }
        sessions.len() == 2 * NODES.len()
            && sessions.iter().all(|(_, _, info)| info == "Established")
    };
    if sys::wait_for(CONVERGE, all_established).is_err() {
        failures.push("BGP sessions not all Established".into());
    }
    if sys::wait_for(CONVERGE, || {
        route_paths(&format!("{ANYCAST6}/128")) == 2 && route_paths(&format!("{ANYCAST4}/32")) == 2
    })
    .is_err()
    {
        failures.push("the anycast addresses do not have two next hops at the router".into());
    }
    for (i, node) in NODES.iter().enumerate() {
        let other = &NODES[1 - i];
        let ns = node_ns(node);
        let learned = || {
            [other.cidr6, other.cidr4].iter().all(|cidr| {
                let family = if cidr.contains(':') { "-6" } else { "-4" };
                in_ns(&ns, &["ip", family, "route", "show", cidr])
                    .map(|o| o.contains("proto bird"))
                    .unwrap_or(false)
            })
        };
        if sys::wait_for(CONVERGE, learned).is_err() {
            failures.push(format!(
                "{} did not learn {}'s pod prefixes",
                node.name, other.name
            ));
        }
    }
}

pub(super) fn report_pods(out: &mut String, pods: &[PodUp]) {
    out.push_str("PODS\n");
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            vec![
                p.name.to_owned(),
                p.node.to_owned(),
                p.ipv6.clone(),
                p.ipv4.clone(),
                p.note.clone(),
            ]
        })
        .collect();
    sys::table(out, &["pod", "node", "ipv6", "ipv4", "annotations"], &rows);
}

pub(super) fn report_sessions(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    out.push_str("BGP SESSIONS (birdc show protocols)\n");
    let mut rows = Vec::new();
    let mut speakers = vec![(
        ROUTER.trim_start_matches(NS_PREFIX).to_owned(),
        ROUTER.to_owned(),
        router_ctl(),
    )];
    for node in &NODES {
        speakers.push((
            node.name.to_owned(),
            node_ns(node),
            node_dir(node).join("run/bird.ctl"),
        ));
    }
    for (who, ns, ctl) in &speakers {
        for (name, state, info) in bgp_sessions(ns, ctl) {
            if info != "Established" {
                failures.push(format!("{who}: session {name} is {info}"));
            }
            rows.push(vec![who.clone(), name, state, info]);
        }
    }
    sys::table(out, &["speaker", "protocol", "state", "info"], &rows);
    Ok(())
}

pub(super) fn report_router_routes(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    out.push_str("ROUTER ROUTES (ip route, learned over BGP)\n");
    for family in ["-6", "-4"] {
        let routes = in_ns(ROUTER, &["ip", family, "route", "show", "proto", "bird"])?;
        for line in routes.lines() {
            let _ = writeln!(out, "  {}", line.trim_end().replace('\t', "    "));
        }
    }
    out.push('\n');
    // The unnumbered session carries both families: the node's CIDRs with its link-local
    // address as next hop, IPv4 included.
    for node in NODES.iter().filter(|n| n.unnumbered) {
        for cidr in [node.cidr6, node.cidr4] {
            let family = if cidr.contains(':') { "-6" } else { "-4" };
            let route = in_ns(ROUTER, &["ip", family, "route", "show", cidr])?;
            let via = format!("{} dev {}", node.node_addr, node.router_if);
            if !route.contains(&via) {
                failures.push(format!(
                    "{cidr} of {} (unnumbered) is not routed via {via}: {route:?}",
                    node.name
                ));
            }
        }
    }
    for anycast in [format!("{ANYCAST6}/128"), format!("{ANYCAST4}/32")] {
        let paths = route_paths(&anycast);
        if paths != 2 {
            failures.push(format!(
                "anycast {anycast} has {paths} next hops at the router, not 2"
            ));
        }
    }
    Ok(())
}

/// Every pod pings every other pod's IPv6 and IPv4 address (3 echo requests each, all in
/// parallel); a cell is `v6/v4` with `ok` for no loss.
pub(super) fn report_pings(out: &mut String, pods: &[PodUp], failures: &mut Vec<String>) {
    let results: Vec<Vec<(bool, bool)>> = std::thread::scope(|s| {
        let handles: Vec<Vec<_>> = pods
            .iter()
            .map(|src| {
                pods.iter()
                    .map(|dst| {
                        let same = std::ptr::eq(src, dst);
                        let ping = move |addr: &str| {
                            same || Command::new("ip")
                                .args([
                                    "netns", "exec", &src.ns, "ping", "-q", "-c", "3", "-i", "0.2",
                                    "-W", "2", addr,
                                ])
                                .stderr(Stdio::null())
                                .output()
                                .map(|o| {
                                    String::from_utf8_lossy(&o.stdout).contains(" 0% packet loss")
                                })
                                .unwrap_or(false)
                        };
                        let (v6, v4) = (dst.ipv6.clone(), dst.ipv4.clone());
                        s.spawn(move || (ping(&v6), ping(&v4)))
                    })
                    .collect()
            })
            .collect();
        handles
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|h| h.join().unwrap_or((false, false)))
                    .collect()
            })
            .collect()
    });
    out.push_str("PING MATRIX (row pings column; IPv6/IPv4, 3 echoes each, ok = no loss)\n");
    let mut header = vec!["from \\ to".to_owned()];
    header.extend(pods.iter().map(|p| format!("{} ({})", p.name, p.node)));
    let mut rows = Vec::new();
    for (src, row) in pods.iter().zip(&results) {
        let mut cells = vec![format!("{} ({})", src.name, src.node)];
        for (dst, (v6, v4)) in pods.iter().zip(row) {
            if std::ptr::eq(src, dst) {
                cells.push("-".into());
                continue;
            }
            let mark = |ok: &bool| if *ok { "ok" } else { "LOSS" };
            cells.push(format!("{}/{}", mark(v6), mark(v4)));
            if !v6 || !v4 {
                failures.push(format!(
                    "{} -> {}: IPv6 {}, IPv4 {}",
                    src.name,
                    dst.name,
                    mark(v6),
                    mark(v4)
                ));
            }
        }
        rows.push(cells);
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    sys::table(out, &header_refs, &rows);
}

/// The router pings the anycast addresses from its own address, and `ip route get` shows
/// the path each flow takes (the kernel hashes flows over the two next hops).
pub(super) fn report_anycast(out: &mut String, failures: &mut Vec<String>) {
    out.push_str("ANYCAST FROM THE ROUTER (3 echoes each, ok = no loss)\n");
    let mut rows = Vec::new();
    for (addr, src) in [(ANYCAST6, ROUTER_LO6), (ANYCAST4, ROUTER_LO4)] {
        let ok = in_ns(
            ROUTER,
            &[
                "ping", "-q", "-c", "3", "-i", "0.2", "-W", "2", "-I", src, addr,
            ],
        )
        .map(|o| o.contains(" 0% packet loss"))
        .unwrap_or(false);
        if !ok {
            failures.push(format!("router -> anycast {addr}: loss"));
        }
        rows.push(vec![
            format!("{src} -> {addr}"),
            (if ok { "ok" } else { "LOSS" }).to_owned(),
            format!(
                "{} next hops",
                route_paths(&format!(
                    "{addr}/{}",
                    if addr.contains(':') { 128 } else { 32 }
                ))
            ),
        ]);
    }
    sys::table(out, &["flow", "ping", "route"], &rows);
}

/// The agent on node1 stops (SIGTERM) and starts again while a pod on node2 pings a pod on
/// node1 every 20 ms: nothing of the data plane or of BGP may notice (no ping lost, BIRD the
/// same process with the same configuration, the router's session Established).
pub(super) fn report_agent_restart(
    out: &mut String,
    pods: &[PodUp],
    bins: &Path,
    failures: &mut Vec<String>,
) -> Result<()> {
    let node = &NODES[0];
    let ns = node_ns(node);
    let dir = node_dir(node);
    let (Some(src), Some(dst)) = (
        pods.iter().find(|p| p.node != node.name),
        pods.iter().find(|p| p.node == node.name),
    ) else {
        bail!("the lab has no pod on each node");
    };
    let conf_before = std::fs::read(dir.join("bird/bird.conf")).context("read bird.conf")?;
    let bird_pid = std::fs::read_to_string(dir.join("run/bird.pid"))
        .context("read bird.pid")?
        .trim()
        .parse::<u32>()
        .context("bird.pid")?;
    let agents: Vec<u32> = sys::output(Command::new("ip").args(["netns", "pids", &ns]))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("flock-agent"))
        })
        .collect();
    if agents.is_empty() {
        bail!("no flock-agent runs in {ns}");
    }
    let count = 150;
    let ping = Command::new("ip")
        .args([
            "netns", "exec", &src.ns, "ping", "-n", "-q", "-i", "0.02", "-W", "1",
        ])
        .args(["-c", &count.to_string(), &dst.ipv6])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn ping")?;
    std::thread::sleep(Duration::from_millis(300));
    let stopped = Instant::now();
    for pid in &agents {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    sys::wait_for(Duration::from_secs(10), || {
        agents.iter().all(|pid| !flock_testkit::is_alive(*pid))
    })
    .context("the agent did not stop on SIGTERM")?;
    std::thread::sleep(Duration::from_millis(500));
    spawn_agent(node, bins)?;
    let down_for = stopped.elapsed();
    let output = ping.wait_with_output().context("wait for ping")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let received = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    let lost = count - received.min(count);
    // The restarted agent renders again: give its debounced writer a moment.
    std::thread::sleep(Duration::from_secs(1));
    let conf_same = std::fs::read(dir.join("bird/bird.conf")).ok().as_ref() == Some(&conf_before);
    let bird_alive = flock_testkit::is_alive(bird_pid);
    let session = bgp_sessions(ROUTER, &router_ctl())
        .into_iter()
        .find(|(name, _, _)| name == node.name)
        .map(|(_, _, info)| info)
        .unwrap_or_default();
    out.push_str("AGENT RESTART (node1's agent stopped with SIGTERM and started again)\n");
    let rows = vec![
        vec![
            format!("{} -> {} every 20 ms", src.name, dst.name),
            format!("{lost} lost of {count}"),
        ],
        vec![
            "agent down for".into(),
            format!("{} ms", down_for.as_millis()),
        ],
        vec![
            "BIRD".into(),
            if bird_alive {
                format!("same process ({bird_pid})")
            } else {
                "gone".into()
            },
        ],
        vec![
            "bird.conf".into(),
            if conf_same { "unchanged" } else { "changed" }.into(),
        ],
        vec!["router's session".into(), session.clone()],
    ];
    sys::table(out, &["check", "result"], &rows);
    if lost > 0 {
        failures.push(format!("agent restart: {lost} of {count} pings lost"));
    }
    if !bird_alive || !conf_same || session != "Established" {
        failures.push(format!(
            "agent restart touched BGP: BIRD alive {bird_alive}, bird.conf unchanged {conf_same}, session {session:?}"
        ));
    }
    Ok(())
}
