//! From the Kubernetes API objects to `flock-policy`'s plain input types, keeping only what
//! the model reads (labels, addresses, named ports, selectors). Pure.
//!
//! What the agent keeps of each object is decided here, so the memory of the cluster-wide
//! caches is a matter of this file: a Pod becomes a [`ClusterPod`] (labels, addresses, named
//! ports, its UID and node), a Namespace its labels, a NetworkPolicy a validated
//! [`flock_policy::Policy`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use flock_policy::{
    LabelSelector, Labels, NamedPort, Operator, Peer, Policy, PolicyTypes, Port, PortSpec,
    Protocol, Requirement, Rule,
};
use k8s_openapi::api::core::v1::{Namespace, Pod, PodSpec};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The pod annotations whose addresses a pod answers on besides `status.podIPs` (DESIGN §3):
/// kubelet records at most one address per family in `podIPs`.
pub const ADDRESS_ANNOTATIONS: [&str; 2] =
    ["flock.fritzlab.net/addresses", "flock.fritzlab.net/anycast"];

/// A policy the agent cannot use; the message names the policy, the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A field that is not what the API allows.
    #[error("{policy}: {field} = {value:?}: {reason}")]
    Field {
        /// Kind and name (`networkpolicy shop/web`, `clusternetworkpolicy guard`).
        policy: String,
        /// Where (`spec.ingress[0].ports[1].protocol`).
        field: String,
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// What `flock-policy`'s validation refused.
    #[error(transparent)]
    Invalid(#[from] flock_policy::Error),
}

/// What the agent keeps of a pod of the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterPod {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `metadata.labels`, shared with the other pods that have the same (see
    /// [`ClusterView::intern_labels`](super::view::ClusterView::intern_labels)).
    pub labels: Arc<Labels>,
    /// `status.podIPs`, plus the `addresses` and `anycast` annotations.
    pub addresses: Vec<IpAddr>,
    /// Named container ports.
    pub ports: Vec<NamedPort>,
}

/// The pod as the cache keeps it; `None` for a pod that is not flock's to judge or to match:
/// `hostNetwork` (its traffic is the node's) or finished (`Succeeded`, `Failed`: its addresses
/// may already be another pod's).
pub fn cluster_pod(pod: &Pod) -> Option<ClusterPod> {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network) == Some(true) {
        return None;
    }
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return None;
    }
    let mut addresses: Vec<IpAddr> = status
        .and_then(|s| s.pod_ips.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if addresses.is_empty()
        && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref())
        && let Ok(ip) = ip.parse()
    {
        addresses.push(ip);
    }
    if let Some(annotations) = &pod.metadata.annotations {
        addresses.extend(annotation_addresses(annotations));
    }
    addresses.sort();
    addresses.dedup();
    Some(ClusterPod {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        labels: Arc::new(pod.metadata.labels.clone().unwrap_or_default()),
        addresses,
        ports: spec.map(named_ports).unwrap_or_default(),
    })
}

/// The addresses of the `addresses` and `anycast` annotations. A malformed entry is skipped
/// here: ADD refuses such a pod (naming the annotation), so it never gets the address.
pub fn annotation_addresses(annotations: &BTreeMap<String, String>) -> Vec<IpAddr> {
    ADDRESS_ANNOTATIONS
        .iter()
        .filter_map(|k| annotations.get(*k))
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse().ok())
        .collect()
}

/// The named container ports of a pod (init containers' too: a sidecar's port can be named).
pub fn named_ports(spec: &PodSpec) -> Vec<NamedPort> {
    let mut ports: Vec<NamedPort> = spec
        .containers
        .iter()
        .chain(spec.init_containers.as_deref().unwrap_or_default())
        .flat_map(|c| c.ports.as_deref().unwrap_or_default())
        .filter_map(|p| {
            let name = p.name.clone().filter(|n| !n.is_empty())?;
            let port = u16::try_from(p.container_port).ok().filter(|p| *p > 0)?;
            let protocol = match p.protocol.as_deref() {
                None | Some("TCP") => Protocol::Tcp,
                Some("UDP") => Protocol::Udp,
                Some("SCTP") => Protocol::Sctp,
                Some(_) => return None,
            };
            Some(NamedPort {
                name,
                protocol,
                port,
            })
        })
        .collect();
    ports.sort();
    ports.dedup();
    ports
}

/// A namespace's labels.
pub fn namespace_labels(ns: &Namespace) -> Labels {
    ns.metadata.labels.clone().unwrap_or_default()
}

/// What the policy model keeps of a Namespace: its labels, and which of its pods' decisions
/// are logged (the [`decisions::ANNOTATION`](super::decisions::ANNOTATION)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Its labels.
    pub labels: Labels,
    /// What its pods log; `Err` names the annotation's value that says neither (then
    /// nothing is logged).
    pub log: Result<Option<flock_policy::LogMode>, String>,
}

impl Default for NamespaceInfo {
    /// No labels, nothing logged.
    fn default() -> NamespaceInfo {
        NamespaceInfo {
            labels: Labels::new(),
            log: Ok(None),
        }
    }
}

/// A Namespace as the policy model keeps it.
pub fn namespace(ns: &Namespace) -> NamespaceInfo {
    let log = ns
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(super::decisions::ANNOTATION))
        .map(|v| super::decisions::log_mode(v))
        .transpose()
        .map_err(|e| {
            format!(
                "namespace {}: {e} (nothing logged)",
                ns.metadata.name.as_deref().unwrap_or_default()
            )
        });
    NamespaceInfo {
        labels: namespace_labels(ns),
        log,
    }
}

/// A NetworkPolicy as `flock-policy` takes it, validated.
pub fn policy(np: &NetworkPolicy) -> Result<Policy, ConvertError> {
    let namespace = np.metadata.namespace.clone().unwrap_or_default();
    let name = np.metadata.name.clone().unwrap_or_default();
    let id = format!("networkpolicy {namespace}/{name}");
    let spec = np.spec.clone().unwrap_or_default();
    let policy_types = match &spec.policy_types {
        None => None,
        Some(types) => {
            let mut t = PolicyTypes::default();
            for (i, ty) in types.iter().enumerate() {
                match ty.as_str() {
                    "Ingress" => t.ingress = true,
                    "Egress" => t.egress = true,
                    _ => {
                        return Err(field(
                            &id,
                            format!("spec.policyTypes[{i}]"),
                            ty,
                            "must be Ingress or Egress",
                        ));
                    }
                }
            }
            Some(t)
        }
    };
    let pod_selector = selector(&id, "spec.podSelector", spec.pod_selector.as_ref())?;
    let mut ingress = Vec::new();
    for (i, r) in spec.ingress.iter().flatten().enumerate() {
        let f = format!("spec.ingress[{i}]");
        ingress.push(rule(
            &id,
            &f,
            "from",
            r.from.as_deref(),
            r.ports.as_deref(),
        )?);
    }
    let mut egress = Vec::new();
    for (i, r) in spec.egress.iter().flatten().enumerate() {
        let f = format!("spec.egress[{i}]");
        egress.push(rule(&id, &f, "to", r.to.as_deref(), r.ports.as_deref())?);
    }
    let policy = Policy {
        namespace,
        name,
        pod_selector,
        policy_types,
        ingress,
        egress,
    };
    policy.validate()?;
    Ok(policy)
}

fn field(policy: &str, field: String, value: &str, reason: &'static str) -> ConvertError {
    ConvertError::Field {
        policy: policy.to_owned(),
        field,
        value: value.to_owned(),
        reason,
    }
}

fn rule(
    id: &str,
    at: &str,
    peer_word: &str,
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
) -> Result<Rule, ConvertError> {
    let mut rule = Rule::default();
    for (j, p) in peers.unwrap_or_default().iter().enumerate() {
        let f = format!("{at}.{peer_word}[{j}]");
        let peer = match (&p.ip_block, &p.namespace_selector, &p.pod_selector) {
            (Some(block), None, None) => Peer::IpBlock {
                cidr: block.cidr.clone(),
                except: block.except.clone().unwrap_or_default(),
            },
            (Some(_), _, _) => {
                return Err(field(
                    id,
                    format!("{f}.ipBlock"),
                    "ipBlock with a selector",
                    "ipBlock may not be combined with podSelector or namespaceSelector",
                ));
            }
            (None, ns, pods) => Peer::Pods {
                namespace_selector: ns
                    .as_ref()
                    .map(|s| selector(id, &format!("{f}.namespaceSelector"), Some(s)))
                    .transpose()?,
                pod_selector: pods
                    .as_ref()
                    .map(|s| selector(id, &format!("{f}.podSelector"), Some(s)))
                    .transpose()?,
            },
        };
        rule.peers.push(peer);
    }
    for (k, p) in ports.unwrap_or_default().iter().enumerate() {
        let f = format!("{at}.ports[{k}]");
        let protocol = match p.protocol.as_deref() {
            None | Some("TCP") => Protocol::Tcp,
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            Some(other) => {
                return Err(field(
                    id,
                    format!("{f}.protocol"),
                    other,
                    "must be TCP, UDP or SCTP",
                ));
            }
        };
        let port = match &p.port {
            None => None,
            Some(IntOrString::Int(n)) => Some(Port::Number(u16::try_from(*n).map_err(|_| {
                field(
                    id,
                    format!("{f}.port"),
                    &n.to_string(),
                    "must be 1 to 65535",
                )
            })?)),
            Some(IntOrString::String(s)) => Some(Port::Name(s.clone())),
        };
        let end_port = p
            .end_port
            .map(|e| {
                u16::try_from(e).map_err(|_| {
                    field(
                        id,
                        format!("{f}.endPort"),
                        &e.to_string(),
                        "must be 1 to 65535",
                    )
                })
            })
            .transpose()?;
        rule.ports.push(PortSpec {
            protocol,
            port,
            end_port,
        });
    }
    Ok(rule)
}

/// A label selector; `None` (absent) is the empty selector, which selects everything.
pub(crate) fn selector(
    id: &str,
    at: &str,
    s: Option<&meta::LabelSelector>,
) -> Result<LabelSelector, ConvertError> {
    let Some(s) = s else {
        return Ok(LabelSelector::all());
    };
    let mut out = LabelSelector {
        match_labels: s.match_labels.clone().unwrap_or_default(),
        match_expressions: Vec::new(),
    };
    for (i, r) in s.match_expressions.iter().flatten().enumerate() {
        let operator = match r.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(field(
                    id,
                    format!("{at}.matchExpressions[{i}].operator"),
                    other,
                    "must be In, NotIn, Exists or DoesNotExist",
                ));
            }
        };
        out.match_expressions.push(Requirement {
            key: r.key.clone(),
            operator,
            values: r.values.clone().unwrap_or_default(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn np(spec: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "namespace": "shop", "name": "web" },
            "spec": spec,
        }))
        .expect("fixture")
    }

    #[test]
    fn a_full_policy_converts_field_for_field() {
        let p = policy(&np(json!({
            "podSelector": { "matchLabels": { "app": "web" },
                             "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["a"] }] },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [
                    { "podSelector": { "matchLabels": { "role": "client" } } },
                    { "namespaceSelector": {}, "podSelector": { "matchLabels": { "x": "y" } } },
                    { "ipBlock": { "cidr": "2001:db8::/32", "except": ["2001:db8:1::/48"] } }
                ],
                "ports": [
                    { "port": "http" },
                    { "protocol": "UDP", "port": 53 },
                    { "protocol": "SCTP", "port": 1000, "endPort": 2000 }
                ]
            }],
            "egress": [{}]
        })))
        .expect("valid");
        assert_eq!(p.namespace, "shop");
        assert_eq!(
            p.policy_types,
            Some(PolicyTypes {
                ingress: true,
                egress: true
            })
        );
        assert_eq!(p.pod_selector.match_expressions[0].operator, Operator::In);
        let r = &p.ingress[0];
        assert_eq!(
            r.peers[0],
            Peer::pods(LabelSelector::labels([("role", "client")]))
        );
        assert_eq!(
            r.peers[1],
            Peer::Pods {
                namespace_selector: Some(LabelSelector::all()),
                pod_selector: Some(LabelSelector::labels([("x", "y")])),
            }
        );
        assert_eq!(
            r.peers[2],
            Peer::ip_block("2001:db8::/32", &["2001:db8:1::/48"])
        );
        assert_eq!(
            r.ports,
            [
                PortSpec::name(Protocol::Tcp, "http"),
                PortSpec::number(Protocol::Udp, 53),
                PortSpec::range(Protocol::Sctp, 1000, 2000)
            ]
        );
        assert_eq!(
            p.egress,
            [Rule::default()],
            "an empty egress rule allows all"
        );
    }

    #[test]
    fn absent_spec_parts_take_the_api_defaults() {
        let p = policy(&np(json!({}))).expect("valid");
        assert_eq!(p.pod_selector, LabelSelector::all());
        assert_eq!(p.policy_types, None);
        assert!(p.effective_types().ingress && !p.effective_types().egress);
    }

    #[test]
    fn bad_fields_are_named_with_their_value() {
        let cases = [
            (
                json!({ "policyTypes": ["Sideways"] }),
                "networkpolicy shop/web: spec.policyTypes[0] = \"Sideways\"",
            ),
            (
                json!({ "ingress": [{ "ports": [{ "protocol": "ICMP" }] }] }),
                "spec.ingress[0].ports[0].protocol = \"ICMP\"",
            ),
            (
                json!({ "egress": [{ "ports": [{ "port": 70000 }] }] }),
                "spec.egress[0].ports[0].port = \"70000\"",
            ),
            (
                json!({ "podSelector": { "matchExpressions": [{ "key": "a", "operator": "Near" }] } }),
                "spec.podSelector.matchExpressions[0].operator = \"Near\"",
            ),
            (
                json!({ "ingress": [{ "from": [{ "ipBlock": { "cidr": "10.0.0.0/8" }, "podSelector": {} }] }] }),
                "spec.ingress[0].from[0].ipBlock",
            ),
            (
                json!({ "ingress": [{ "from": [{ "ipBlock": { "cidr": "ten/8" } }] }] }),
                "spec.ingress[0].from[0].ipBlock.cidr \"ten/8\"",
            ),
            (
                json!({ "ingress": [{ "from": [{}] }] }),
                "spec.ingress[0].from[0] selects nothing",
            ),
        ];
        for (spec, want) in cases {
            let e = policy(&np(spec.clone())).expect_err("invalid").to_string();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("fixture")
    }

    #[test]
    fn a_pod_keeps_labels_every_address_and_named_ports() {
        let p = cluster_pod(&pod(json!({
            "metadata": { "namespace": "shop", "name": "web-0", "uid": "u1",
                          "labels": { "app": "web" },
                          "annotations": { "flock.fritzlab.net/addresses": "2001:db8:9::1, 10.9.0.1",
                                           "flock.fritzlab.net/anycast": "2001:db8:a::1,bogus",
                                           "unrelated": "1.2.3.4" } },
            "spec": { "nodeName": "node-a",
                      "containers": [{ "name": "c", "ports": [
                          { "name": "http", "containerPort": 8080 },
                          { "name": "dns", "containerPort": 53, "protocol": "UDP" },
                          { "containerPort": 9000 } ] }],
                      "initContainers": [{ "name": "s", "ports": [
                          { "name": "side", "containerPort": 7000, "protocol": "SCTP" } ] }] },
            "status": { "phase": "Running", "podIP": "10.244.1.5",
                        "podIPs": [{ "ip": "2001:db8:1::5" }, { "ip": "10.244.1.5" }] }
        })))
        .expect("a flock pod");
        assert_eq!(p.uid, "u1");
        assert_eq!(p.node, "node-a");
        assert_eq!(p.labels.get("app").map(String::as_str), Some("web"));
        let addrs: Vec<String> = p.addresses.iter().map(IpAddr::to_string).collect();
        assert_eq!(
            addrs,
            [
                "10.9.0.1",
                "10.244.1.5",
                "2001:db8:1::5",
                "2001:db8:9::1",
                "2001:db8:a::1"
            ]
        );
        let ports: Vec<(String, Protocol, u16)> = p
            .ports
            .iter()
            .map(|p| (p.name.clone(), p.protocol, p.port))
            .collect();
        assert_eq!(
            ports,
            [
                ("dns".into(), Protocol::Udp, 53),
                ("http".into(), Protocol::Tcp, 8080),
                ("side".into(), Protocol::Sctp, 7000)
            ]
        );
    }

    #[test]
    fn host_network_and_finished_pods_are_not_kept() {
        let host = pod(json!({ "metadata": { "name": "h" },
            "spec": { "hostNetwork": true, "containers": [] } }));
        assert_eq!(cluster_pod(&host), None);
        for phase in ["Succeeded", "Failed"] {
            let done = pod(json!({ "metadata": { "name": "d" },
                "spec": { "containers": [] }, "status": { "phase": phase, "podIP": "10.0.0.1" } }));
            assert_eq!(cluster_pod(&done), None, "{phase}");
        }
        let pending = pod(
            json!({ "metadata": { "name": "p" }, "spec": { "containers": [] },
            "status": { "phase": "Pending" } }),
        );
        assert_eq!(cluster_pod(&pending).map(|p| p.addresses), Some(vec![]));
    }
}
