//! The demo pods: their addresses, the matrix of every pod probing every other, and the
//! Service in front of `web`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv6Addr;

use anyhow::{Context, Result};

use super::super::deploy::{DEMO_NS, WEB_REPLICAS, web_service_ip};
use super::super::{NODES, kubectl, kubectl_stdin};
use super::{Report, json};
use crate::sys;

/// A demo pod as the apiserver reports it.
pub(super) struct Pod {
    pub(super) label: String,
    pub(super) name: String,
    pub(super) app: String,
    pub(super) node: String,
    ipv6: String,
    ipv4: String,
    pub(super) pod_ips: String,
    pub(super) note: String,
}

pub(super) fn demo_pods() -> Result<Vec<Pod>> {
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

pub(super) fn pods_and_matrix(r: &mut Report) -> Result<()> {
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
        // a peer CNI has no ip-algo: its addresses say nothing of the workload
        _ if super::super::cni::Cni::current() != super::super::cni::Cni::Flock => {
            "not flock's: no ip-algo".into()
        }
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

pub(super) fn url(addr: &str) -> String {
    if addr.contains(':') {
        format!("http://[{addr}]/")
    } else {
        format!("http://{addr}/")
    }
}

/// Runs `script` in pod `name` (namespace demo) with `kubectl exec … sh -c`.
pub(super) fn exec_script(name: &str, script: &str) -> Result<String> {
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
    let ip = web_service_ip().unwrap_or_default();
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

/// The NetworkPolicy the peers' smoke check applies: no ingress to `web`.
const DENY_WEB: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: smoke-deny-web
  namespace: demo
spec:
  podSelector:
    matchLabels:
      app: web
  policyTypes: [Ingress]
";

/// How long a peer may take to enforce the policy, or to lift it.
const ENFORCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A peer's NetworkPolicy, checked from the outside: a pod on one node GETs a `web` pod on
/// the other over each family; with a policy denying `web` all ingress in place the GETs fail,
/// with it gone they answer again. (flock's policy has life tests of its own.)
pub(super) fn policy_enforced(r: &mut Report) -> Result<()> {
    let pods = demo_pods()?;
    let client = pods
        .iter()
        .find(|p| p.app == "anycast" && p.node == NODES[0].name)
        .context("no anycast pod on the first node")?;
    let server = pods
        .iter()
        .find(|p| p.app == "web" && p.node == NODES[1].name)
        .context("no web pod on the second node")?;
    // One GET per family: each line `FAMILY BODY`.
    let script = format!(
        "{HTTP_FN}b=$(http {}); echo \"6 ${{b:-NONE}}\"; b=$(http {}); echo \"4 ${{b:-NONE}}\"",
        server.ipv6, server.ipv4
    );
    // What each family's GET got: the server's name (answered), nothing (`NONE`: no answer),
    // or, when the exec itself failed, no verdict at all (the last error kept for the report).
    let last_error = std::cell::RefCell::new(None::<String>);
    let probe = |want: Option<&str>| -> bool {
        match exec_script(&client.name, &script) {
            Ok(out) => {
                let body = |family: &str| {
                    out.lines()
                        .find_map(|l| l.trim().strip_prefix(&format!("{family} ")))
                        .map(str::to_owned)
                };
                let want = want.unwrap_or("NONE");
                body("6").as_deref() == Some(want) && body("4").as_deref() == Some(want)
            }
            Err(e) => {
                *last_error.borrow_mut() = Some(format!("{e:#}"));
                false
            }
        }
    };
    let answers = Some(server.name.as_str());
    if sys::wait_for(ENFORCE_LIMIT, || probe(answers)).is_err() {
        r.failures.push(format!(
            "policy smoke: {} could not GET {} over both families before any policy (last \
             exec error: {:?})",
            client.label,
            server.label,
            last_error.borrow()
        ));
    }
    kubectl_stdin(&["apply", "-f", "-"], DENY_WEB)?;
    let started = std::time::Instant::now();
    let blocked = sys::wait_for(ENFORCE_LIMIT, || probe(None));
    let blocked_after = started.elapsed();
    kubectl(&["-n", DEMO_NS, "delete", "networkpolicy", "smoke-deny-web"])?;
    let started = std::time::Instant::now();
    let lifted = sys::wait_for(ENFORCE_LIMIT, || probe(answers));
    let lifted_after = started.elapsed();
    let mark = |ok: bool, d: std::time::Duration| {
        if ok {
            format!("{:.1} s", d.as_secs_f64())
        } else {
            "NOT WITHIN 30 s".into()
        }
    };
    if blocked.is_err() {
        r.failures.push(format!(
            "policy smoke: {} still reached {} over a family with all ingress to web denied \
             (last exec error: {:?})",
            client.label,
            server.label,
            last_error.borrow()
        ));
    }
    if lifted.is_err() {
        r.failures.push(format!(
            "policy smoke: {} did not reach {} over both families again once the policy was \
             gone (last exec error: {:?})",
            client.label,
            server.label,
            last_error.borrow()
        ));
    }
    let _ = writeln!(
        r.text,
        "NETWORKPOLICY SMOKE ({} on {} GETs {} on {} over IPv6 and IPv4; a policy denies web all ingress, then goes)",
        client.label, client.node, server.label, server.node
    );
    sys::table(
        &mut r.text,
        &["both families blocked after", "both answer again after"],
        &[vec![
            mark(blocked.is_ok(), blocked_after),
            mark(lifted.is_ok(), lifted_after),
        ]],
    );
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
