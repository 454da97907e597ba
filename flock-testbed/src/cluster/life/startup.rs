//! `life startup`: a Deployment scaled from 0 to 50 pods on one node with flock, then on the
//! other with the reference `ptp` + `host-local` plugins, timed to all Ready and per
//! `RunPodSandbox`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::super::deploy::DEMO_NS;
use super::super::proc;
use super::super::{NODES, Node, kube, kubectl, kubectl_stdin, node};
use super::{PodView, percentile, pods};
use crate::sys;

/// Pods per node in the start-up run.
pub(crate) const BURST: usize = 50;

/// The reference plugins' conflist for the comparison: `ptp` with `host-local`, both
/// families, addresses from a corner of the node's own CIDRs (so the router's routes to the
/// node reach them). Named to sort before flock's, so containerd takes it while it is there.
fn ptp_conflist(n: &Node) -> String {
    let (v6, v4) = ptp_ranges(n);
    format!(
        r#"{{"cniVersion":"1.0.0","name":"ptp-comparison","plugins":[{{"type":"ptp","ipMasq":false,
"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{v6}"}}],[{{"subnet":"{v4}"}}]],
"routes":[{{"dst":"::/0"}},{{"dst":"0.0.0.0/0"}}]}}}}]}}"#
    )
}

/// The ranges `host-local` gives out in the comparison: the last /80 of the node's IPv6 /64
/// and the last /26 of its IPv4 /24.
fn ptp_ranges(n: &Node) -> (String, String) {
    let v6: ipnet::Ipv6Net = n.cidr6.parse().expect("node cidr6");
    let v4: ipnet::Ipv4Net = n.cidr4.parse().expect("node cidr4");
    let v6 = v6
        .subnets(80)
        .expect("a /64 has /80s")
        .last()
        .expect("at least one /80");
    let v4 = v4
        .subnets(26)
        .expect("a /24 has /26s")
        .last()
        .expect("at least one /26");
    (v6.to_string(), v4.to_string())
}

const PTP_CONFLIST: &str = "00-ptp-comparison.conflist";

fn burst_manifest(name: &str, n: &Node) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{ name: {name}, namespace: {DEMO_NS} }}
spec:
  replicas: 0
  selector: {{ matchLabels: {{ app: {name} }} }}
  template:
    metadata:
      labels: {{ app: {name} }}
    spec:
      nodeName: {node}
      terminationGracePeriodSeconds: 0
      dnsPolicy: Default
      enableServiceLinks: false
      automountServiceAccountToken: false
      containers:
        - name: net
          image: {image}
          imagePullPolicy: Never
",
        node = n.name,
        image = super::super::images::NET
    )
}

/// One run: `name` scaled 0 -> [`BURST`] on `n`; (time to all Ready, per-pod RunPodSandbox
/// durations from containerd's log, the pods' addresses).
pub(crate) fn burst(name: &str, n: &Node) -> Result<(Duration, Vec<Duration>, Vec<PodView>)> {
    kubectl_stdin(&["apply", "-f", "-"], &burst_manifest(name, n))?;
    let t = Instant::now();
    kubectl(&[
        "-n",
        DEMO_NS,
        "scale",
        &format!("deployment/{name}"),
        &format!("--replicas={BURST}"),
    ])?;
    let mut last = Vec::new();
    sys::wait_for(Duration::from_secs(300), || {
        last = pods(DEMO_NS, &format!("app={name}")).unwrap_or_default();
        last.len() == BURST && last.iter().all(|p| p.ready)
    })
    .with_context(|| {
        format!(
            "{name}: {} of {BURST} pods Ready after 300 s",
            last.iter().filter(|p| p.ready).count()
        )
    })?;
    let took = t.elapsed();
    let log = std::fs::read_to_string(proc::log_path(&format!("{}-containerd", n.name)))
        .context("read containerd's log")?;
    let sandboxes = run_pod_sandbox_durations(&log, &format!("{name}-"));
    // Gone again (the DELs through the same plugin), before anything else changes.
    kubectl(&["-n", DEMO_NS, "delete", "deployment", name, "--wait=true"])?;
    sys::wait_for(Duration::from_secs(120), || {
        pods(DEMO_NS, &format!("app={name}")).is_ok_and(|p| p.is_empty())
    })
    .with_context(|| format!("{name}'s pods are not gone"))?;
    Ok((took, sandboxes, last))
}

/// Per pod whose name starts with `prefix`: the time from containerd's "RunPodSandbox for"
/// to its "returns sandbox id" (the sandbox's creation, CNI ADD included).
fn run_pod_sandbox_durations(log: &str, prefix: &str) -> Vec<Duration> {
    let mut started: BTreeMap<String, f64> = BTreeMap::new();
    let mut out = Vec::new();
    for line in log.lines() {
        // containerd 2: `RunPodSandbox for name:\"POD\"  uid:…`; 1.x:
        // `RunPodSandbox for &PodSandboxMetadata{Name:POD,…`.
        let pod = if let Some(rest) = line.split("RunPodSandbox for name:\\\"").nth(1) {
            rest.split("\\\"").next()
        } else if let Some(rest) = line
            .split("RunPodSandbox for &PodSandboxMetadata{Name:")
            .nth(1)
        {
            rest.split(',').next()
        } else {
            continue;
        };
        let Some(pod) = pod else {
            continue;
        };
        if !pod.starts_with(prefix) {
            continue;
        }
        let Some(at) = log_time(line) else {
            continue;
        };
        if line.contains("returns sandbox id") {
            if let Some(from) = started.remove(pod) {
                out.push(Duration::from_secs_f64((at - from).max(0.0)));
            }
        } else {
            started.insert(pod.to_owned(), at);
        }
    }
    out.sort();
    out
}

/// Seconds since the epoch of a containerd log line's `time="2026-11-23T12:00:00.123456789Z"`.
fn log_time(line: &str) -> Option<f64> {
    let t = line.split("time=\"").nth(1)?.split('"').next()?;
    let (date, clock) = t.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut c = clock.splitn(3, ':');
    let (h, min) = (
        c.next()?.parse::<f64>().ok()?,
        c.next()?.parse::<f64>().ok()?,
    );
    let s: f64 = c.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}

pub(super) fn startup(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let (flock_node, ptp_node) = (&NODES[0], &NODES[1]);
    let (took_flock, sb_flock, pods_flock) = burst("burst-flock", flock_node)?;

    // The reference plugins, put first on the other node for the run.
    let host = node::dir(ptp_node).join("host");
    let kube = kube::ensure_built()?;
    for plugin in ["ptp", "host-local"] {
        let to = host.join("opt-cni-bin").join(plugin);
        std::fs::copy(kube.cni_plugin(plugin), &to)
            .with_context(|| format!("copy {plugin} to {}", to.display()))?;
    }
    let conflist = host.join("etc-cni-net.d").join(PTP_CONFLIST);
    std::fs::write(&conflist, ptp_conflist(ptp_node))
        .with_context(|| format!("write {}", conflist.display()))?;
    // containerd watches its CNI directory; give it a moment to load the new first file.
    std::thread::sleep(Duration::from_secs(2));
    let ptp = burst("burst-ptp", ptp_node);
    let removed = std::fs::remove_file(&conflist);
    let (took_ptp, sb_ptp, pods_ptp) = ptp?;
    removed.with_context(|| format!("remove {}", conflist.display()))?;

    let (v6, _) = ptp_ranges(ptp_node);
    let v6: ipnet::Ipv6Net = v6.parse().expect("the range just made");
    let ptp_addressed = pods_ptp
        .iter()
        .filter(|p| {
            p.ips.iter().any(|ip| {
                ip.parse()
                    .is_ok_and(|a: std::net::Ipv6Addr| v6.contains(&a))
            })
        })
        .count();
    if ptp_addressed != pods_ptp.len() {
        failures.push(format!(
            "{} of {} ptp pods have an address from host-local's range {v6}: containerd did \
             not take the ptp conflist",
            ptp_addressed,
            pods_ptp.len()
        ));
    }
    if pods_flock.iter().any(|p| p.ips.len() != 2) {
        failures.push("a flock pod of the burst lacks an address".to_owned());
    }
    for (what, sb) in [("flock", &sb_flock), ("ptp", &sb_ptp)] {
        if sb.len() != BURST {
            failures.push(format!(
                "{what}: {} RunPodSandbox pairs in containerd's log for {BURST} pods",
                sb.len()
            ));
        }
    }
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let _ = writeln!(
        out,
        "POD START-UP AT SCALE (a Deployment scaled 0 -> {BURST} on one node; RunPodSandbox from containerd's log)"
    );
    let rows: Vec<Vec<String>> = [
        ("flock", flock_node, took_flock, &sb_flock),
        ("ptp + host-local", ptp_node, took_ptp, &sb_ptp),
    ]
    .into_iter()
    .map(|(what, n, took, sb)| {
        vec![
            what.to_owned(),
            n.name.to_owned(),
            format!("{:.1} s", took.as_secs_f64()),
            ms(percentile(sb, 0.5)),
            ms(percentile(sb, 0.99)),
        ]
    })
    .collect();
    sys::table(
        out,
        &[
            "plugin",
            "node",
            "all Ready after",
            "sandbox p50",
            "sandbox p99",
        ],
        &rows,
    );
    out.push('\n');
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_durations_pair_start_and_return_per_pod() {
        let log = r#"time="2026-11-23T12:00:00.100000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-flock-a,Uid:1,Namespace:demo,Attempt:0,}"
time="2026-11-23T12:00:00.200000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:other-b,Uid:2,Namespace:demo,Attempt:0,}"
time="2026-11-23T12:00:00.350000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-flock-a,Uid:1,Namespace:demo,Attempt:0,} returns sandbox id \"abc\""
time="2026-11-23T12:00:01.000000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:other-b,Uid:2,Namespace:demo,Attempt:0,} returns sandbox id \"def\""
"#;
        let d = run_pod_sandbox_durations(log, "burst-flock-");
        assert_eq!(d.len(), 1);
        assert!((d[0].as_secs_f64() - 0.25).abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn sandbox_durations_read_containerd_2s_log() {
        let log = r#"time="2026-11-25T19:52:14.457339038Z" level=info msg="RunPodSandbox for name:\"burst-flock-a\"  uid:\"7475\"  namespace:\"demo\""
time="2026-11-25T19:52:14.500000000Z" level=info msg="RunPodSandbox for name:\"other-b\"  uid:\"1\"  namespace:\"demo\""
time="2026-11-25T19:52:15.000000000Z" level=info msg="RunPodSandbox for name:\"burst-flock-a\"  uid:\"7475\"  namespace:\"demo\" returns sandbox id \"b83c\""
"#;
        let d = run_pod_sandbox_durations(log, "burst-flock-");
        assert_eq!(d.len(), 1, "{d:?}");
        assert!((d[0].as_secs_f64() - 0.542660962).abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn log_time_is_seconds_since_the_epoch() {
        let t = log_time(r#"time="1970-01-02T00:00:01.5Z" level=info"#).unwrap();
        assert!((t - 86_401.5).abs() < 1e-6);
        let t = log_time(r#"time="2000-03-01T00:00:00Z""#).unwrap();
        assert!((t - 951_868_800.0).abs() < 1e-6);
    }

    #[test]
    fn ptp_ranges_are_corners_of_the_node_cidrs() {
        let (v6, v4) = ptp_ranges(&NODES[1]);
        assert_eq!(v6, "2001:db8:c2:0:ffff::/80");
        assert_eq!(v4, "10.201.2.192/26");
    }
}
