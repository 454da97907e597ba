//! `cargo xtask cluster life services`: Service addresses over BGP, seen from the router (a
//! client outside the cluster).
//!
//! - A dual-stack `type: LoadBalancer` Service in front of `web` gets an address of each
//!   family from the pools' `loadBalancerCIDRs` (flock's controller writes its status); the
//!   router learns each with a next hop per node (`externalTrafficPolicy: Cluster`) and GETs
//!   a page through every one of them, over both families. Timed: creation → addresses in
//!   the status → routes at the router.
//! - `externalTrafficPolicy: Local`, then `web` moved onto node1 alone: node2's next hop goes
//!   when its last endpoint leaves the EndpointSlice. Timed: the slice's last event with an
//!   endpoint of node2 (a watch of the slices) → the router's route without node2 (polled
//!   every 20 ms).
//! - An external IP outside the pools' `externalIPCIDRs` is refused: no route, and a Warning
//!   event `AddressRefused` names the Service and the address.
//! - The cluster IP ranges are announced from every node (the router's routes to them have a
//!   next hop per node): the pools follow the cluster's `ServiceCIDR`s
//!   (`followServiceCIDRs`). A ServiceCIDR created is routed from every node within seconds,
//!   a Service with a cluster IP in it answers GETs from the router through each node, and
//!   the routes go when the ServiceCIDR is deleted. Timed.
//! - Deleting the Service withdraws its routes. Timed.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cluster::deploy::{DEMO_NS, WEB_REPLICAS};
use crate::cluster::proc::Place;
use crate::cluster::{
    NODES, Node, ROUTER, SERVICE_CIDR, SERVICE_CIDR4, kubectl, kubectl_stdin, site,
};
use crate::sys;

const SERVICE: &str = "web-lb";
/// A ServiceCIDR beyond the apiserver's `--service-cluster-ip-range`, and a Service in it.
const EXTRA_CIDR: &str = "flock-life-extra";
const EXTRA_RANGES: [&str; 2] = ["2001:db8:c6::/112", "10.206.0.0/24"];
const EXTRA_SERVICE: &str = "web-extra";
const EXTRA_IPS: [&str; 2] = ["2001:db8:c6::80", "10.206.0.80"];
/// An external IP no pool allows.
const REFUSED: &str = "2001:db8:dead::80";

pub fn services(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let result = run(out, &mut failures);
    for service in [SERVICE, EXTRA_SERVICE] {
        let _ = kubectl(&[
            "-n",
            DEMO_NS,
            "delete",
            "service",
            service,
            "--ignore-not-found",
        ]);
    }
    let _ = kubectl(&["delete", "servicecidr", EXTRA_CIDR, "--ignore-not-found"]);
    let _ = spread_web();
    result?;
    out.push('\n');
    Ok(failures)
}

fn manifest(policy: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{ name: {SERVICE}, namespace: {DEMO_NS} }}
spec:
  type: LoadBalancer
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  externalTrafficPolicy: {policy}
  externalIPs: [\"{REFUSED}\"]
  selector: {{ app: web }}
  ports: [{{ port: 80, targetPort: 80 }}]
"
    )
}

fn ingress() -> Vec<String> {
    kubectl(&[
        "-n",
        DEMO_NS,
        "get",
        "service",
        SERVICE,
        "-o",
        "jsonpath={range .status.loadBalancer.ingress[*]}{.ip} {end}",
    ])
    .map(|s| s.split_whitespace().map(str::to_owned).collect())
    .unwrap_or_default()
}

/// The nodes the router's route to `addr` goes through (by the link it leaves on).
fn next_hops(addr: &str) -> BTreeSet<String> {
    let family = if addr.contains(':') { "-6" } else { "-4" };
    let text = Place::Net(ROUTER.to_owned())
        .run(&["ip", family, "route", "show", addr])
        .unwrap_or_default();
    NODES
        .iter()
        .filter(|n| format!("{text} ").contains(&format!("dev {} ", n.router_if)))
        .map(|n| n.name.to_owned())
        .collect()
}

fn all_nodes() -> BTreeSet<String> {
    NODES.iter().map(|n| n.name.to_owned()).collect()
}

/// A GET from the router through `n`'s link to `addr`; the page is the pod's hostname.
fn get_via(n: &Node, addr: &str) -> Result<String> {
    let url = if addr.contains(':') {
        format!("http://[{addr}]/")
    } else {
        format!("http://{addr}/")
    };
    let _steer = site::Steer::to(addr, n)?;
    Ok(Place::Net(ROUTER.to_owned())
        .run(&[
            "curl",
            "-sS",
            "--max-time",
            "2",
            "--interface",
            n.router_if,
            &url,
        ])?
        .trim()
        .to_owned())
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn run(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    // Created with Cluster: every node announces its addresses.
    let t = Instant::now();
    kubectl_stdin(&["apply", "-f", "-"], &manifest("Cluster"))?;
    let mut addrs = Vec::new();
    sys::wait_for(Duration::from_secs(30), || {
        addrs = ingress();
        addrs.len() == 2
    })
    .with_context(|| format!("{SERVICE} got no LoadBalancer address of each family: {addrs:?}"))?;
    let assigned = t.elapsed();
    let routed = sys::wait_for(Duration::from_secs(30), || {
        addrs.iter().all(|a| next_hops(a) == all_nodes())
    });
    let at_router = t.elapsed();
    if routed.is_err() {
        failures.push(format!(
            "services: the router's next hops to {addrs:?}: {:?}, want every node",
            addrs.iter().map(|a| next_hops(a)).collect::<Vec<_>>()
        ));
    }
    // The route is there as soon as BIRD has it; the node serves the address once kube-proxy
    // has synced the Service's status into its rules (about a second later): each GET is
    // retried until then, and the time of its first answer is reported.
    let mut gets = Vec::new();
    let mut served = Duration::ZERO;
    for a in &addrs {
        for n in &NODES {
            let mut last = Err(anyhow::anyhow!("not tried"));
            let ok = sys::wait_for(Duration::from_secs(20), || {
                last = get_via(n, a);
                last.as_ref().is_ok_and(|page| page.starts_with("web-"))
            });
            match (ok, last) {
                (Ok(()), Ok(page)) => {
                    served = served.max(t.elapsed());
                    gets.push(format!("{a} via {}: {page}", n.name));
                }
                (_, Ok(page)) => failures.push(format!(
                    "services: GET {a} via {} answered {page:?}",
                    n.name
                )),
                (_, Err(e)) => failures.push(format!("services: GET {a} via {}: {e:#}", n.name)),
            }
        }
    }
    // The refused external IP: an event, no route.
    let refused = sys::wait_for(Duration::from_secs(20), || {
        kubectl(&[
            "-n",
            DEMO_NS,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={SERVICE},reason=AddressRefused"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .is_ok_and(|m| m.contains(REFUSED))
    });
    if refused.is_err() {
        failures.push(format!("services: no AddressRefused event names {REFUSED}"));
    }
    if !next_hops(REFUSED).is_empty() {
        failures.push(format!("services: the router routes the refused {REFUSED}"));
    }
    // The cluster IP ranges, announced from every node.
    let ranges: Vec<String> = [SERVICE_CIDR, SERVICE_CIDR4]
        .iter()
        .map(|r| format!("{r} via {:?}", next_hops(r)))
        .collect();
    for r in [SERVICE_CIDR, SERVICE_CIDR4] {
        if next_hops(r) != all_nodes() {
            failures.push(format!(
                "services: the router's route to the cluster IP range {r}: {:?}",
                next_hops(r)
            ));
        }
    }

    let extra = extra_service_cidr(failures)?;

    // Local, and web's endpoints moved onto node1: node2's next hop goes.
    kubectl_stdin(&["apply", "-f", "-"], &manifest("Local"))?;
    let watch = SliceWatch::start()?;
    let hops = Arc::new(Mutex::new(Vec::<Hops>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (hops, stop, addr) = (Arc::clone(&hops), Arc::clone(&stop), addrs[0].clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let now = next_hops(&addr);
                let mut h = hops.lock().expect("hops");
                if h.last().is_none_or(|(_, last)| *last != now) {
                    h.push((Instant::now(), now));
                }
                drop(h);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    place_web(&format!(
        r#"{{"kubernetes.io/hostname":"{}"}}"#,
        NODES[0].name
    ))?;
    let only_node1: BTreeSet<String> = [NODES[0].name.to_owned()].into();
    let withdrawn = sys::wait_for(Duration::from_secs(30), || {
        addrs.iter().all(|a| next_hops(a) == only_node1)
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = poller.join();
    let slices = watch.stop();
    if withdrawn.is_err() {
        failures.push(format!(
            "services: with Local and web on node1 only, the router's next hops are {:?}",
            addrs.iter().map(|a| next_hops(a)).collect::<Vec<_>>()
        ));
    }
    let node2 = NODES[1].name;
    let last_with_node2 = slices
        .iter()
        .position(|(_, nodes)| !nodes.contains(node2))
        .and_then(|i| (i > 0).then(|| slices[i].0));
    let route_gone = hops
        .lock()
        .expect("hops")
        .iter()
        .find(|(_, h)| !h.contains(node2))
        .map(|(t, _)| *t);
    let first_without_node2 = slices
        .first()
        .is_some_and(|(_, nodes)| !nodes.contains(node2));
    let withdrawal = match (last_with_node2, route_gone) {
        (Some(a), Some(b)) if b >= a => secs(b - a),
        (Some(_), Some(_)) => "before the slice event arrived at the watch".to_owned(),
        // The watch's first event already lacked node2 (it started after the change): the
        // withdrawal is checked above, only its time is unknown.
        (None, Some(_)) if first_without_node2 => {
            "not timed: the slice had lost node2 by the watch's first event".to_owned()
        }
        _ => {
            failures.push(format!(
                "services: could not time the withdrawal (slice events {}, route changes {})",
                slices.len(),
                hops.lock().expect("hops").len()
            ));
            "?".to_owned()
        }
    };
    let local_hops: Vec<BTreeSet<String>> = addrs.iter().map(|a| next_hops(a)).collect();
    let local_gets: Vec<String> = addrs
        .iter()
        .map(|a| match get_via(&NODES[0], a) {
            Ok(p) => format!("{a}: {p}"),
            Err(e) => {
                failures.push(format!("services: GET {a} via node1 under Local: {e:#}"));
                format!("{a}: failed")
            }
        })
        .collect();

    // Deleted: the routes go.
    let t = Instant::now();
    kubectl(&["-n", DEMO_NS, "delete", "service", SERVICE])?;
    let gone = sys::wait_for(Duration::from_secs(30), || {
        addrs.iter().all(|a| next_hops(a).is_empty())
    });
    let deleted = t.elapsed();
    if gone.is_err() {
        failures.push(format!(
            "services: {addrs:?} still routed 30 s after {SERVICE} was deleted"
        ));
    }
    let _ = writeln!(
        out,
        "SERVICES (LoadBalancer {SERVICE} in front of web, dual-stack, addresses from the pools' \
         loadBalancerCIDRs; from the router)"
    );
    let rows = vec![
        vec![
            format!("addresses in its status: {}", addrs.join(" ")),
            secs(assigned),
        ],
        vec![
            format!("routes at the router, next hops {:?}", all_nodes()),
            secs(at_router),
        ],
        vec![
            format!("every GET through each node answered ({})", gets.len()),
            secs(served),
        ],
        vec!["answers".to_owned(), gets.join("; ")],
        vec![
            format!("external IP {REFUSED} (outside externalIPCIDRs)"),
            "refused: Warning AddressRefused, no route".to_owned(),
        ],
        vec![
            "cluster IP ranges (the ServiceCIDR kubernetes)".to_owned(),
            ranges.join("; "),
        ],
        vec![
            format!("ServiceCIDR {EXTRA_CIDR} {EXTRA_RANGES:?} created → routed from every node"),
            secs(extra.routed),
        ],
        vec![
            format!("GETs to {EXTRA_SERVICE} {EXTRA_IPS:?} through each node"),
            extra.gets.join("; "),
        ],
        vec![
            format!("ServiceCIDR {EXTRA_CIDR} deleted (its Service first) → routes gone"),
            secs(extra.withdrawn),
        ],
        vec![
            "Local, web on node1 only: next hops, GETs".to_owned(),
            format!("{local_hops:?}; {}", local_gets.join("; ")),
        ],
        vec![
            "node2's last endpoint gone from the slice → its next hop gone".to_owned(),
            withdrawal,
        ],
        vec!["Service deleted → routes gone".to_owned(), secs(deleted)],
    ];
    sys::table(out, &["", ""], &rows);
    Ok(())
}

/// What [`extra_service_cidr`] measured.
struct Extra {
    routed: Duration,
    gets: Vec<String>,
    withdrawn: Duration,
}

/// Creates the ServiceCIDR [`EXTRA_CIDR`], waits for the router to route its ranges through
/// every node, GETs a Service with a cluster IP of each family in it through each node, then
/// deletes the Service and the ServiceCIDR and waits for the routes to go.
fn extra_service_cidr(failures: &mut Vec<String>) -> Result<Extra> {
    let t = Instant::now();
    kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {{ name: {EXTRA_CIDR} }}
spec: {{ cidrs: [\"{}\", \"{}\"] }}
",
            EXTRA_RANGES[0], EXTRA_RANGES[1]
        ),
    )?;
    let routed = sys::wait_for(Duration::from_secs(30), || {
        EXTRA_RANGES.iter().all(|r| next_hops(r) == all_nodes())
    });
    let routed = match routed {
        Ok(()) => t.elapsed(),
        Err(_) => {
            failures.push(format!(
                "services: ServiceCIDR {EXTRA_CIDR} not routed from every node after 30 s: {:?}",
                EXTRA_RANGES.map(next_hops)
            ));
            t.elapsed()
        }
    };
    // The apiserver hands out an address of a new ServiceCIDR once the ServiceCIDR is Ready.
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "--timeout=30s",
        &format!("servicecidr/{EXTRA_CIDR}"),
    ])?;
    kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1
kind: Service
metadata: {{ name: {EXTRA_SERVICE}, namespace: {DEMO_NS} }}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  clusterIP: \"{0}\"
  clusterIPs: [\"{0}\", \"{1}\"]
  selector: {{ app: web }}
  ports: [{{ port: 80, targetPort: 80 }}]
",
            EXTRA_IPS[0], EXTRA_IPS[1]
        ),
    )?;
    let mut gets = Vec::new();
    for ip in EXTRA_IPS {
        for n in &NODES {
            // kube-proxy programs the Service within a second or two.
            let mut answer = Err(anyhow::anyhow!("not tried"));
            let _ = sys::wait_for(Duration::from_secs(20), || {
                answer = get_via(n, ip);
                answer.as_ref().is_ok_and(|a| a.starts_with("web-"))
            });
            match answer {
                Ok(a) if a.starts_with("web-") => gets.push(format!("{ip} via {}: {a}", n.name)),
                other => {
                    gets.push(format!("{ip} via {}: no answer", n.name));
                    failures.push(format!(
                        "services: GET {ip} ({EXTRA_SERVICE}, ServiceCIDR {EXTRA_CIDR}) through \
                         {}: {other:?}",
                        n.name
                    ));
                }
            }
        }
    }
    kubectl(&["-n", DEMO_NS, "delete", "service", EXTRA_SERVICE, "--wait"])?;
    let t = Instant::now();
    kubectl(&[
        "delete",
        "servicecidr",
        EXTRA_CIDR,
        "--wait",
        "--timeout=60s",
    ])?;
    let gone = sys::wait_for(Duration::from_secs(30), || {
        EXTRA_RANGES.iter().all(|r| next_hops(r).is_empty())
    });
    if gone.is_err() {
        failures.push(format!(
            "services: ServiceCIDR {EXTRA_CIDR} still routed 30 s after it was deleted: {:?}",
            EXTRA_RANGES.map(next_hops)
        ));
    }
    Ok(Extra {
        routed,
        gets,
        withdrawn: t.elapsed(),
    })
}

/// Sets `web`'s pod template's `nodeSelector` (JSON; `null` removes it) and waits for the
/// rollout.
fn place_web(node_selector: &str) -> Result<()> {
    kubectl(&[
        "-n",
        DEMO_NS,
        "patch",
        "deployment",
        "web",
        "-p",
        &format!(r#"{{"spec":{{"template":{{"spec":{{"nodeSelector":{node_selector}}}}}}}}}"#),
    ])?;
    kubectl(&[
        "-n",
        DEMO_NS,
        "rollout",
        "status",
        "deployment/web",
        "--timeout=180s",
    ])?;
    Ok(())
}

/// web back to both nodes.
fn spread_web() -> Result<()> {
    place_web("null")?;
    // A rollout does not rebalance: scale through zero so the scheduler spreads them again.
    super::super::deploy::scale_web(0, Duration::from_secs(120))?;
    super::super::deploy::scale_web(WEB_REPLICAS, Duration::from_secs(180))?;
    Ok(())
}

/// `kubectl get endpointslices --watch -o json` for the Service: for each event of its IPv6
/// slice, the nodes with a ready endpoint.
struct SliceWatch {
    child: Child,
    events: Arc<Mutex<Vec<Hops>>>,
}

/// When, and which nodes (with a ready endpoint, or as the route's next hops).
type Hops = (Instant, BTreeSet<String>);

impl SliceWatch {
    fn start() -> Result<SliceWatch> {
        let mut cmd = crate::cluster::kubectl_command();
        cmd.args([
            "-n",
            DEMO_NS,
            "get",
            "endpointslices",
            "-l",
            &format!("kubernetes.io/service-name={SERVICE}"),
            "--watch",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .context("spawn kubectl get endpointslices --watch")?;
        let stdout = child.stdout.take().context("the watch's stdout")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&events);
        std::thread::spawn(move || {
            for slice in serde_json::Deserializer::from_reader(stdout).into_iter::<Value>() {
                let Ok(slice) = slice else { break };
                // The route timed is the IPv6 address's: its family's slice.
                if slice["addressType"] == "IPv6" {
                    sink.lock()
                        .expect("slices")
                        .push((Instant::now(), ready_nodes(&slice)));
                }
            }
        });
        // The watch lists what exists first.
        if sys::wait_for(Duration::from_secs(10), || {
            !events.lock().expect("slices").is_empty()
        })
        .is_err()
        {
            bail!("the EndpointSlice watch of {SERVICE} printed nothing");
        }
        Ok(SliceWatch { child, events })
    }

    fn stop(mut self) -> Vec<Hops> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::take(&mut *self.events.lock().expect("slices"))
    }
}

/// The nodes with a ready endpoint in an EndpointSlice (v1beta1: `topology`; v1: `nodeName`).
fn ready_nodes(slice: &Value) -> BTreeSet<String> {
    slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["conditions"]["ready"].as_bool() != Some(false))
        .filter_map(|e| {
            e["nodeName"]
                .as_str()
                .or(e["topology"]["kubernetes.io/hostname"].as_str())
                .map(str::to_owned)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_nodes_of_a_1_20_slice() {
        let slice = serde_json::json!({"endpoints": [
            {"conditions": {"ready": true}, "topology": {"kubernetes.io/hostname": "node1"}},
            {"conditions": {"ready": false}, "topology": {"kubernetes.io/hostname": "node2"}},
            {"conditions": {}, "nodeName": "node3"}
        ]});
        assert_eq!(
            ready_nodes(&slice),
            ["node1".to_owned(), "node3".to_owned()].into()
        );
    }
}
