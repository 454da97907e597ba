//! `life multus`: flock under Multus (thick), as the cluster network behind it and as a
//! secondary network beside it (docs/multus.md). Multus is installed for the test unless it
//! is already (`cluster up --multus`), and removed again after.
//!
//! - A Deployment with a pod on each node, annotated for the `storage` NetworkAttachmentDefinition
//!   (flock, `"network": "storage"`, the rack pools' secondary network): each pod has `eth0`
//!   from the cluster network and `net1` from its node's storage prefix, one default route
//!   per family (through `eth0`), and the storage space through `net1`; pings and HTTP
//!   between the pods over each network and family; the router learns both spaces of both
//!   nodes; Multus's `network-status` annotation lists what flock returned.
//! - MTU: node1's uplink set to 1400, a new pod there gets 1400 on both interfaces without
//!   configuration; a NetworkAttachmentDefinition with `"mtu": 1300` gets 1300.
//! - A NetworkAttachmentDefinition naming a network the node lacks: the pod's sandbox fails
//!   with flock's error naming it, and nothing is allocated.
//! - The agent killed (-9) in the middle of a burst of such pods: every pod comes up, no
//!   address of either network is on two pods; deleting them all leaves no allocation, veth
//!   or route of either network (`kubectl flock ipam check`, and each node's store).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::super::deploy::{STORAGE_NETWORK, storage_space};
use super::super::proc::Place;
use super::super::{NODES, Node, ROUTER, images, kubectl, kubectl_stdin};
use super::super::{multus, site};
use super::{pid_in, signal};
use crate::sys;

/// The test's namespace.
const NS: &str = "multus-demo";
/// The Deployment whose pods have both networks.
const DUO: &str = "duo";

fn manifests() -> String {
    let nad = |name: &str, extra: &str| {
        format!(
            "apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{ name: {name}, namespace: {NS} }}
spec:
  config: '{{ \"cniVersion\": \"1.0.0\", \"name\": \"{name}\", \"type\": \"flock\"{extra} }}'
"
        )
    };
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{ name: {NS} }}
---
{storage}---
{mtu}---
{wrong}---
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: {DUO}, namespace: {NS} }}
spec:
  replicas: 2
  selector: {{ matchLabels: {{ app: {DUO} }} }}
  template:
    metadata:
      labels: {{ app: {DUO} }}
      annotations: {{ k8s.v1.cni.cncf.io/networks: {STORAGE_NETWORK} }}
    spec:
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector: {{ matchLabels: {{ app: {DUO} }} }}
{container}",
        storage = nad(
            STORAGE_NETWORK,
            &format!(", \"network\": \"{STORAGE_NETWORK}\"")
        ),
        mtu = nad(
            "storage-mtu",
            &format!(", \"network\": \"{STORAGE_NETWORK}\", \"mtu\": 1300")
        ),
        wrong = nad("wrong", ", \"network\": \"nosuch\""),
        container = container("      "),
    )
}

/// The pod spec's tail: the workloads' image serving HTTP on port 80.
fn container(indent: &str) -> String {
    format!(
        "{indent}terminationGracePeriodSeconds: 2
{indent}dnsPolicy: Default
{indent}enableServiceLinks: false
{indent}automountServiceAccountToken: false
{indent}containers:
{indent}  - name: net
{indent}    image: {image}
{indent}    imagePullPolicy: Never
{indent}    readinessProbe:
{indent}      httpGet: {{ path: /, port: 80 }}
{indent}      periodSeconds: 2
",
        image = images::NET
    )
}

/// A single pod on `node`, attached to the NetworkAttachmentDefinition `nad`.
fn lone_pod(name: &str, node: &str, nad: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NS}
  annotations: {{ k8s.v1.cni.cncf.io/networks: {nad} }}
spec:
  nodeName: {node}
{}",
        container("  ")
    )
}

fn exec(pod: &str, script: &str) -> Result<String> {
    kubectl(&["-n", NS, "exec", pod, "--", "sh", "-c", script])
}

/// A pod of the test as it sees itself: its node and each interface's global addresses and
/// MTU.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    node: String,
    /// interface → (addresses, MTU)
    ifaces: BTreeMap<String, (Vec<std::net::IpAddr>, u32)>,
    routes6: String,
    routes4: String,
}

impl Seen {
    fn of(pod: &str) -> Result<Seen> {
        let node = kubectl(&[
            "-n",
            NS,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.spec.nodeName}",
        ])?;
        let mut ifaces = BTreeMap::new();
        for iface in ["eth0", "net1"] {
            let addrs =
                exec(pod, &format!("ip -o addr show dev {iface} scope global")).unwrap_or_default();
            let link = exec(pod, &format!("ip -o link show dev {iface}")).unwrap_or_default();
            let mtu = link
                .split_whitespace()
                .skip_while(|w| *w != "mtu")
                .nth(1)
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            let ips = addrs
                .lines()
                .filter_map(|l| {
                    let mut w = l.split_whitespace();
                    w.find(|x| *x == "inet" || *x == "inet6")?;
                    w.next()?.split('/').next()?.parse().ok()
                })
                .collect();
            ifaces.insert(iface.to_owned(), (ips, mtu));
        }
        Ok(Seen {
            name: pod.to_owned(),
            node: node.trim().to_owned(),
            ifaces,
            routes6: exec(pod, "ip -6 route").unwrap_or_default(),
            routes4: exec(pod, "ip -4 route").unwrap_or_default(),
        })
    }

    fn addr(&self, iface: &str, v6: bool) -> Option<std::net::IpAddr> {
        self.ifaces
            .get(iface)?
            .0
            .iter()
            .find(|a| a.is_ipv6() == v6)
            .copied()
    }

    fn mtu(&self, iface: &str) -> u32 {
        self.ifaces.get(iface).map_or(0, |i| i.1)
    }
}

fn node_named(name: &str) -> Result<&'static Node> {
    NODES
        .iter()
        .find(|n| n.name == name)
        .with_context(|| format!("no node {name:?}"))
}

/// The running pods of the Deployment.
fn duo_pods() -> Result<Vec<String>> {
    let names = kubectl(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        &format!("app={DUO}"),
        "--field-selector",
        "status.phase=Running",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    Ok(names.split_whitespace().map(str::to_owned).collect())
}

fn scale(replicas: usize) -> Result<()> {
    kubectl(&[
        "-n",
        NS,
        "scale",
        &format!("deployment/{DUO}"),
        &format!("--replicas={replicas}"),
    ])?;
    kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        &format!("deployment/{DUO}"),
        "--timeout=180s",
    ])?;
    if replicas == 0 {
        sys::wait_for(Duration::from_secs(90), || {
            kubectl(&[
                "-n",
                NS,
                "get",
                "pods",
                "-l",
                &format!("app={DUO}"),
                "-o",
                "name",
            ])
            .is_ok_and(|p| p.trim().is_empty())
        })
        .context("the Deployment's pods did not go")?;
    }
    Ok(())
}

pub(super) fn multus(out: &mut String) -> Result<Vec<String>> {
    let had = multus::installed();
    if !had && let Err(e) = multus::install() {
        let removed = multus::uninstall();
        return Err(e.context(match removed {
            Ok(()) => "install Multus (removed again)".to_owned(),
            Err(r) => format!("install Multus (and removing it failed: {r:#})"),
        }));
    }
    let mut failures = Vec::new();
    let result = checks(out, &mut failures);
    // whatever happened: node1's uplink back to 1500, the namespace gone, Multus as it was
    let _ = Place::Net(NODES[0].ns()).run(&["ip", "link", "set", "uplink", "mtu", "1500"]);
    let _ = kubectl(&["delete", "namespace", NS, "--wait=true", "--timeout=120s"]);
    if !had {
        multus::uninstall().context("remove Multus")?;
    }
    result?;
    Ok(failures)
}

fn checks(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        &format!("deployment/{DUO}"),
        "--timeout=180s",
    ])?;
    two_networks(out, failures)?;
    mtu(out, failures)?;
    wrong_network(out, failures)?;
    burst(out, failures)?;
    Ok(())
}

/// Two pods, one per node, each with both networks: addresses, routes, traffic, the router.
fn two_networks(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let pods: Vec<Seen> = duo_pods()?
        .iter()
        .map(|p| Seen::of(p))
        .collect::<Result<_>>()?;
    let _ = writeln!(
        out,
        "MULTUS: A POD ON EACH NODE WITH eth0 (cluster network) AND net1 (storage)"
    );
    let mut rows = Vec::new();
    for p in &pods {
        let n = node_named(&p.node)?;
        let (s6, s4) = storage_space(n);
        let (s6, s4): (ipnet::IpNet, ipnet::IpNet) = (s6.parse()?, s4.parse()?);
        let (c6, c4): (ipnet::IpNet, ipnet::IpNet) = (n.cidr6.parse()?, n.cidr4.parse()?);
        let within =
            |a: Option<std::net::IpAddr>, net: ipnet::IpNet| a.is_some_and(|a| net.contains(&a));
        let ok = within(p.addr("eth0", true), c6)
            && within(p.addr("eth0", false), c4)
            && within(p.addr("net1", true), s6)
            && within(p.addr("net1", false), s4);
        if !ok {
            failures.push(format!(
                "{}: addresses not from their networks: {:?}",
                p.name, p.ifaces
            ));
        }
        let defaults = |routes: &str| -> Vec<String> {
            routes
                .lines()
                .filter(|l| l.starts_with("default"))
                .map(str::to_owned)
                .collect()
        };
        let (d6, d4) = (defaults(&p.routes6), defaults(&p.routes4));
        let one_default = d6.len() == 1
            && d4.len() == 1
            && d6[0].contains("dev eth0")
            && d4[0].contains("dev eth0");
        if !one_default {
            failures.push(format!(
                "{}: not one default route per family through eth0:\n{}\n{}",
                p.name, p.routes6, p.routes4
            ));
        }
        let storage_routed = p.routes6.contains("2001:db8:d0::/44 via fe80::1 dev net1")
            && p.routes4
                .lines()
                .any(|l| l.starts_with("10.211.0.0/16 via 169.254.1.1 dev net1"));
        if !storage_routed {
            failures.push(format!(
                "{}: the storage space is not routed through net1:\n{}\n{}",
                p.name, p.routes6, p.routes4
            ));
        }
        let show = |iface: &str| {
            p.ifaces.get(iface).map_or_else(String::new, |(a, _)| {
                a.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        };
        rows.push(vec![
            p.name.clone(),
            p.node.clone(),
            show("eth0"),
            show("net1"),
            format!(
                "{} ({} and {})",
                d6.len() + d4.len(),
                d6.join(""),
                d4.join("")
            ),
        ]);
    }
    sys::table(
        out,
        &["pod", "node", "eth0", "net1", "default routes"],
        &rows,
    );
    if pods.len() != 2 || pods[0].node == pods[1].node {
        bail!("the Deployment's two pods are not one per node: {pods:?}");
    }
    let _ = writeln!(
        out,
        "\nROUTES IN {} (ip -6 route; ip -4 route)\n{}{}",
        pods[0].name, pods[0].routes6, pods[0].routes4
    );

    // traffic over each network and family, both ways
    let mut rows = Vec::new();
    for (from, to) in [(&pods[0], &pods[1]), (&pods[1], &pods[0])] {
        for iface in ["eth0", "net1"] {
            for v6 in [true, false] {
                let Some(addr) = to.addr(iface, v6) else {
                    failures.push(format!("{} has no {iface} address", to.name));
                    continue;
                };
                let ping = exec(&from.name, &format!("ping -c 3 -W 2 -q {addr}"))
                    .is_ok_and(|o| o.contains(" 0% packet loss"));
                let http = exec(
                    &from.name,
                    &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {addr} 80 | head -n 1"),
                )
                .is_ok_and(|o| o.contains(" 200"));
                let via = exec(&from.name, &format!("ip route get {addr}")).unwrap_or_default();
                let dev_ok = via.contains(&format!("dev {iface}"));
                if !(ping && http && dev_ok) {
                    failures.push(format!(
                        "{} -> {} over {iface} ({addr}): ping {ping}, HTTP {http}, route {}",
                        from.name,
                        to.name,
                        via.trim()
                    ));
                }
                rows.push(vec![
                    format!("{} -> {}", from.node, to.node),
                    iface.to_owned(),
                    addr.to_string(),
                    (if ping { "ok" } else { "FAILED" }).to_owned(),
                    (if http { "200" } else { "FAILED" }).to_owned(),
                    (if dev_ok { iface } else { "WRONG" }).to_owned(),
                ]);
            }
        }
    }
    let _ = writeln!(out, "\nTRAFFIC BETWEEN THE PODS (3 pings; an HTTP GET)");
    sys::table(
        out,
        &["flow", "network", "to", "ping", "HTTP", "leaves by"],
        &rows,
    );

    // the router learns both spaces of both nodes
    let router = Place::Net(ROUTER.to_owned());
    let mut learned = String::new();
    for family in ["-6", "-4"] {
        learned.push_str(
            &router
                .run(&["ip", family, "route", "show", "proto", site::router_proto()])
                .unwrap_or_default(),
        );
    }
    let mut rows = Vec::new();
    for n in &NODES {
        let (s6, s4) = storage_space(n);
        let storage6 = format!("{}::/64", s6.trim_end_matches("::/48"));
        for (network, prefix) in [
            ("cluster", n.cidr6.to_owned()),
            ("cluster", n.cidr4.to_owned()),
            ("storage", storage6),
            ("storage", s4),
        ] {
            let line = learned
                .lines()
                .find(|l| l.starts_with(&format!("{prefix} ")))
                .map(str::to_owned);
            if line.is_none() {
                failures.push(format!("the router has no route for {}'s {prefix}", n.name));
            }
            rows.push(vec![
                n.name.to_owned(),
                network.to_owned(),
                prefix,
                line.map_or_else(|| "MISSING".into(), |l| l.trim().to_owned()),
            ]);
        }
    }
    let _ = writeln!(
        out,
        "\nTHE ROUTER LEARNS BOTH SPACES (ip route show proto {})",
        site::router_proto()
    );
    sys::table(out, &["node", "network", "prefix", "route"], &rows);

    // Multus reports what flock returned for net1
    let status = kubectl(&[
        "-n",
        NS,
        "get",
        "pod",
        &pods[0].name,
        "-o",
        "jsonpath={.metadata.annotations.k8s\\.v1\\.cni\\.cncf\\.io/network-status}",
    ])?;
    let listed: Value = serde_json::from_str(&status).unwrap_or(Value::Null);
    let net1 = listed
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["interface"] == "net1");
    let want: Vec<String> = pods[0]
        .ifaces
        .get("net1")
        .map(|(a, _)| a.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    let got: Vec<String> = net1
        .and_then(|n| n["ips"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|i| i.as_str().map(str::to_owned))
        .collect();
    if got.is_empty() || !want.iter().all(|w| got.contains(w)) {
        failures.push(format!(
            "Multus's network-status of {} lists net1 as {got:?}, the pod has {want:?}",
            pods[0].name
        ));
    }
    let _ = writeln!(
        out,
        "\nMultus's network-status of {}: net1 {}",
        pods[0].name,
        got.join(" ")
    );
    Ok(())
}

/// New pods on node1 after its uplink's MTU dropped to 1400: 1400 on both interfaces, 1300
/// where the NetworkAttachmentDefinition says so.
fn mtu(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let node1 = &NODES[0];
    Place::Net(node1.ns()).run(&["ip", "link", "set", "uplink", "mtu", "1400"])?;
    // the agent reads the uplink again within a second
    std::thread::sleep(Duration::from_millis(1500));
    kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "{}---\n{}",
            lone_pod("mtu-auto", node1.name, STORAGE_NETWORK),
            lone_pod("mtu-set", node1.name, "storage-mtu")
        ),
    )?;
    kubectl(&[
        "-n",
        NS,
        "wait",
        "--for=condition=Ready",
        "pod/mtu-auto",
        "pod/mtu-set",
        "--timeout=120s",
    ])?;
    let (auto, set) = (Seen::of("mtu-auto")?, Seen::of("mtu-set")?);
    Place::Net(node1.ns()).run(&["ip", "link", "set", "uplink", "mtu", "1500"])?;
    let _ = writeln!(
        out,
        "\nMTU ({}'s uplink set to 1400; no mtu in the cluster network's configuration)",
        node1.name
    );
    let rows = vec![
        vec![
            "mtu-auto".into(),
            format!("{}", auto.mtu("eth0")),
            format!("{}", auto.mtu("net1")),
            "1400 / 1400 (the uplink's)".into(),
        ],
        vec![
            "mtu-set".into(),
            format!("{}", set.mtu("eth0")),
            format!("{}", set.mtu("net1")),
            "1400 / 1300 (its NetworkAttachmentDefinition's mtu)".into(),
        ],
    ];
    sys::table(out, &["pod", "eth0", "net1", "expected"], &rows);
    if (auto.mtu("eth0"), auto.mtu("net1")) != (1400, 1400) {
        failures.push(format!(
            "a new pod on {} with its uplink at 1400 got eth0 {} and net1 {}",
            node1.name,
            auto.mtu("eth0"),
            auto.mtu("net1")
        ));
    }
    if (set.mtu("eth0"), set.mtu("net1")) != (1400, 1300) {
        failures.push(format!(
            "an explicit mtu 1300 gave eth0 {} and net1 {}",
            set.mtu("eth0"),
            set.mtu("net1")
        ));
    }
    kubectl(&[
        "-n",
        NS,
        "delete",
        "pod",
        "mtu-auto",
        "mtu-set",
        "--wait=true",
    ])?;
    Ok(())
}

/// A NetworkAttachmentDefinition naming a network no node has: the sandbox fails with
/// flock's error, and nothing is allocated for it.
fn wrong_network(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let node1 = &NODES[0];
    kubectl_stdin(
        &["apply", "-f", "-"],
        &lone_pod("wrong", node1.name, "wrong"),
    )?;
    let mut message = String::new();
    let seen = sys::wait_for(Duration::from_secs(60), || {
        message = kubectl(&[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=wrong,reason=FailedCreatePodSandBox",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .unwrap_or_default();
        message.contains("nosuch")
    });
    let _ = writeln!(
        out,
        "\nA NetworkAttachmentDefinition naming network \"nosuch\": the sandbox's error\n  {}",
        message
            .lines()
            .next()
            .map(|m| m.find("error adding container").map_or(m, |at| &m[at..]))
            .unwrap_or("(none)")
            .trim()
    );
    if seen.is_err() || !message.contains("no network of that name") {
        failures.push(format!(
            "a pod attached to network \"nosuch\" did not fail with flock's error: {message:?}"
        ));
    }
    kubectl(&[
        "-n",
        NS,
        "delete",
        "pod",
        "wrong",
        "--wait=true",
        "--timeout=60s",
    ])?;
    let records = stored_records(node1)?;
    if records.iter().any(|r| r["pod"]["name"] == "wrong") {
        failures.push(format!(
            "{} holds an allocation of the failed pod: {records:?}",
            node1.name
        ));
    }
    Ok(())
}

/// The store of `n`'s agent, through `flock-agent inspect` in its pod.
fn stored_records(n: &Node) -> Result<Vec<Value>> {
    let pod = super::agent_pod(n)?;
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let report: Value = serde_json::from_str(&kubectl(&[
        "-n",
        "kube-system",
        "exec",
        &name,
        "-c",
        "agent",
        "--",
        "flock-agent",
        "inspect",
    ])?)
    .context("parse flock-agent inspect")?;
    Ok(report["store"]["ok"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a["record"].clone())
        .collect())
}

/// node1's agent killed (-9) while 8 pods with both networks start: every pod comes up, no
/// address twice; all deleted, nothing of either network left.
fn burst(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let node1 = &NODES[0];
    let started = Instant::now();
    kubectl(&[
        "-n",
        NS,
        "scale",
        &format!("deployment/{DUO}"),
        "--replicas=8",
    ])?;
    // while the scheduler and the kubelets start the new sandboxes: their ADDs reach an
    // agent that is gone (the shims wait for it), and then the agent that has just started
    // again and is taking them is killed too
    std::thread::sleep(Duration::from_millis(100));
    let first = pid_in(node1, "flock-agent")?;
    signal(first, nix::sys::signal::Signal::SIGKILL)?;
    let mut kills = vec![started.elapsed()];
    let mut second = None;
    sys::wait_for(Duration::from_secs(60), || {
        second = pid_in(node1, "flock-agent").ok().filter(|p| *p != first);
        second.is_some()
    })
    .context("node1's agent did not start again")?;
    std::thread::sleep(Duration::from_millis(200));
    if let Some(pid) = second {
        signal(pid, nix::sys::signal::Signal::SIGKILL)?;
        kills.push(started.elapsed());
    }
    let killed_at = kills
        .iter()
        .map(|k| format!("{:.1} s", k.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(" and ");
    sys::wait_for(Duration::from_secs(240), || {
        kubectl(&[
            "-n",
            NS,
            "get",
            &format!("deployment/{DUO}"),
            "-o",
            "jsonpath={.status.readyReplicas}",
        ])
        .is_ok_and(|r| r.trim() == "8")
    })
    .context("the burst's 8 pods did not all become ready")?;
    let ready_at = started.elapsed();
    let restarts = super::agent_pod(node1)
        .map(|p| p["status"]["containerStatuses"][0]["restartCount"].clone())
        .unwrap_or_default();
    let pods: Vec<Seen> = duo_pods()?
        .iter()
        .map(|p| Seen::of(p))
        .collect::<Result<_>>()?;
    let mut holders: BTreeMap<std::net::IpAddr, Vec<String>> = BTreeMap::new();
    for p in &pods {
        for (iface, (addrs, _)) in &p.ifaces {
            for a in addrs {
                holders
                    .entry(*a)
                    .or_default()
                    .push(format!("{}/{iface}", p.name));
            }
        }
        if p.addr("net1", true).is_none() || p.addr("eth0", true).is_none() {
            failures.push(format!("{} lacks an interface: {:?}", p.name, p.ifaces));
        }
    }
    let twice: Vec<String> = holders
        .iter()
        .filter(|(_, h)| h.len() > 1)
        .map(|(a, h)| format!("{a}: {}", h.join(", ")))
        .collect();
    if !twice.is_empty() {
        failures.push(format!("addresses on two pods: {}", twice.join("; ")));
    }
    scale(0)?;
    // every DEL has reached its agent (the restarted one drained its queue)
    super::rollout_flock()?;
    let mut left = Vec::new();
    for n in &NODES {
        for r in stored_records(n)? {
            if r["pod"]["namespace"] == NS {
                left.push(format!(
                    "{}: {} {} ({})",
                    n.name,
                    r["pod"]["name"].as_str().unwrap_or("?"),
                    r["ifName"].as_str().unwrap_or("?"),
                    r["flockNetwork"].as_str().unwrap_or("cluster")
                ));
            }
        }
    }
    if !left.is_empty() {
        failures.push(format!("allocations left after the pods went: {left:?}"));
    }
    let check = super::operate::flock(&crate::lab::debug_bins(), &["ipam", "check"])?;
    let code = check.code;
    if code != 0 {
        failures.push(format!(
            "kubectl flock ipam check after the burst: exit {code}\n{}",
            check.stdout
        ));
    }
    let _ = writeln!(
        out,
        "\nBURST (6 more pods with both networks; {}'s agent killed -9 at {killed_at}, its container's restarts now {restarts})\n  all 8 ready at {:.1} s; {} addresses on {} pods, none twice: {}; after deleting them: {} allocations left; kubectl flock ipam check: exit {code}",
        node1.name,
        ready_at.as_secs_f64(),
        holders.len(),
        pods.len(),
        twice.is_empty(),
        left.len(),
    );
    Ok(())
}
