//! The lab's checks, each printed as a table: BGP sessions, the router's routes, the ping
//! matrix, anycast from the router and an agent restart that nothing may notice.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::sys;

use super::NS_PREFIX;
use super::bringup::{PodUp, in_ns, restart_node_bird, spawn_agent, write_node_yaml};
use super::topology::{
    ANYCAST4, ANYCAST6, NODES, Node, ROUTER, ROUTER_LO4, ROUTER_LO6, node_dir, node_ns, router_dir,
};
use crate::router::{self, Kind};

/// How long sessions, routes and pings may take to converge.
const CONVERGE: Duration = Duration::from_secs(30);

fn birdc(ns: &str, ctl: &Path, args: &[&str]) -> Result<String> {
    let ctl = ctl.to_string_lossy();
    let mut all = vec!["birdc", "-s", &ctl];
    all.extend_from_slice(args);
    in_ns(ns, &all)
}

/// What the router shows (`birdc …`, `vtysh -c …`); empty when it does not answer.
fn router_show(kind: Kind, what: &str) -> String {
    let argv = kind.show_command(&router_dir(), what);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    in_ns(ROUTER, &argv).unwrap_or_default()
}

/// The router's BGP sessions, each named by its node.
fn router_sessions(kind: Kind) -> Vec<router::Session> {
    router::parse_sessions(kind, &router_show(kind, kind.sessions_query()))
}

/// The router's session with `node`: its BGP state, or `missing`.
fn router_session(kind: Kind, node: &Node) -> String {
    router_sessions(kind)
        .into_iter()
        .find(|s| s.name == node.name)
        .map_or_else(|| "missing".to_owned(), |s| s.info)
}

/// The communities on the router's best path to `prefix`.
fn router_communities(kind: Kind, prefix: &str) -> Vec<String> {
    router::parse_communities(kind, &router_show(kind, &kind.route_query(prefix)))
}

/// The router's kernel route to `prefix` (empty without one).
fn router_route(prefix: &str) -> String {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    in_ns(ROUTER, &["ip", family, "route", "show", prefix]).unwrap_or_default()
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
    router_route(prefix)
        .lines()
        .filter(|l| l.contains("nexthop"))
        .count()
}

/// Waits until every session is Established, the anycast addresses have two paths at the
/// router and each node has the other's pod prefixes; records what did not happen.
pub(super) fn wait_converged(kind: Kind, failures: &mut Vec<String>) {
    let all_established = || {
        let router = router_sessions(kind);
        let mut sessions = Vec::new();
        for node in &NODES {
            sessions.extend(bgp_sessions(
                &node_ns(node),
                &node_dir(node).join("run/bird.ctl"),
            ));
        }
        router.len() == NODES.len()
            && router.iter().all(router::Session::established)
            && sessions.len() == NODES.len()
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

pub(super) fn report_sessions(
    kind: Kind,
    out: &mut String,
    failures: &mut Vec<String>,
) -> Result<()> {
    let query = kind.sessions_query();
    let _ = writeln!(
        out,
        "BGP SESSIONS (router, {kind}: `{query}`; nodes: birdc show protocols)"
    );
    let mut rows = Vec::new();
    let who = ROUTER.trim_start_matches(NS_PREFIX);
    for session in router_sessions(kind) {
        if !session.established() {
            failures.push(format!(
                "{who}: session {} is {}",
                session.name, session.info
            ));
        }
        rows.push(vec![
            who.to_owned(),
            session.name,
            session.state,
            session.info,
        ]);
    }
    if rows.len() != NODES.len() {
        failures.push(format!(
            "the router has {} sessions, not {}",
            rows.len(),
            NODES.len()
        ));
    }
    let mut speakers = Vec::new();
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

pub(super) fn report_router_routes(
    kind: Kind,
    out: &mut String,
    failures: &mut Vec<String>,
) -> Result<()> {
    out.push_str("ROUTER ROUTES (ip route, learned over BGP)\n");
    for family in ["-6", "-4"] {
        let routes = in_ns(
            ROUTER,
            &["ip", family, "route", "show", "proto", kind.kernel_proto()],
        )?;
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

/// Stops `node`'s agent with SIGTERM and waits until it is gone.
fn stop_agent(node: &Node) -> Result<()> {
    let ns = node_ns(node);
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
    for pid in &agents {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    sys::wait_for(Duration::from_secs(10), || {
        agents.iter().all(|pid| !flock_testkit::is_alive(*pid))
    })
    .context("the agent did not stop on SIGTERM")
}

/// The PID of `node`'s BIRD.
fn bird_pid(node: &Node) -> Result<u32> {
    let path = node_dir(node).join("run/bird.pid");
    std::fs::read_to_string(&path)
        .with_context(|| format!("read {}", path.display()))?
        .trim()
        .parse::<u32>()
        .with_context(|| format!("{}", path.display()))
}

/// `ping -i 0.02 -c COUNT` from `src`'s namespace to `dst`, started now; [`lost`] reads it.
fn start_ping(src: &PodUp, dst: &str, count: u32) -> Result<std::process::Child> {
    Command::new("ip")
        .args([
            "netns", "exec", &src.ns, "ping", "-n", "-q", "-i", "0.02", "-W", "1",
        ])
        .args(["-c", &count.to_string(), dst])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn ping")
}

/// How many of `count` echoes [`start_ping`]'s ping lost.
fn lost(ping: std::process::Child, count: u32) -> Result<u32> {
    let output = ping.wait_with_output().context("wait for ping")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let received = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    Ok(count - received.min(count))
}

/// A pod on `node` and one on the other node: (the other's, `node`'s).
fn pod_pair<'p>(pods: &'p [PodUp], node: &Node) -> Result<(&'p PodUp, &'p PodUp)> {
    match (
        pods.iter().find(|p| p.node != node.name),
        pods.iter().find(|p| p.node == node.name),
    ) {
        (Some(other), Some(on)) => Ok((other, on)),
        _ => bail!("the lab has no pod on each node"),
    }
}

/// The agent on node1 stops (SIGTERM) and starts again while a pod on node2 pings a pod on
/// node1 every 20 ms: nothing of the data plane or of BGP may notice (no ping lost, BIRD the
/// same process with the same configuration, the router's session Established).
pub(super) fn report_agent_restart(
    kind: Kind,
    out: &mut String,
    pods: &[PodUp],
    bins: &Path,
    failures: &mut Vec<String>,
) -> Result<()> {
    let node = &NODES[0];
    let dir = node_dir(node);
    let (src, dst) = pod_pair(pods, node)?;
    let conf_before = std::fs::read(dir.join("bird/bird.conf")).context("read bird.conf")?;
    let bird_pid = bird_pid(node)?;
    let count = 150;
    let ping = start_ping(src, &dst.ipv6, count)?;
    std::thread::sleep(Duration::from_millis(300));
    let stopped = Instant::now();
    stop_agent(node)?;
    std::thread::sleep(Duration::from_millis(500));
    spawn_agent(node, bins)?;
    let down_for = stopped.elapsed();
    let lost = lost(ping, count)?;
    // The restarted agent renders again: give its debounced writer a moment.
    std::thread::sleep(Duration::from_secs(1));
    let conf_same = std::fs::read(dir.join("bird/bird.conf")).ok().as_ref() == Some(&conf_before);
    let bird_alive = flock_testkit::is_alive(bird_pid);
    let session = router_session(kind, node);
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

/// One row of the BGP options table: the option, the node, what the router shows, and whether
/// that is what the option calls for (a failure otherwise).
fn option_row(
    rows: &mut Vec<Vec<String>>,
    failures: &mut Vec<String>,
    option: &str,
    node: &Node,
    shown: String,
    ok: bool,
) {
    if !ok {
        failures.push(format!(
            "{option} ({}): the router shows {shown}",
            node.name
        ));
    }
    rows.push(vec![
        option.to_owned(),
        node.name.to_owned(),
        shown,
        (if ok { "ok" } else { "FAILED" }).to_owned(),
    ]);
}

/// How long until the router has a BFD session up with every node that asks for one, within
/// `limit`.
fn bfd_up_within(kind: Kind, limit: Duration) -> Option<Duration> {
    let peers = NODES.iter().filter(|n| n.bfd).count();
    sys::time_until(limit, || {
        router::parse_bfd_up(kind, &router_show(kind, kind.bfd_query())) == peers
    })
}

/// Every BGP option of the nodes' NodeConfigs, as the router (BIRD or FRR) sees it: the
/// session, the routes and attributes it learned. Graceful shutdown is set on node1 (its agent
/// restarted on the changed file, as standalone mode takes a change) and taken off again.
pub(super) fn report_bgp_options(
    kind: Kind,
    out: &mut String,
    bins: &Path,
    failures: &mut Vec<String>,
) -> Result<()> {
    let _ = writeln!(out, "BGP OPTIONS AT THE ROUTER ({kind})");
    let mut rows = Vec::new();
    for node in &NODES {
        let session = router_session(kind, node);
        let established = session == "Established";
        let (route6, route4) = (router_route(node.cidr6), router_route(node.cidr4));
        // To the node over its link: BIRD installs the next hop at the node's address, FRR
        // at the node's link-local address (BIRD sends both) when the address is global.
        let dev = format!(" dev {} ", node.router_if);
        let to_node = |route: &str, via: &str| {
            route.lines().count() == 1
                && route.contains(&dev)
                && (route.contains(&format!("{via} {} ", node.node_addr))
                    || route.contains(&format!("{via} fe80:")))
        };
        let hop = |route: &str| {
            route.split_once(" via ").map_or_else(
                || "no route".to_owned(),
                |(_, rest)| format!("via {}", rest.split(" proto").next().unwrap_or(rest).trim()),
            )
        };
        let (session_option, ipv4_option) = if node.unnumbered {
            (
                "unnumbered (interface uplink, fe80::1)",
                "IPv4 over the unnumbered session",
            )
        } else {
            (
                "numbered IPv6 session",
                "IPv4 over IPv6 (extended next hop)",
            )
        };
        option_row(
            &mut rows,
            failures,
            session_option,
            node,
            format!("{session}; {} {}", node.cidr6, hop(&route6)),
            established && to_node(&route6, "via"),
        );
        option_row(
            &mut rows,
            failures,
            ipv4_option,
            node,
            format!("{} {}", node.cidr4, hop(&route4)),
            to_node(&route4, "via inet6"),
        );
        if node.password.is_some() {
            option_row(
                &mut rows,
                failures,
                "TCP MD5 (passwordFile)",
                node,
                format!("{session} with the password"),
                established,
            );
        }
        if node.bfd {
            // BFD comes up after the session, and with FRR's bfdd a few seconds later still
            let took = bfd_up_within(kind, CONVERGE);
            let up = router::parse_bfd_up(kind, &router_show(kind, kind.bfd_query()));
            option_row(
                &mut rows,
                failures,
                "BFD 100 ms x 3",
                node,
                match took {
                    Some(t) => format!("{up} BFD session(s) up (within {} ms)", t.as_millis()),
                    None => format!("{up} BFD session(s) up after {} s", CONVERGE.as_secs()),
                },
                took.is_some(),
            );
        }
        if !node.communities.is_empty() {
            for cidr in [node.cidr6, node.cidr4] {
                let seen = router_communities(kind, cidr);
                option_row(
                    &mut rows,
                    failures,
                    "communities",
                    node,
                    format!("{cidr}: {}", seen.join(" ")),
                    node.communities.iter().all(|c| seen.iter().any(|s| s == c)),
                );
            }
        }
    }
    // Graceful shutdown: node1 drained and back.
    let node = &NODES[0];
    let has_gshut = || {
        router_communities(kind, node.cidr6)
            .iter()
            .any(|c| c == "65535:0")
    };
    write_node_yaml(node, true)?;
    stop_agent(node)?;
    spawn_agent(node, bins)?;
    let marked = sys::time_until(CONVERGE, has_gshut);
    option_row(
        &mut rows,
        failures,
        "graceful shutdown (drain)",
        node,
        marked.map_or_else(
            || "no 65535:0".to_owned(),
            |t| {
                format!(
                    "65535:0 on {} {} ms after the agent restarted",
                    node.cidr6,
                    t.as_millis()
                )
            },
        ),
        marked.is_some(),
    );
    write_node_yaml(node, false)?;
    stop_agent(node)?;
    spawn_agent(node, bins)?;
    let cleared = sys::time_until(CONVERGE, || !has_gshut());
    option_row(
        &mut rows,
        failures,
        "graceful shutdown taken off",
        node,
        if cleared.is_some() {
            "no 65535:0"
        } else {
            "65535:0 stays"
        }
        .to_owned(),
        cleared.is_some(),
    );
    sys::table(out, &["option", "node", "the router shows", "check"], &rows);
    Ok(())
}

/// The faults a router must see through, measured: node1's BIRD frozen (BFD withdraws its
/// routes at the router), node2's BIRD killed and started again with graceful restart (pings
/// from node1 go on), and the same kill on node1, which has no graceful restart (pings lost:
/// the measure can tell).
pub(super) fn report_faults(
    kind: Kind,
    out: &mut String,
    pods: &[PodUp],
    failures: &mut Vec<String>,
) -> Result<()> {
    let _ = writeln!(out, "FAULTS (router: {kind})");
    let mut rows = Vec::new();
    // BFD: SIGSTOP, the BIRD process alive and its TCP session open, but silent.
    let bfd_node = &NODES[0];
    // the measure needs BFD up at the freeze (the agent restarts before may have taken it
    // down a while); else it would time the hold timer
    if bfd_up_within(kind, CONVERGE).is_none() {
        failures.push(format!(
            "BFD: no BFD session up at the router within {} s before the freeze",
            CONVERGE.as_secs()
        ));
    }
    let pid = bird_pid(bfd_node)?;
    sys::output(Command::new("kill").args(["-STOP", &pid.to_string()]))?;
    let withdrawn = sys::time_until(Duration::from_secs(10), || {
        router_route(bfd_node.cidr6).is_empty()
    });
    sys::output(Command::new("kill").args(["-CONT", &pid.to_string()]))?;
    rows.push(vec![
        format!("{}'s BIRD frozen (SIGSTOP), BFD 100 ms x 3", bfd_node.name),
        "its routes withdrawn at the router".into(),
        withdrawn.map_or_else(
            || "not within 10 s".to_owned(),
            |t| format!("{} ms", t.as_millis()),
        ),
    ]);
    match withdrawn {
        Some(t) if t < Duration::from_secs(1) => {}
        other => failures.push(format!(
            "BFD: {}'s routes withdrawn after {other:?}, not within 1 s",
            bfd_node.name
        )),
    }
    // Thawed, the node's BIRD may still speak BFD with the router's old discriminator for a
    // few seconds (BIRD 2.0.12 keeps a session's remote id when it goes down; the router logs
    // "mismatched remote id") until its BGP session goes down once more and comes back with a
    // new BFD session. The next measure starts once BFD and the session have been up for a
    // hold time (6 s) in a row.
    let bfd_peers = NODES.iter().filter(|n| n.bfd).count();
    let up = || {
        let session = router_sessions(kind)
            .into_iter()
            .find(|s| s.name == bfd_node.name)
            .filter(router::Session::established)?;
        (router::parse_bfd_up(kind, &router_show(kind, kind.bfd_query())) == bfd_peers
            && !router_route(bfd_node.cidr6).is_empty())
        .then_some(session.since)
    };
    let thawed = Instant::now();
    let mut bfd_back = None;
    while bfd_back.is_none() && thawed.elapsed() < CONVERGE {
        if let Some(since) = up() {
            let at = thawed.elapsed();
            std::thread::sleep(Duration::from_secs(6));
            if up().as_ref() == Some(&since) {
                bfd_back = Some(at);
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    rows.push(vec![
        format!("{}'s BIRD thawed (SIGCONT)", bfd_node.name),
        "BFD, the session and its routes back at the router (then 6 s stable)".into(),
        bfd_back.map_or_else(
            || format!("not within {} s", CONVERGE.as_secs()),
            |t| format!("{} ms", t.as_millis()),
        ),
    ]);
    if bfd_back.is_none() {
        failures.push(format!(
            "{}'s BFD session did not come back after the freeze",
            bfd_node.name
        ));
    }
    wait_converged(kind, failures);
    // A crash of BIRD (SIGKILL) and a start 1 s later with -R, pings every 20 ms across:
    // node2 offers graceful restart, node1 does not (the measure must tell them apart).
    let gr_node = &NODES[1];
    let age = || {
        std::fs::metadata(kind.started_file(&router_dir()))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or_default()
    };
    if let Some(window) = kind.restart_state_window()
        && age() < window
    {
        // Measured and shown, not judged: the router says it restarts itself.
        let (row, _) = crash_loss(kind, gr_node, pods, failures)?;
        rows.push(vec![
            format!(
                "{} (router {} s old: its restart-state bit set)",
                row[0],
                age().as_secs()
            ),
            row[1].clone(),
            row[2].clone(),
        ]);
        // The crash below brings the session up again on an OPEN without the bit.
        std::thread::sleep(window.saturating_sub(age()) + Duration::from_secs(2));
    }
    let (mut row, with_gr) = crash_loss(kind, gr_node, pods, failures)?;
    if kind.restart_state_window().is_some() {
        row[0] = format!("{} (router {} s old)", row[0], age().as_secs());
    }
    rows.push(row);
    let (row, without) = crash_loss(kind, &NODES[0], pods, failures)?;
    rows.push(row);
    if with_gr > 2 {
        failures.push(format!(
            "graceful restart: {with_gr} pings lost across BIRD's crash"
        ));
    }
    if without <= with_gr {
        failures.push(format!(
            "without graceful restart only {without} pings were lost: the measure tells nothing"
        ));
    }
    sys::table(out, &["fault", "measured", "result"], &rows);
    Ok(())
}

/// Kills `node`'s BIRD (SIGKILL) and starts it again with `-R` 1 s later; then waits until the
/// lab has converged again.
fn kill_bird_and_wait(kind: Kind, node: &Node, failures: &mut Vec<String>) -> Result<()> {
    let pid = bird_pid(node)?;
    sys::output(Command::new("kill").args(["-KILL", &pid.to_string()]))?;
    sys::wait_for(Duration::from_secs(5), || !flock_testkit::is_alive(pid))
        .context("BIRD did not die")?;
    std::thread::sleep(Duration::from_secs(1));
    restart_node_bird(node)?;
    wait_converged(kind, failures);
    Ok(())
}

/// `node`'s BIRD killed and started again ([`kill_bird_and_wait`]) while a pod on the other
/// node pings a pod on `node` every 20 ms: the table row and the pings lost.
fn crash_loss(
    kind: Kind,
    node: &Node,
    pods: &[PodUp],
    failures: &mut Vec<String>,
) -> Result<(Vec<String>, u32)> {
    let (src, dst) = pod_pair(pods, node)?;
    let count = 200;
    let ping = start_ping(src, &dst.ipv6, count)?;
    std::thread::sleep(Duration::from_millis(500));
    kill_bird_and_wait(kind, node, failures)?;
    let lost = lost(ping, count)?;
    let row = vec![
        format!(
            "{}'s BIRD killed (-9), started again 1 s later with -R",
            node.name
        ),
        format!(
            "{} -> {} every 20 ms, graceful restart {}",
            src.name,
            dst.name,
            if node.graceful_restart { "on" } else { "off" }
        ),
        format!("{lost} lost of {count}"),
    ];
    Ok((row, lost))
}
