//! What `cluster up` checks and prints, section by section. Each section appends a table to
//! the report and a line to the failures for every check that does not hold.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv6Addr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use super::deploy::{DEMO_NS, WEB_REPLICAS};
use super::proc::Place;
use super::{
    ANYCAST4, ANYCAST6, FLOCK_SERVICE_ACCOUNT, NODES, ROUTER, control, deploy, kubectl,
    kubectl_stdin, node, site,
};
use crate::sys;

/// The printed report and the checks that failed.
pub struct Report {
    /// Tables, as printed.
    pub text: String,
    /// One line per failed check.
    pub failures: Vec<String>,
}

/// How long routes, sessions and statuses may take to settle.
const CONVERGE: Duration = Duration::from_secs(60);
/// The replicas `web` is scaled to for the timing.
const SCALE_TO: usize = 30;

/// One section of the report: its checks and its table.
type Section = fn(&mut Report) -> Result<()>;

/// Runs every check and builds the report.
pub fn run() -> Report {
    let mut r = Report {
        text: String::new(),
        failures: Vec::new(),
    };
    let sections: [(&str, Section); 12] = [
        ("nodes", nodes),
        ("flock's pods", flock_pods),
        ("convergence", wait_converged),
        ("NodeConfigs", nodeconfigs),
        ("pods and matrix", pods_and_matrix),
        ("router routes", router_routes),
        ("anycast", anycast),
        ("annotations path", annotations_path),
        ("sandbox failures", sandbox_failures),
        ("flock and the apiserver", apiserver),
        ("kubectl exec", kubectl_exec),
        ("scale", scale),
    ];
    for (name, section) in sections {
        if let Err(e) = section(&mut r) {
            r.failures.push(format!("{name}: {e:#}"));
        }
    }
    r
}

/// Appends the timings of `up`.
pub fn timings(out: &mut String, steps: &[(&str, Duration)]) {
    out.push_str("TIMINGS (cluster up)\n");
    let rows: Vec<Vec<String>> = steps
        .iter()
        .map(|(what, d)| vec![(*what).to_owned(), format!("{:.1} s", d.as_secs_f64())])
        .collect();
    sys::table(out, &["step", "took"], &rows);
}

fn raw(r: &mut Report, title: &str, text: &str) {
    let _ = writeln!(r.text, "{title}");
    for line in text.lines() {
        let _ = writeln!(r.text, "{}", line.trim_end());
    }
    r.text.push('\n');
}

/// `kubectl ARGS…` (with `-o json` among them), parsed.
pub(crate) fn json(args: &[&str]) -> Result<Value> {
    let text = kubectl(args)?;
    serde_json::from_str(&text).with_context(|| format!("parse kubectl {}", args.join(" ")))
}

fn nodes(r: &mut Report) -> Result<()> {
    let out = kubectl(&[
        "wait",
        "--for=condition=Ready",
        "node",
        "--all",
        "--timeout=120s",
    ]);
    if let Err(e) = out {
        r.failures.push(format!("nodes not all Ready: {e:#}"));
    }
    raw(
        r,
        "NODES (kubectl get nodes -o wide)",
        &kubectl(&["get", "nodes", "-o", "wide"])?,
    );
    Ok(())
}

fn flock_pods(r: &mut Report) -> Result<()> {
    let pods = json(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=flock",
        "-o",
        "json",
    ])?;
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    if items.len() != NODES.len() {
        r.failures.push(format!(
            "{} flock pods, not one per node ({})",
            items.len(),
            NODES.len()
        ));
    }
    for pod in &items {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let phase = pod["status"]["phase"].as_str().unwrap_or("?");
        let ready = pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["ready"] == true));
        if phase != "Running" || !ready {
            r.failures.push(format!(
                "flock pod {name} is {phase}, containers ready: {ready}"
            ));
        }
    }
    raw(
        r,
        "FLOCK'S PODS (kubectl -n kube-system get pods -l app.kubernetes.io/name=flock -o wide)",
        &kubectl(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=flock",
            "-o",
            "wide",
        ])?,
    );
    Ok(())
}

/// Waits until the router has a session with every node, each node's prefixes, and the
/// anycast addresses with one next hop per node.
fn wait_converged(r: &mut Report) -> Result<()> {
    let established = || {
        let s = site::router_sessions();
        s.len() == NODES.len() && s.iter().all(|s| s.info == "Established")
    };
    if sys::wait_for(CONVERGE, established).is_err() {
        r.failures.push(format!(
            "the router's BGP sessions are not all Established: {:?}",
            site::router_sessions()
        ));
    }
    let routes = || {
        NODES
            .iter()
            .all(|n| site::router_paths(n.cidr6) == 1 && site::router_paths(n.cidr4) == 1)
            && site::router_paths(&format!("{ANYCAST6}/128")) == NODES.len()
            && site::router_paths(&format!("{ANYCAST4}/32")) == NODES.len()
    };
    if sys::wait_for(CONVERGE, routes).is_err() {
        r.failures.push(
            "the router lacks a node's pod prefixes or the anycast next hops (see ROUTER ROUTES)"
                .into(),
        );
    }
    Ok(())
}

fn nodeconfigs(r: &mut Report) -> Result<()> {
    // The agent writes the status at most every --status-interval (10 s).
    let settled = || {
        json(&["get", "nodeconfigs", "-o", "json"]).is_ok_and(|v| {
            v["items"].as_array().is_some_and(|items| {
                items.len() == NODES.len()
                    && items.iter().all(|nc| {
                        let s = &nc["status"];
                        s["allocated6"].as_u64().unwrap_or(0) > 0
                            && s["bgp"].as_array().is_some_and(|b| {
                                !b.is_empty() && b.iter().all(|p| p["state"] == "Established")
                            })
                    })
            })
        })
    };
    if sys::wait_for(CONVERGE, settled).is_err() {
        r.failures
            .push("a NodeConfig's status lacks allocations or an Established BGP session".into());
    }
    raw(
        r,
        "NODECONFIGS (kubectl get nodeconfigs -o wide; allocations and BGP state are the agent's status)",
        &kubectl(&["get", "nodeconfigs", "-o", "wide"])?,
    );
    Ok(())
}

/// A demo pod as the apiserver reports it.
struct Pod {
    label: String,
    name: String,
    app: String,
    node: String,
    ipv6: String,
    ipv4: String,
    pod_ips: String,
    note: String,
}

fn demo_pods() -> Result<Vec<Pod>> {
    let v = json(&["-n", DEMO_NS, "get", "pods", "-o", "json"])?;
    let mut pods = Vec::new();
    for p in v["items"].as_array().cloned().unwrap_or_default() {
        if p["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let ips: Vec<String> = p["status"]["podIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["ip"].as_str().map(str::to_owned))
            .collect();
        let annotations: Vec<String> = p["metadata"]["annotations"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| {
                k.strip_prefix("flock.fritzlab.net/")
                    .map(|k| format!("{k}={}", v.as_str().unwrap_or("")))
            })
            .collect();
        pods.push(Pod {
            label: String::new(),
            name: p["metadata"]["name"].as_str().unwrap_or("?").to_owned(),
            app: p["metadata"]["labels"]["app"]
                .as_str()
                .unwrap_or("?")
                .to_owned(),
            node: p["spec"]["nodeName"].as_str().unwrap_or("?").to_owned(),
            ipv6: ips
                .iter()
                .find(|i| i.contains(':'))
                .cloned()
                .unwrap_or_default(),
            ipv4: ips
                .iter()
                .find(|i| !i.contains(':'))
                .cloned()
                .unwrap_or_default(),
            pod_ips: ips.join(","),
            note: annotations.join(" "),
        });
    }
    // Web pods first, each app by node then name; short labels for the matrix.
    pods.sort_by(|a, b| {
        (b.app == "web", &a.app, &a.node, &a.name).cmp(&(a.app == "web", &b.app, &b.node, &b.name))
    });
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for p in &mut pods {
        let n = counts.entry(p.app.clone()).or_default();
        *n += 1;
        let short = if p.app == "anycast" {
            "any"
        } else {
            p.app.as_str()
        };
        p.label = format!("{short}-{n}");
    }
    Ok(pods)
}

/// The 40 bits after a /64 that ip-algo `workload` derives from namespace and workload.
fn workload_bits(ipv6: &str) -> Option<u64> {
    let addr: Ipv6Addr = ipv6.parse().ok()?;
    Some(((u128::from(addr) >> 24) & ((1u128 << 40) - 1)) as u64)
}

fn pods_and_matrix(r: &mut Report) -> Result<()> {
    let pods = demo_pods()?;
    let web: Vec<&Pod> = pods.iter().filter(|p| p.app == "web").collect();
    let anycast: Vec<&Pod> = pods.iter().filter(|p| p.app == "anycast").collect();
    if web.len() != WEB_REPLICAS || anycast.len() != NODES.len() {
        r.failures.push(format!(
            "{} web pods (want {WEB_REPLICAS}) and {} anycast pods (want {})",
            web.len(),
            anycast.len(),
            NODES.len()
        ));
    }
    for n in &NODES {
        if !web.iter().any(|p| p.node == n.name) {
            r.failures.push(format!("no web pod on {}", n.name));
        }
    }
    for p in &pods {
        let Some(n) = NODES.iter().find(|n| n.name == p.node) else {
            r.failures
                .push(format!("{} is on unknown node {}", p.name, p.node));
            continue;
        };
        // The kubelet orders a pod's addresses by the family of its node IP (IPv6 here),
        // whatever order the runtime and the CNI result give them in.
        if !p
            .pod_ips
            .split(',')
            .next()
            .is_some_and(|ip| ip.contains(':'))
        {
            r.failures.push(format!(
                "{} lists podIPs {}: a dual-stack pod's primary address must be IPv6, the \
                 family of its node's IP",
                p.name, p.pod_ips
            ));
        }
        if !in_prefix(&p.ipv6, n.cidr6) || !in_prefix(&p.ipv4, n.cidr4) {
            r.failures.push(format!(
                "{} has podIPs {} outside {}'s {} and {}",
                p.name, p.pod_ips, n.name, n.cidr6, n.cidr4
            ));
        }
    }
    let shared: BTreeSet<Option<u64>> = web.iter().map(|p| workload_bits(&p.ipv6)).collect();
    let shared_note = match shared.iter().next() {
        Some(Some(bits)) if shared.len() == 1 => format!("all {:010x}", bits),
        _ => {
            r.failures.push(format!(
                "ip-algo workload: the web pods' namespace and workload bits differ: {shared:?}"
            ));
            "DIFFER".into()
        }
    };
    r.text.push_str(
        "PODS (kubectl get pods -n demo; podIPs as the apiserver has them, the node IP's family (IPv6) first)\n",
    );
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            vec![
                p.label.clone(),
                p.name.clone(),
                p.node.clone(),
                p.pod_ips.clone(),
                p.note.clone(),
            ]
        })
        .collect();
    sys::table(
        &mut r.text,
        &["label", "pod", "node", "podIPs", "annotations"],
        &rows,
    );
    let _ = writeln!(
        r.text,
        "ip-algo workload: the 40 bits after each web pod's /64 (ns:16, app:24): {shared_note}\n"
    );
    matrix(r, &pods);
    Ok(())
}

pub(crate) fn in_prefix(addr: &str, prefix: &str) -> bool {
    let Some((net, len)) = prefix.split_once('/') else {
        return false;
    };
    let Ok(len) = len.parse::<u32>() else {
        return false;
    };
    match (
        addr.parse::<std::net::IpAddr>(),
        net.parse::<std::net::IpAddr>(),
    ) {
        (Ok(std::net::IpAddr::V6(a)), Ok(std::net::IpAddr::V6(n))) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        (Ok(std::net::IpAddr::V4(a)), Ok(std::net::IpAddr::V4(n))) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        _ => false,
    }
}

/// The shell script a pod runs to test every other pod: one line per target and family,
/// `R ADDR PING HTTP-BODY`.
fn probe_script(targets: &[String]) -> String {
    let mut s = String::from(HTTP_FN);
    s.push_str(
        "t() { if ping -c 1 -W 2 \"$1\" >/dev/null 2>&1; then p=ok; else p=LOSS; fi; \
         b=$(http \"$1\"); echo \"R $1 $p ${b:-NONE}\"; }\n",
    );
    for addr in targets {
        let _ = writeln!(s, "t {addr}");
    }
    s
}

/// `http ADDR` in a pod: GET / on port 80, the last line of the answer (the body). Not
/// busybox's `wget`: it looks the port of `http` up through glibc's NSS, which a static
/// busybox cannot load (it crashes); `nc` takes the port as a number.
pub(crate) const HTTP_FN: &str =
    "http() { printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 \"$1\" 80 2>/dev/null | tail -n 1; }\n";

fn url(addr: &str) -> String {
    if addr.contains(':') {
        format!("http://[{addr}]/")
    } else {
        format!("http://{addr}/")
    }
}

/// Runs `script` in pod `name` (namespace demo) with `kubectl exec … sh -c`.
fn exec_script(name: &str, script: &str) -> Result<String> {
    kubectl(&["-n", DEMO_NS, "exec", name, "--", "sh", "-c", script])
}

fn matrix(r: &mut Report, pods: &[Pod]) {
    // Each pod probes every other pod's IPv6 and IPv4 address: ping, then HTTP (the answer
    // must be the target pod's name). All sources in parallel.
    let results: Vec<BTreeMap<String, (bool, String)>> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|src| {
                let targets: Vec<String> = pods
                    .iter()
                    .filter(|p| p.name != src.name)
                    .flat_map(|p| [p.ipv6.clone(), p.ipv4.clone()])
                    .collect();
                let script = probe_script(&targets);
                s.spawn(move || {
                    let out = exec_script(&src.name, &script).unwrap_or_default();
                    out.lines()
                        .filter_map(|l| {
                            let f: Vec<&str> = l.split_whitespace().collect();
                            (f.len() >= 4 && f[0] == "R")
                                .then(|| (f[1].to_owned(), (f[2] == "ok", f[3].to_owned())))
                        })
                        .collect::<BTreeMap<_, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    r.text.push_str(
        "PING AND HTTP MATRIX (row probes column: ping IPv6/IPv4, then HTTP GET IPv6/IPv4 answered \
         with the column pod's name; ok = no loss / right answer)\n",
    );
    let mut header = vec!["from \\ to".to_owned()];
    header.extend(pods.iter().map(|p| format!("{} ({})", p.label, p.node)));
    let mut rows = Vec::new();
    for (src, got) in pods.iter().zip(&results) {
        let mut cells = vec![format!("{} ({})", src.label, src.node)];
        for dst in pods {
            if dst.name == src.name {
                cells.push("-".into());
                continue;
            }
            let probe = |addr: &str| {
                got.get(addr)
                    .map(|(ping, body)| (*ping, body == &dst.name))
                    .unwrap_or((false, false))
            };
            let (p6, h6) = probe(&dst.ipv6);
            let (p4, h4) = probe(&dst.ipv4);
            let mark = |ok: bool| if ok { "ok" } else { "FAIL" };
            cells.push(format!(
                "{}/{} {}/{}",
                mark(p6),
                mark(p4),
                mark(h6),
                mark(h4)
            ));
            if !(p6 && p4 && h6 && h4) {
                r.failures.push(format!(
                    "{} -> {} ({} -> {}): ping {}/{}, HTTP {}/{}",
                    src.label,
                    dst.label,
                    src.node,
                    dst.node,
                    mark(p6),
                    mark(p4),
                    mark(h6),
                    mark(h4)
                ));
            }
        }
        rows.push(cells);
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    sys::table(&mut r.text, &header_refs, &rows);
    service(r, pods);
}

/// The Service from one pod on each node (the anycast DaemonSet's pods: not its backends).
fn service(r: &mut Report, pods: &[Pod]) {
    let ip = kubectl(&[
        "-n",
        DEMO_NS,
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
    .unwrap_or_default();
    let ip = ip.trim().to_owned();
    let label_of: BTreeMap<&str, &str> = pods
        .iter()
        .map(|p| (p.name.as_str(), p.label.as_str()))
        .collect();
    let _ = writeln!(
        r.text,
        "SERVICE demo/web (ClusterIP {ip}, kube-proxy on each node; 12 HTTP GETs from a pod on each node)"
    );
    let mut rows = Vec::new();
    for client in pods.iter().filter(|p| p.app == "anycast") {
        let script = format!(
            "{HTTP_FN}for i in 1 2 3 4 5 6 7 8 9 10 11 12; do b=$(http {ip}); echo \"${{b:-NONE}}\"; done"
        );
        let out = exec_script(&client.name, &script).unwrap_or_default();
        let answers: Vec<&str> = out.lines().map(str::trim).collect();
        let ok = answers.len() == 12
            && answers
                .iter()
                .all(|a| label_of.get(a).is_some_and(|l| l.starts_with("web-")));
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        for a in &answers {
            *by.entry(label_of.get(a).copied().unwrap_or(a)).or_default() += 1;
        }
        if !ok || ip.is_empty() {
            r.failures.push(format!(
                "Service {ip} from {} on {}: answers {answers:?}",
                client.label, client.node
            ));
        }
        rows.push(vec![
            format!("{} ({})", client.label, client.node),
            format!(
                "{}/12",
                answers.iter().filter(|a| label_of.contains_key(*a)).count()
            ),
            by.iter()
                .map(|(k, v)| format!("{k}×{v}"))
                .collect::<Vec<_>>()
                .join(" "),
        ]);
    }
    sys::table(&mut r.text, &["client", "answered", "by"], &rows);
}

fn router_routes(r: &mut Report) -> Result<()> {
    r.text.push_str(
        "ROUTER ROUTES (ip route in flockcluster-router, learned over BGP from the nodes' BIRD)\n",
    );
    let router = Place::Net(ROUTER.to_owned());
    for family in ["-6", "-4"] {
        let routes = router.run(&["ip", family, "route", "show", "proto", "bird"])?;
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
            if !via.contains(n.addr) {
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

/// Anycast from the router through each next hop in turn: bound to the link towards a
/// node (`SO_BINDTODEVICE`), the router's multipath route yields that node's next hop, so
/// every node's anycast pod is probed, not just the one the flow hash happens to pick.
fn anycast(r: &mut Report) -> Result<()> {
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

/// Which path gave the agent the pod's annotations: for one probe pod, node1's shim is
/// wrapped by a script that records the network configuration the runtime passes on stdin;
/// the agent takes the annotations from its `runtimeConfig` when they are there (DESIGN §7),
/// from the pod watcher otherwise.
fn annotations_path(r: &mut Report) -> Result<()> {
    let n = &NODES[0];
    let host = node::dir(n).join("host");
    let bin = host.join("opt-cni-bin");
    let record_in_node = "/var/lib/cni/flockcluster-probe.json";
    let record = host.join("var-lib-cni/flockcluster-probe.json");
    let _ = std::fs::remove_file(&record);
    let wrapper = format!(
        "#!/bin/sh\n# cargo xtask cluster: records the network configuration of one ADD, then runs flock.\n\
         if [ \"$CNI_COMMAND\" = ADD ]; then tee {record_in_node} | /opt/cni/bin/flock.real; exit $?; fi\n\
         exec /opt/cni/bin/flock.real \"$@\"\n"
    );
    let wrapped = bin.join("flock.wrapper");
    std::fs::write(&wrapped, wrapper).context("write the shim wrapper")?;
    sys::output(Command::new("chmod").arg("755").arg(&wrapped))?;
    std::fs::rename(bin.join("flock"), bin.join("flock.real")).context("move the shim aside")?;
    std::fs::rename(&wrapped, bin.join("flock")).context("install the shim wrapper")?;
    let probe = format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: annotations-probe
  namespace: {DEMO_NS}
  annotations: {{ flock.fritzlab.net/ip-algo: \"ns:16,pod:32\", flockcluster/probe: \"1\" }}
spec:
  nodeName: {node}
  dnsPolicy: Default
  terminationGracePeriodSeconds: 0
  automountServiceAccountToken: false
  containers:
    - {{ name: net, image: {image}, imagePullPolicy: Never }}
",
        node = n.name,
        image = super::images::NET,
    );
    let created = kubectl_stdin(&["apply", "-f", "-"], &probe).and_then(|_| {
        kubectl(&[
            "-n",
            DEMO_NS,
            "wait",
            "--for=condition=Ready",
            "pod/annotations-probe",
            "--timeout=60s",
        ])
    });
    // Whatever happened: the real shim back in place, the probe pod gone.
    let restored = std::fs::rename(bin.join("flock.real"), bin.join("flock"));
    let _ = kubectl(&[
        "-n",
        DEMO_NS,
        "delete",
        "pod",
        "annotations-probe",
        "--wait=false",
    ]);
    restored.context("put the real shim back")?;
    created.context("the probe pod did not become ready")?;
    let text =
        std::fs::read_to_string(&record).with_context(|| format!("read {}", record.display()))?;
    let _ = std::fs::remove_file(&record);
    // A plugin reads its own configuration from the conflist on stdin, with the network's
    // name and cniVersion, and the runtimeConfig of the capabilities it declares.
    let plugin: Value = serde_json::from_str(&text).context("parse the recorded network config")?;
    let conf = &plugin;
    let from_runtime = &plugin["runtimeConfig"]["io.kubernetes.cri.pod-annotations"];
    let containerd = super::kube::ensure_built()
        .and_then(|kube| {
            sys::output(Command::new(kube.containerd_bin().join("containerd")).arg("--version"))
        })
        .unwrap_or_default()
        .split_whitespace()
        .nth(2)
        .unwrap_or("?")
        .to_owned();
    r.text
        .push_str("POD ANNOTATIONS PATH (what node1's containerd passed the shim for one pod)\n");
    let rows = vec![
        vec![
            "runtime".to_owned(),
            format!(
                "containerd {containerd}, conflist cniVersion {}",
                conf["cniVersion"].as_str().unwrap_or("?")
            ),
        ],
        vec![
            "capabilities in the conflist".to_owned(),
            plugin["capabilities"].to_string(),
        ],
        vec![
            "runtimeConfig keys passed".to_owned(),
            plugin["runtimeConfig"]
                .as_object()
                .map(|m| m.keys().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_else(|| "none".into()),
        ],
        vec![
            "io.kubernetes.cri.pod-annotations".to_owned(),
            if let Some(all) = from_runtime.as_object() {
                // flock's own keys; the kubelet adds a few of its own to every pod.
                let flock: serde_json::Map<String, Value> = all
                    .iter()
                    .filter(|(k, _)| k.starts_with("flock.fritzlab.net/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                format!(
                    "{} (and {} more: {})",
                    Value::Object(flock.clone()),
                    all.len() - flock.len(),
                    all.keys()
                        .filter(|k| !flock.contains_key(*k))
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                "absent".into()
            },
        ],
        vec![
            "the agent took the annotations from".to_owned(),
            if from_runtime["flock.fritzlab.net/ip-algo"].is_string() {
                "runtimeConfig (io.kubernetes.cri.pod-annotations); the pod watcher gave the pod itself".into()
            } else {
                r.failures.push(
                    "containerd passed no io.kubernetes.cri.pod-annotations: the agent fell back to the pod watcher"
                        .into(),
                );
                "the pod watcher".into()
            },
        ],
    ];
    sys::table(&mut r.text, &["what", "seen"], &rows);
    Ok(())
}

/// The kubelets' `FailedCreatePodSandBox` events, by cause. Reported, not failed: the
/// kubelet retries, and every pod above is Running. (A cause seen before: containerd 1.6
/// runs the `loopback` plugin concurrently with flock, and that plugin refuses a `lo` that
/// holds a non-loopback address — why flock puts anycast addresses on the pod's interface.)
fn sandbox_failures(r: &mut Report) -> Result<()> {
    let events = json(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=FailedCreatePodSandBox",
        "-o",
        "json",
    ])?;
    let mut causes: BTreeMap<String, (u64, BTreeSet<String>)> = BTreeMap::new();
    for e in events["items"].as_array().into_iter().flatten() {
        let msg = e["message"].as_str().unwrap_or("");
        // "… failed to setup network for sandbox \"ID\": CAUSE"
        let cause = msg.rsplit_once("\": ").map_or(msg, |(_, c)| c).to_owned();
        let pod = e["involvedObject"]["name"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let entry = causes.entry(cause).or_default();
        entry.0 += e["count"].as_u64().unwrap_or(1);
        entry.1.insert(pod);
    }
    r.text.push_str(
        "SANDBOX RETRIES (kubelet events FailedCreatePodSandBox since the cluster started; the kubelet retried each)\n",
    );
    if causes.is_empty() {
        r.text.push_str("none\n\n");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = causes
        .into_iter()
        .map(|(cause, (n, pods))| {
            vec![
                n.to_string(),
                pods.into_iter().collect::<Vec<_>>().join(" "),
                cause,
            ]
        })
        .collect();
    sys::table(&mut r.text, &["times", "pods", "cause"], &rows);
    Ok(())
}

/// Audit events of flock's service account: ((resource, verb), (requests, refused)).
fn audit_use() -> Result<BTreeMap<(String, String), (usize, usize)>> {
    let path = control::audit_log();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut seen: BTreeMap<String, (String, String, u64)> = BTreeMap::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if e["user"]["username"] != FLOCK_SERVICE_ACCOUNT {
            continue;
        }
        let o = &e["objectRef"];
        let mut resource = match o["resource"].as_str() {
            Some(r) => r.to_owned(),
            // A request without an object: API discovery (`/apis/discovery.k8s.io/v1`), which
            // Kubernetes' own `system:discovery` role lets every user make.
            None => e["requestURI"]
                .as_str()
                .map_or("?", |u| u.split('?').next().unwrap_or(u))
                .to_owned(),
        };
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        if let Some(g) = o["apiGroup"].as_str().filter(|g| !g.is_empty()) {
            resource = format!("{resource}.{g}");
        }
        let id = e["auditID"].as_str().unwrap_or("").to_owned();
        let code = e["responseStatus"]["code"].as_u64().unwrap_or(0);
        let verb = e["verb"].as_str().unwrap_or("?").to_owned();
        // One request has up to three stages (RequestReceived, ResponseStarted for a watch,
        // ResponseComplete): count it once, with the latest code known.
        let entry = seen.entry(id).or_insert((resource, verb, 0));
        if code != 0 {
            entry.2 = code;
        }
    }
    let mut used: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    for (resource, verb, code) in seen.into_values() {
        let e = used.entry((resource, verb)).or_default();
        e.0 += 1;
        if code == 403 {
            e.1 += 1;
        }
    }
    Ok(used)
}

/// A GET of the API's discovery documents (`/api`, `/apis…`, `/version`): granted to every
/// authenticated user by Kubernetes' `system:discovery` ClusterRole, not by flock's RBAC.
fn is_discovery(resource: &str, verb: &str) -> bool {
    verb == "get"
        && (resource == "/api"
            || resource.starts_with("/api/")
            || resource == "/apis"
            || resource.starts_with("/apis/")
            || resource == "/version")
        && !resource.contains("/namespaces/")
}

/// What `deploy/rbac.yaml`'s ClusterRole grants, as (resource[/sub][.group], verb).
/// (resource, verb) of every grant of flock's ClusterRole and of the Roles bound to its
/// service account (the BGP passwords' Secret).
fn granted() -> Result<BTreeSet<(String, String)>> {
    let mut roles = vec![json(&["get", "clusterrole", "flock", "-o", "json"])?];
    let bindings = json(&["get", "rolebindings", "-A", "-o", "json"])?;
    for b in bindings["items"].as_array().into_iter().flatten() {
        let ours = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == "flock" && s["namespace"] == "kube-system"
        });
        if ours && b["roleRef"]["kind"] == "Role" {
            let ns = b["metadata"]["namespace"].as_str().unwrap_or("default");
            let name = b["roleRef"]["name"].as_str().unwrap_or("");
            roles.push(json(&["-n", ns, "get", "role", name, "-o", "json"])?);
        }
    }
    let mut out = BTreeSet::new();
    for rule in roles
        .iter()
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
    {
        let groups: Vec<String> = rule["apiGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect();
        for g in &groups {
            for res in rule["resources"].as_array().into_iter().flatten() {
                for verb in rule["verbs"].as_array().into_iter().flatten() {
                    let res = res.as_str().unwrap_or("?");
                    let name = if g.is_empty() {
                        res.to_owned()
                    } else {
                        format!("{res}.{g}")
                    };
                    out.insert((name, verb.as_str().unwrap_or("?").to_owned()));
                }
            }
        }
    }
    Ok(out)
}

fn apiserver(r: &mut Report) -> Result<()> {
    r.text.push_str("FLOCK AND THE APISERVER\n");
    let mut rows = Vec::new();
    // 1. The CRD's schema refuses a bad NodeConfig at the apiserver.
    let bad = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: { name: schema-probe }
spec:
  cidr6: not-a-cidr
  bgp: { asn: 0, routerId: 10.0.0.1 }
";
    match kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], bad) {
        Ok(out) => {
            r.failures.push(format!(
                "the apiserver accepted a bad NodeConfig: {}",
                out.trim()
            ));
            rows.push(vec![
                "schema refuses a bad NodeConfig".into(),
                "NO: accepted".into(),
            ]);
        }
        Err(e) => {
            let msg = format!("{e:#}");
            let why: Vec<&str> = ["spec.cidr6", "spec.bgp.asn"]
                .into_iter()
                .filter(|f| msg.contains(f))
                .collect();
            if why.len() != 2 || !msg.contains("Invalid value") {
                r.failures.push(format!(
                    "a bad NodeConfig was refused, but not by its schema: {msg}"
                ));
            }
            rows.push(vec![
                "schema refuses a bad NodeConfig (cidr6: not-a-cidr, asn: 0)".into(),
                format!("yes: Invalid value for {}", why.join(", ")),
            ]);
        }
    }
    // 2. Status writes go through the status subresource.
    let can = |args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        all.push("--as");
        all.push(FLOCK_SERVICE_ACCOUNT);
        kubectl(&all)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|e| {
                // `can-i` exits 1 for "no".
                if format!("{e:#}").contains("no") {
                    "no".into()
                } else {
                    format!("{e:#}")
                }
            })
    };
    let main = can(&["patch", "nodeconfigs.flock.fritzlab.net"]);
    let status = can(&[
        "patch",
        "nodeconfigs.flock.fritzlab.net",
        "--subresource=status",
    ]);
    let used = audit_use()?;
    let status_writes: usize = used
        .iter()
        .filter(|((res, verb), _)| {
            res == "nodeconfigs/status.flock.fritzlab.net"
                && matches!(verb.as_str(), "patch" | "update")
        })
        .map(|(_, (n, refused))| n - refused)
        .sum();
    let main_writes: usize = used
        .iter()
        .filter(|((res, verb), _)| {
            res == "nodeconfigs.flock.fritzlab.net"
                && matches!(verb.as_str(), "patch" | "update" | "create" | "delete")
        })
        .map(|(_, (n, _))| *n)
        .sum();
    let generations = kubectl(&[
        "get",
        "nodeconfigs",
        "-o",
        "jsonpath={range .items[*]}{.metadata.generation} {end}",
    ])?;
    let generations = generations.trim().to_owned();
    if status_writes == 0 || main_writes > 0 || main != "no" || status != "yes" {
        r.failures.push(format!(
            "status writes: {status_writes} through nodeconfigs/status, {main_writes} to nodeconfigs; \
             can-i patch nodeconfigs: {main}, nodeconfigs/status: {status}"
        ));
    }
    if generations.split_whitespace().any(|g| g != "1") {
        r.failures.push(format!(
            "a NodeConfig's generation moved ({generations}): something wrote its spec"
        ));
    }
    rows.push(vec![
        "status written through the status subresource".into(),
        format!(
            "{status_writes} patches of nodeconfigs/status, {main_writes} writes of nodeconfigs; \
             can-i patch nodeconfigs: {main}, nodeconfigs/status: {status}; generations {generations}"
        ),
    ]);
    // 3. The agents' logs hold no refusal.
    let mut refusals = 0;
    let agents = kubectl(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=flock",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    for pod in agents.split_whitespace() {
        let log = kubectl(&["-n", "kube-system", "logs", pod, "-c", "agent"])?;
        refusals += log
            .lines()
            // The apiserver's refusal reads "… is forbidden: …" (a bare "403" also matches
            // timestamps).
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .count();
    }
    let refused_requests: usize = used.values().map(|(_, refused)| refused).sum();
    if refusals > 0 || refused_requests > 0 {
        r.failures.push(format!(
            "flock was refused: {refused_requests} requests answered 403, {refusals} log lines"
        ));
    }
    rows.push(vec![
        "refusals (403)".into(),
        format!("{refused_requests} in the audit log, {refusals} lines in the agents' logs"),
    ]);
    sys::table(&mut r.text, &["check", "result"], &rows);

    // 4. RBAC: granted versus used.
    let granted = granted()?;
    let mut keys: BTreeSet<(String, String)> = granted.clone();
    keys.extend(used.keys().cloned());
    r.text.push_str(
        "FLOCK'S RBAC (deploy/rbac.yaml's ClusterRole and Roles versus the requests of kube-system/flock in the apiserver's audit log)\n",
    );
    let mut rows = Vec::new();
    let mut unused = Vec::new();
    for key in &keys {
        let (n, refused) = used.get(key).copied().unwrap_or((0, 0));
        let is_granted = granted.contains(key) || is_discovery(&key.0, &key.1);
        if is_granted && n == 0 {
            unused.push(format!("{} {}", key.1, key.0));
        }
        if !is_granted && n > 0 {
            r.failures.push(format!(
                "flock used {} {} without a grant in deploy/rbac.yaml",
                key.1, key.0
            ));
        }
        rows.push(vec![
            key.0.clone(),
            key.1.clone(),
            (if granted.contains(key) {
                "yes"
            } else if is_granted {
                "system:discovery"
            } else {
                "no"
            })
            .to_owned(),
            n.to_string(),
            refused.to_string(),
        ]);
    }
    sys::table(
        &mut r.text,
        &["resource", "verb", "granted", "requests", "refused"],
        &rows,
    );
    // A grant flock did not use is reported, not failed: the audit log shows what this run
    // exercised, not every path of the agent.
    if unused.is_empty() {
        r.text.push_str(
            "every grant was used; nothing was refused: enough and no broader than needed\n\n",
        );
    } else {
        let _ = writeln!(
            r.text,
            "granted but not used by flock: {} (candidates to drop from deploy/rbac.yaml)\n",
            unused.join(", ")
        );
    }
    Ok(())
}

fn kubectl_exec(r: &mut Report) -> Result<()> {
    let pods = demo_pods()?;
    r.text.push_str(
        "KUBECTL EXEC AND THE APISERVER'S PROXY (apiserver -> kubelet -> containerd; apiserver -> the pod's primary IP)\n",
    );
    let mut rows = Vec::new();
    for n in &NODES {
        let Some(pod) = pods.iter().find(|p| p.app == "web" && p.node == n.name) else {
            continue;
        };
        let proxy = format!("/api/v1/namespaces/{DEMO_NS}/pods/{}:80/proxy/", pod.name);
        for (what, args) in [
            (
                format!("kubectl exec -n demo {} -- hostname", pod.name),
                vec!["-n", DEMO_NS, "exec", &pod.name, "--", "hostname"],
            ),
            (
                format!("kubectl get --raw {proxy}"),
                vec!["get", "--raw", &proxy],
            ),
        ] {
            let got = kubectl(&args)
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|e| format!("FAIL ({e:#})"));
            if got != pod.name {
                r.failures.push(format!("{what} answered {got:?}"));
            }
            rows.push(vec![what, n.name.to_owned(), got]);
        }
    }
    sys::table(&mut r.text, &["command", "node", "output"], &rows);
    Ok(())
}

fn scale(r: &mut Report) -> Result<()> {
    let up = deploy::scale_web(SCALE_TO, Duration::from_secs(300));
    let back = deploy::scale_web(WEB_REPLICAS, Duration::from_secs(120));
    r.text
        .push_str("SCALE (kubectl scale deployment/web, until every replica is Ready)\n");
    let mut rows = Vec::new();
    match &up {
        Ok(d) => rows.push(vec![
            format!("{WEB_REPLICAS} -> {SCALE_TO}"),
            format!("{:.1} s", d.as_secs_f64()),
        ]),
        Err(e) => {
            r.failures.push(format!("scale to {SCALE_TO}: {e:#}"));
            rows.push(vec![
                format!("{WEB_REPLICAS} -> {SCALE_TO}"),
                "FAILED".into(),
            ]);
        }
    }
    if let Err(e) = &back {
        r.failures
            .push(format!("scale back to {WEB_REPLICAS}: {e:#}"));
    }
    sys::table(&mut r.text, &["replicas", "all Ready after"], &rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert!(in_prefix("2001:db8:c1::5", "2001:db8:c1::/64"));
        assert!(!in_prefix("2001:db8:c2::5", "2001:db8:c1::/64"));
        assert!(in_prefix("10.201.1.7", "10.201.1.0/24"));
        assert!(!in_prefix("10.201.2.7", "10.201.1.0/24"));
        assert!(!in_prefix("10.201.1.7", "2001:db8:c1::/64"));
    }

    #[test]
    fn workload_bits_are_the_40_after_the_64() {
        assert_eq!(
            workload_bits("2001:db8:c1:0:abcd:1234:56ff:ffff"),
            Some(0x00ab_cd12_3456)
        );
    }

    #[test]
    fn probe_script_lists_every_target() {
        let s = probe_script(&["10.0.0.1".into(), "2001:db8::1".into()]);
        assert!(s.starts_with(HTTP_FN));
        assert!(s.contains("t 10.0.0.1\n") && s.contains("t 2001:db8::1\n"));
    }
}
