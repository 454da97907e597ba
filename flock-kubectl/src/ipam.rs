//! `kubectl flock ipam check [--release]`: every address flock handed out, cross-checked
//! between the API's pods, each agent's store and each node's kernel. [`check`] is a pure
//! function of the three; [`to_release`] decides what `--release` may free.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use flock_agent::inspect::NodeReport;
use flock_agent::store::AllocationRecord;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

/// A pod as the API has it, as far as the check needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Its node (empty: not scheduled).
    pub node: String,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
    /// `hostNetwork` (its addresses are its node's).
    pub host_network: bool,
    /// Finished (`Succeeded`, `Failed`) or being deleted: its sandbox may be gone while the
    /// API still shows its addresses.
    pub ending: bool,
}

impl ApiPod {
    /// The pod's fields the check needs.
    pub fn of(pod: &Pod) -> ApiPod {
        let spec = pod.spec.as_ref();
        ApiPod {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            ips: pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ips.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|ip| ip.ip.parse().ok())
                .collect(),
            host_network: spec.and_then(|s| s.host_network) == Some(true),
            ending: pod.metadata.deletion_timestamp.is_some()
                || matches!(
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                ),
        }
    }
}

/// One node as the check sees it.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// The node.
    pub node: &'a str,
    /// Its NodeConfig's CIDRs.
    pub cidrs: &'a NodeCidrs,
    /// Its agent's report.
    pub report: &'a NodeReport,
}

/// A node's CIDRs, from its NodeConfig.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCidrs {
    /// The cluster network's (`spec.cidr6`, `spec.cidr4`).
    pub cluster: Vec<IpNet>,
    /// Each secondary network's (`spec.networks[]`), by name.
    pub networks: BTreeMap<String, Vec<IpNet>>,
}

impl NodeCidrs {
    /// The CIDRs of the network a record's addresses come from.
    fn of(&self, record: &AllocationRecord) -> &[IpNet] {
        match &record.flock_network {
            None => &self.cluster,
            Some(name) => self.networks.get(name).map_or(&[], Vec::as_slice),
        }
    }
}

/// Something wrong with an address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Finding {
    /// A store record whose pod the API does not have (on that node, with that UID).
    #[serde(rename_all = "camelCase")]
    Leaked {
        /// The node.
        node: String,
        /// The attachment's container ID.
        container_id: String,
        /// Its interface.
        if_name: String,
        /// Its CNI network.
        network: String,
        /// The pod the record names.
        pod: String,
        /// Its addresses.
        addresses: Vec<IpAddr>,
        /// Whether it is still on the node (its namespace or veth exists): then the runtime
        /// still has the sandbox, and only its DEL may free it.
        on_node: bool,
        /// Whether `--release` frees it: gone from the API and from the node.
        releasable: bool,
    },
    /// A `flock*` link no record owns.
    #[serde(rename_all = "camelCase")]
    OrphanedVeth {
        /// The node.
        node: String,
        /// The link.
        host_if: String,
    },
    /// A route through a `flock*` link for an address no record of that link holds.
    #[serde(rename_all = "camelCase")]
    OrphanedRoute {
        /// The node.
        node: String,
        /// The route's destination.
        dst: IpNet,
        /// Its links.
        host_ifs: Vec<String>,
    },
    /// An address two records hold (anycast addresses are shared by design, and left out).
    #[serde(rename_all = "camelCase")]
    Duplicated {
        /// The address.
        address: IpAddr,
        /// Who holds it: `node: namespace/name (container)`.
        holders: Vec<String>,
    },
    /// An address the pool gave outside the node's CIDRs.
    #[serde(rename_all = "camelCase")]
    OutOfCidr {
        /// The node.
        node: String,
        /// The address.
        address: IpAddr,
        /// The record's pod.
        pod: String,
        /// The node's CIDRs.
        cidrs: Vec<IpNet>,
    },
    /// A pod's address the API shows that no record of its node holds.
    #[serde(rename_all = "camelCase")]
    Unrecorded {
        /// The node.
        node: String,
        /// The pod.
        pod: String,
        /// The address.
        address: IpAddr,
    },
}

impl Finding {
    /// One line for people.
    pub fn line(&self) -> String {
        match self {
            Finding::Leaked {
                node,
                container_id,
                if_name,
                pod,
                addresses,
                on_node,
                releasable,
                ..
            } => {
                let a: Vec<String> = addresses.iter().map(ToString::to_string).collect();
                format!(
                    "leaked      {node}: {} for pod {pod} (container {}, {if_name}): the pod is gone \
                     from the API{}",
                    a.join(", "),
                    short(container_id),
                    match (on_node, releasable) {
                        (_, true) => " and from the node; --release frees it",
                        (true, _) => ", its sandbox is still on the node: its DEL will free it",
                        (false, false) => ", its veth is still on the node",
                    }
                )
            }
            Finding::OrphanedVeth { node, host_if } => {
                format!("orphaned    {node}: link {host_if}: no record owns it")
            }
            Finding::OrphanedRoute {
                node,
                dst,
                host_ifs,
            } => format!(
                "orphaned    {node}: route {dst} via {}: no record of the link holds it",
                host_ifs.join(", ")
            ),
            Finding::Duplicated { address, holders } => {
                format!("duplicated  {address}: held by {}", holders.join(" and "))
            }
            Finding::OutOfCidr {
                node,
                address,
                pod,
                cidrs,
            } => {
                let c: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
                format!(
                    "out-of-cidr {node}: {address} of pod {pod} is outside {}",
                    c.join(", ")
                )
            }
            Finding::Unrecorded { node, pod, address } => {
                format!(
                    "unrecorded  {node}: {address} of pod {pod}: no record of the node holds it"
                )
            }
        }
    }
}

fn short(container_id: &str) -> &str {
    &container_id[..container_id.len().min(12)]
}

fn pod_name(r: &AllocationRecord) -> String {
    r.pod
        .as_ref()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .unwrap_or_else(|| "(no pod)".to_owned())
}

/// The check's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamCheck {
    /// Records read, over every node.
    pub records: usize,
    /// Addresses they hold.
    pub addresses: usize,
    /// What is wrong.
    pub findings: Vec<Finding>,
    /// Sources that could not be read: a node's agent, store, links or routes. The check is
    /// incomplete, and `--release` frees nothing.
    pub unreadable: Vec<String>,
}

/// Cross-checks the API's pods, the stores and the kernels. `unreadable` names what could
/// not be read before (a node whose agent did not answer); a node's report that misses its
/// store, links or routes adds to it.
pub fn check(pods: &[ApiPod], nodes: &[NodeView<'_>], mut unreadable: Vec<String>) -> IpamCheck {
    let mut findings = Vec::new();
    let by_name: BTreeMap<(&str, &str), &ApiPod> = pods
        .iter()
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), p))
        .collect();
    let mut holders: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    let mut records = 0;
    for n in nodes {
        let node = n.node;
        let report = n.report;
        let (Some(store), Some(links), Some(routes)) =
            (report.store.ok(), report.host_ifs.ok(), report.routes.ok())
        else {
            for (what, e) in [
                ("store", report.store.error()),
                ("links", report.host_ifs.error()),
                ("routes", report.routes.error()),
            ] {
                if let Some(e) = e {
                    unreadable.push(format!("{node}: {what}: {e}"));
                }
            }
            continue;
        };
        records += store.len();
        let mut owned: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
        for a in store {
            let r = &a.record;
            let held: BTreeSet<IpAddr> = r
                .pooled_addresses()
                .into_iter()
                .chain(r.anycast.iter().copied())
                .collect();
            owned.entry(r.host_if.as_str()).or_default().extend(held);
            for addr in r.pooled_addresses() {
                holders.entry(addr).or_default().push(format!(
                    "{node}: {} ({})",
                    pod_name(r),
                    short(&r.container_id)
                ));
            }
            for (addr, cidr_family) in [
                (r.ipv6.map(IpAddr::V6), true),
                (r.ipv4.map(IpAddr::V4), false),
            ] {
                let Some(addr) = addr else { continue };
                let space = n.cidrs.of(r);
                let cidrs: Vec<IpNet> = space
                    .iter()
                    .filter(|c| matches!(c, IpNet::V6(_)) == cidr_family)
                    .copied()
                    .collect();
                if !cidrs.iter().any(|c| c.contains(&addr)) {
                    findings.push(Finding::OutOfCidr {
                        node: node.to_owned(),
                        address: addr,
                        pod: pod_name(r),
                        cidrs: space.to_vec(),
                    });
                }
            }
            let Some(pod) = &r.pod else { continue };
            let present = by_name
                .get(&(pod.namespace.as_str(), pod.name.as_str()))
                .is_some_and(|p| {
                    p.node == node && (pod.uid.is_empty() || p.uid.is_empty() || p.uid == pod.uid)
                });
            if !present {
                findings.push(Finding::Leaked {
                    node: node.to_owned(),
                    container_id: r.container_id.clone(),
                    if_name: r.if_name.clone(),
                    network: r.network.clone(),
                    pod: pod_name(r),
                    addresses: r.pooled_addresses(),
                    on_node: a.on_node || a.host_if_exists,
                    releasable: !a.on_node && !a.host_if_exists,
                });
            }
        }
        for link in links {
            if !owned.contains_key(link.as_str()) {
                findings.push(Finding::OrphanedVeth {
                    node: node.to_owned(),
                    host_if: link.clone(),
                });
            }
        }
        for route in routes {
            let held = route.host_ifs.iter().any(|h| {
                owned
                    .get(h.as_str())
                    .is_some_and(|a| a.contains(&route.dst.addr()))
            });
            if !held {
                findings.push(Finding::OrphanedRoute {
                    node: node.to_owned(),
                    dst: route.dst,
                    host_ifs: route.host_ifs.clone(),
                });
            }
        }
        let recorded: BTreeSet<IpAddr> = owned.values().flatten().copied().collect();
        for p in pods
            .iter()
            .filter(|p| p.node == node && !p.host_network && !p.ending)
        {
            for ip in &p.ips {
                if !recorded.contains(ip) {
                    findings.push(Finding::Unrecorded {
                        node: node.to_owned(),
                        pod: format!("{}/{}", p.namespace, p.name),
                        address: *ip,
                    });
                }
            }
        }
    }
    let addresses = holders.len();
    for (address, h) in holders {
        if h.len() > 1 {
            findings.push(Finding::Duplicated {
                address,
                holders: h,
            });
        }
    }
    IpamCheck {
        records,
        addresses,
        findings,
        unreadable,
    }
}

/// One attachment `--release` frees: its node, container ID, interface and network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    /// The node.
    pub node: String,
    /// The container ID.
    pub container_id: String,
    /// The interface.
    pub if_name: String,
    /// The CNI network.
    pub network: String,
}

/// What `--release` frees: the leaks gone from the API and the node, and nothing while any
/// source is unreadable (an unreadable store may hold the record that makes another one a
/// duplicate; an agent that did not answer may be the one whose pod it is) — then the
/// reason.
pub fn to_release(check: &IpamCheck) -> Result<Vec<Release>, String> {
    if !check.unreadable.is_empty() {
        return Err(format!(
            "{} source(s) could not be read: {}",
            check.unreadable.len(),
            check.unreadable.join("; ")
        ));
    }
    Ok(check
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::Leaked {
                node,
                container_id,
                if_name,
                network,
                releasable: true,
                ..
            } => Some(Release {
                node: node.clone(),
                container_id: container_id.clone(),
                if_name: if_name.clone(),
                network: network.clone(),
            }),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flock_agent::inspect::Read;

    use crate::fixtures::{self, no_bgp, record, stored};

    fn report(
        store: Vec<flock_agent::inspect::StoredAttachment>,
        links: &[&str],
        routes: &[(&str, &str)],
    ) -> NodeReport {
        fixtures::report(store, links, routes, no_bgp())
    }

    /// The check of one node's report.
    fn check_node(
        pods: &[ApiPod],
        cidrs: &[IpNet],
        r: &NodeReport,
        unreadable: Vec<String>,
    ) -> IpamCheck {
        let cidrs = NodeCidrs {
            cluster: cidrs.to_vec(),
            networks: BTreeMap::from([(
                "storage".to_owned(),
                vec!["2001:db8:5:1::/64".parse().unwrap()],
            )]),
        };
        check(
            pods,
            &[NodeView {
                node: "node1",
                cidrs: &cidrs,
                report: r,
            }],
            unreadable,
        )
    }

    #[test]
    fn a_secondary_networks_addresses_are_checked_against_its_own_cidrs() {
        let c = cidrs();
        let pods = [api("default/web", "u1", "node1", &["2001:db8:a1::7"])];
        let eth0 = record(
            "c1",
            "default/web",
            "u1",
            "2001:db8:a1::7",
            "10.101.1.7",
            "flockaaaa0001",
        );
        let net1 = |v6: &str| {
            let mut r = record("c1", "default/web", "u1", v6, "10.101.1.7", "flockaaaa0002");
            r.if_name = "net1".into();
            r.ipv4 = None;
            r.flock_network = Some("storage".into());
            r
        };
        let r = report(
            vec![
                stored(eth0.clone(), true),
                stored(net1("2001:db8:5:1::9"), true),
            ],
            &["flockaaaa0001", "flockaaaa0002"],
            &[],
        );
        let found = check_node(&pods, &c, &r, vec![]);
        assert!(found.findings.is_empty(), "{:?}", found.findings);
        // the storage record outside storage's CIDR (in the cluster network's): named
        let r = report(
            vec![stored(eth0, true), stored(net1("2001:db8:a1::9"), true)],
            &["flockaaaa0001", "flockaaaa0002"],
            &[],
        );
        let found = check_node(&pods, &c, &r, vec![]);
        assert!(
            matches!(&found.findings[..], [Finding::OutOfCidr { cidrs, .. }]
                if cidrs == &["2001:db8:5:1::/64".parse::<IpNet>().unwrap()]),
            "{:?}",
            found.findings
        );
    }

    fn api(pod: &str, uid: &str, node: &str, ips: &[&str]) -> ApiPod {
        let (ns, name) = pod.split_once('/').unwrap();
        ApiPod {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            node: node.into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            host_network: false,
            ending: false,
        }
    }

    fn cidrs() -> Vec<IpNet> {
        vec![
            "2001:db8:a1::/64".parse().unwrap(),
            "10.101.1.0/24".parse().unwrap(),
        ]
    }

    const V6: &str = "2001:db8:a1::5";
    const V4: &str = "10.101.1.5";

    fn healthy() -> NodeReport {
        report(
            vec![stored(
                record("c1", "default/web", "u1", V6, V4, "flock00000001"),
                true,
            )],
            &["flock00000001"],
            &[
                ("2001:db8:a1::5/128", "flock00000001"),
                ("10.101.1.5/32", "flock00000001"),
            ],
        )
    }

    /// A record whose namespace and veth are gone from the node.
    fn gone() -> NodeReport {
        let r = record("c1", "default/web", "u1", V6, V4, "flock00000001");
        report(vec![stored(r, false)], &[], &[])
    }

    #[test]
    fn agreeing_sources_find_nothing() {
        let (c, r) = (cidrs(), healthy());
        let pods = [api("default/web", "u1", "node1", &[V6, V4])];
        let got = check_node(&pods, &c, &r, vec![]);
        assert_eq!(got.findings, vec![]);
        assert_eq!((got.records, got.addresses), (1, 2));
        assert_eq!(to_release(&got).unwrap(), vec![]);
    }

    #[test]
    fn a_record_whose_pod_is_gone_from_api_and_node_is_a_releasable_leak() {
        let c = cidrs();
        let r = gone();
        let got = check_node(&[], &c, &r, vec![]);
        assert!(matches!(
            got.findings[..],
            [Finding::Leaked {
                releasable: true,
                ..
            }]
        ));
        let release = to_release(&got).unwrap();
        assert_eq!(release.len(), 1);
        assert_eq!(release[0].container_id, "c1");
        // the same pod name with another UID is another pod: still a leak
        let pods = [api("default/web", "u2", "node1", &[])];
        let got = check_node(&pods, &c, &r, vec![]);
        assert_eq!(to_release(&got).unwrap().len(), 1);
    }

    #[test]
    fn a_leak_still_on_the_node_is_reported_and_never_released() {
        let (c, r) = (cidrs(), healthy());
        let got = check_node(&[], &c, &r, vec![]);
        assert!(matches!(
            got.findings[..],
            [Finding::Leaked {
                on_node: true,
                releasable: false,
                ..
            }]
        ));
        assert_eq!(to_release(&got).unwrap(), vec![]);
    }

    #[test]
    fn nothing_is_released_while_any_source_is_unreadable() {
        let c = cidrs();
        let r = gone();
        let got = check_node(&[], &c, &r, vec!["node2: the agent did not answer".into()]);
        let e = to_release(&got).unwrap_err();
        assert!(e.contains("node2: the agent did not answer"), "{e}");
        let mut broken = healthy();
        broken.store = Read::Error("the store in /var/lib/flock: busy".into());
        let got = check_node(&[], &c, &broken, vec![]);
        assert_eq!(
            got.unreadable,
            ["node1: store: the store in /var/lib/flock: busy"]
        );
        assert!(to_release(&got).is_err());
    }

    #[test]
    fn orphans_duplicates_and_addresses_out_of_the_cidr() {
        let c = cidrs();
        let r1 = report(
            vec![
                stored(
                    record("c1", "default/web", "u1", V6, V4, "flock00000001"),
                    true,
                ),
                stored(
                    record("c2", "default/db", "u2", V6, "10.9.9.9", "flock00000002"),
                    true,
                ),
            ],
            &["flock00000001", "flock00000002", "flock0000dead"],
            &[
                ("2001:db8:a1::5/128", "flock00000001"),
                ("2001:db8:a1::77/128", "flock00000001"),
                ("10.101.1.6/32", "flock0000dead"),
            ],
        );
        let pods = [
            api("default/web", "u1", "node1", &[V6, V4]),
            api("default/db", "u2", "node1", &[V6, "10.9.9.9"]),
            api("default/other", "u3", "node1", &["2001:db8:a1::99"]),
        ];
        let got = check_node(&pods, &c, &r1, vec![]);
        let lines: Vec<String> = got.findings.iter().map(Finding::line).collect();
        let has = |s: &str| lines.iter().any(|l| l.contains(s));
        assert!(
            has("out-of-cidr node1: 10.9.9.9 of pod default/db"),
            "{lines:#?}"
        );
        assert!(has("orphaned    node1: link flock0000dead"), "{lines:#?}");
        assert!(
            has("route 2001:db8:a1::77/128 via flock00000001"),
            "{lines:#?}"
        );
        assert!(has("route 10.101.1.6/32 via flock0000dead"), "{lines:#?}");
        assert!(
            has(
                "duplicated  2001:db8:a1::5: held by node1: default/web (c1) and node1: default/db (c2)"
            ),
            "{lines:#?}"
        );
        assert!(
            has("unrecorded  node1: 2001:db8:a1::99 of pod default/other"),
            "{lines:#?}"
        );
        assert_eq!(lines.len(), 6, "{lines:#?}");
        // a finished or terminating pod's addresses stay in the API after its DEL: no finding
        let mut ending = pods.clone();
        ending[2].ending = true;
        let got = check_node(&ending, &c, &r1, vec![]);
        assert_eq!(got.findings.len(), 5, "{:#?}", got.findings);
        assert!(
            !got.findings
                .iter()
                .any(|f| matches!(f, Finding::Unrecorded { .. }))
        );
    }
}
