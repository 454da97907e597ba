//! What the router learns: each node's pod CIDRs and the anycast addresses, with their
//! next hops.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;

use super::super::proc::Place;
use super::super::{ANYCAST4, ANYCAST6, NODES, Node, ROUTER, site};
use super::Report;
use super::pods::{demo_pods, url};
use crate::sys;

pub(super) fn router_routes(r: &mut Report) -> Result<()> {
    r.text.push_str(
        "ROUTER ROUTES (ip route in flockcluster-router, learned over BGP from the nodes' BIRD)\n",
    );
    let router = Place::Net(ROUTER.to_owned());
    for family in ["-6", "-4"] {
        let routes = router.run(&["ip", family, "route", "show", "proto", site::router_proto()])?;
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

/// While it lives, what the router sends bound to a node's link (`SO_BINDTODEVICE`) to an
/// address goes to that node's next hop for it, when the router's route to the address is a
/// kernel nexthop object (FRR's zebra installs them; BIRD does not): the kernel picks among an
/// object's paths by the flow's hash alone, whatever device the socket is bound to. A rule
/// (`oif`) sends such traffic to a table of its own holding that one path.
struct Steer<'a> {
    router: &'a Place,
    family: &'static str,
    rule: Vec<String>,
}

impl<'a> Steer<'a> {
    fn to(router: &'a Place, addr: &str, len: u8, n: &Node) -> Result<Option<Steer<'a>>> {
        let family = if addr.contains(':') { "-6" } else { "-4" };
        let prefix = format!("{addr}/{len}");
        let route = router.run(&["ip", family, "route", "show", &prefix])?;
        if !route.contains(" nhid ") {
            return Ok(None);
        }
        let Some(via) = route
            .lines()
            .find(|l| n.is_next_hop_in(l))
            .and_then(|l| l.split_once(" via "))
            .map(|(_, rest)| rest.split(" dev ").next().unwrap_or("").trim().to_owned())
        else {
            return Ok(None);
        };
        let table = (2000 + NODES.iter().position(|m| m.name == n.name).unwrap_or(0)).to_string();
        let mut add = vec!["ip", family, "route", "replace", &prefix, "via"];
        add.extend(via.split_whitespace());
        add.extend(["dev", n.router_if, "table", &table]);
        router.run(&add)?;
        let rule: Vec<String> = ["oif", n.router_if, "lookup", &table, "pref", "100"]
            .map(str::to_owned)
            .to_vec();
        let mut argv = vec!["ip", family, "rule", "add"];
        argv.extend(rule.iter().map(String::as_str));
        router.run(&argv)?;
        Ok(Some(Steer {
            router,
            family,
            rule,
        }))
    }
}

impl Drop for Steer<'_> {
    fn drop(&mut self) {
        let mut argv = vec!["ip", self.family, "rule", "del"];
        argv.extend(self.rule.iter().map(String::as_str));
        let _ = self.router.run(&argv);
        let table = self.rule[3].clone();
        let _ = self
            .router
            .run(&["ip", self.family, "route", "flush", "table", &table]);
    }
}

/// Anycast from the router through each next hop in turn: bound to the link towards a
/// node (`SO_BINDTODEVICE`), the router's multipath route yields that node's next hop (see
/// [`Steer`] for FRR's), so every node's anycast pod is probed, not just the one the flow hash
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
            let _steer = Steer::to(&router, addr, len, n)?;
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
