//! What the router learns: each node's pod CIDRs and the anycast addresses, with their
//! next hops.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;

use super::super::proc::Place;
use super::super::{ANYCAST4, ANYCAST6, NODES, ROUTER, site};
use super::Report;
use super::pods::{demo_pods, url};
use crate::sys;

pub(super) fn router_routes(r: &mut Report) -> Result<()> {
    r.text.push_str(
        "ROUTER ROUTES (ip route in flockcluster-router, learned over BGP from the nodes' \
         speakers, or static for ptp's)\n",
    );
    let router = Place::Net(ROUTER.to_owned());
    let proto = if super::super::cni::Cni::current().speaks_bgp() {
        site::router_proto()
    } else {
        "boot"
    };
    for family in ["-6", "-4"] {
        let routes = router.run(&["ip", family, "route", "show", "proto", proto])?;
        for line in routes.lines() {
            let _ = writeln!(r.text, "  {}", line.trim_end().replace('\t', "    "));
        }
    }
    r.text.push('\n');
    for n in &NODES {
        for cidr in [n.cidr6, n.cidr4] {
            let via = router
                .run(&[
                    "ip",
                    if cidr.contains(':') { "-6" } else { "-4" },
                    "route",
                    "show",
                    cidr,
                ])
                .unwrap_or_default();
            if !n.is_next_hop_in(&via) {
                r.failures.push(format!(
                    "the router's route to {cidr} does not go to {} ({via:?})",
                    n.name
                ));
            }
        }
    }
    if super::super::cni::Cni::current() != super::super::cni::Cni::Flock {
        // a peer's cluster has no anycast
        return Ok(());
    }
    for anycast in [format!("{ANYCAST6}/128"), format!("{ANYCAST4}/32")] {
        let paths = site::router_paths(&anycast);
        if paths != NODES.len() {
            r.failures.push(format!(
                "anycast {anycast} has {paths} next hops at the router, not one per node ({})",
                NODES.len()
            ));
        }
    }
    Ok(())
}

/// Anycast from the router through each next hop in turn: bound to the link towards a
/// node (`SO_BINDTODEVICE`), the router's multipath route yields that node's next hop (see
/// [`site::Steer`] for FRR's), so every node's anycast pod is probed, not just the one the flow hash
/// happens to pick.
pub(super) fn anycast(r: &mut Report) -> Result<()> {
    r.text.push_str(
        "ANYCAST FROM THE ROUTER (through each node's next hop: ping 3 echoes, then HTTP GET: which pod answered)\n",
    );
    let pods = demo_pods()?;
    let router = Place::Net(ROUTER.to_owned());
    let mut rows = Vec::new();
    for (addr, len) in [(ANYCAST6, 128), (ANYCAST4, 32)] {
        let paths = site::router_paths(&format!("{addr}/{len}"));
        for n in &NODES {
            let want = pods
                .iter()
                .find(|p| p.app == "anycast" && p.node == n.name)
                .map_or("", |p| p.name.as_str());
            let _steer = site::Steer::to(addr, n)?;
            // A pod that has just become Ready may take a moment to answer on every path:
            // up to 5 tries, 1 s apart; the table says how many it took.
            let (mut ping, mut http, mut tries) = (false, String::new(), 0);
            while tries < 5 {
                tries += 1;
                ping = router
                    .run(&[
                        "ping",
                        "-q",
                        "-c",
                        "3",
                        "-i",
                        "0.2",
                        "-W",
                        "2",
                        "-I",
                        n.router_if,
                        addr,
                    ])
                    .is_ok_and(|o| o.contains(" 0% packet loss"));
                http = router
                    .run(&[
                        "curl",
                        "-sS",
                        "--max-time",
                        "3",
                        "--interface",
                        n.router_if,
                        &url(addr),
                    ])
                    .map(|b| b.trim().to_owned())
                    .unwrap_or_else(|e| format!("FAIL ({e:#})"));
                if ping && !want.is_empty() && http == want {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            if tries > 1 {
                http = format!("{http} (try {tries})");
            }
            if !ping || want.is_empty() || !http.starts_with(want) || http.starts_with("FAIL") {
                r.failures.push(format!(
                    "router -> anycast {addr} via {}: ping {ping}, HTTP answer {http:?} (want {want:?})",
                    n.name
                ));
            }
            rows.push(vec![
                addr.to_owned(),
                format!("{} ({})", n.router_if, n.name),
                (if ping { "ok" } else { "LOSS" }).to_owned(),
                http,
                format!("{paths} next hops"),
            ]);
        }
    }
    sys::table(
        &mut r.text,
        &["anycast", "next hop", "ping", "HTTP answered by", "route"],
        &rows,
    );
    // Each node's own route to the address leads to its pods' host veths only: the node also
    // learns the address from the fabric, and that route is not one of its pods.
    for n in &NODES {
        for (family, addr) in [("-6", ANYCAST6), ("-4", ANYCAST4)] {
            let route = Place::Net(n.ns())
                .run(&["ip", family, "route", "show", addr, "proto", "static"])
                .unwrap_or_else(|e| format!("({e:#})"));
            let words: Vec<&str> = route.split_whitespace().collect();
            let devs: Vec<&str> = words
                .windows(2)
                .filter(|w| w[0] == "dev")
                .map(|w| w[1])
                .collect();
            if devs.is_empty() || devs.iter().any(|d| !d.starts_with("flock")) {
                r.failures.push(format!(
                    "{}'s anycast route to {addr} is not over its pods' host veths: {:?}",
                    n.name,
                    route.trim()
                ));
            }
        }
    }
    Ok(())
}
