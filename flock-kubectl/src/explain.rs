//! `kubectl flock policy explain SRC DST PORT/PROTO`: the verdict of a new connection and the
//! rule that decides it, from `flock-policy`'s model built from the API's policies,
//! namespaces and pods — converted by the code the agents convert with, so the answer is the
//! one each node's rules give. Every pod is the model's "local" pod here (each node holds
//! only its own), so one model judges the source's egress and the destination's ingress
//! together, as the two nodes do one after the other.

use std::net::IpAddr;
use std::sync::Arc;

use flock_agent::policy::cluster::cluster_policy;
use flock_agent::policy::convert::{cluster_pod, namespace, policy};
use flock_policy::{Explanation, Flow, Model, Transport};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::DynamicObject;
use serde::Serialize;

use crate::error::{Error, Result};

/// The API's objects the model is built from.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Every pod.
    pub pods: Vec<Pod>,
    /// Every namespace.
    pub namespaces: Vec<Namespace>,
    /// Every NetworkPolicy.
    pub policies: Vec<NetworkPolicy>,
    /// Every ClusterNetworkPolicy (none when the API has no such resource).
    pub cluster_policies: Vec<DynamicObject>,
}

/// One end of the flow as the user named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `namespace/name`.
    Pod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// An address.
    Address(IpAddr),
}

impl End {
    /// `ns/name` or an address; `field` names the argument in the error.
    pub fn parse(field: &'static str, text: &str) -> Result<End> {
        if let Ok(a) = text.parse() {
            return Ok(End::Address(a));
        }
        match text.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(End::Pod {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(Error::Usage {
                field,
                value: text.to_owned(),
                reason: "neither a pod (namespace/name) nor an address".to_owned(),
            }),
        }
    }
}

/// `PORT/PROTO` (`80/tcp`, `53/udp`, `9/sctp`), or `icmp` / `icmpv6` (an echo request); the
/// error names the argument.
pub fn parse_transport(text: &str, v6: bool) -> Result<Transport> {
    let bad = |reason: &str| Error::Usage {
        field: "PORT/PROTO",
        value: text.to_owned(),
        reason: reason.to_owned(),
    };
    match text.to_ascii_lowercase().as_str() {
        "icmp" | "icmpv6" | "ping" => {
            return Ok(match v6 {
                true => Transport::Icmpv6 { kind: 128, code: 0 },
                false => Transport::Icmp { kind: 8, code: 0 },
            });
        }
        _ => {}
    }
    let (port, proto) = text
        .split_once('/')
        .ok_or_else(|| bad("not PORT/PROTO (80/tcp, 53/udp, 9/sctp) nor icmp"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
    match proto.to_ascii_lowercase().as_str() {
        "tcp" => Ok(Transport::Tcp(port)),
        "udp" => Ok(Transport::Udp(port)),
        "sctp" => Ok(Transport::Sctp(port)),
        _ => Err(bad("the protocol is not tcp, udp or sctp")),
    }
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// `SRC -> DST tcp/80`.
    pub flow: String,
    /// `accept` or `drop`.
    pub verdict: &'static str,
    /// One line: the verdict and the rule that decided it.
    pub reason: String,
    /// How the source's egress judges it.
    pub egress: String,
    /// How the destination's ingress judges it.
    pub ingress: String,
    /// Policies the agents would not enforce (invalid), left out as the agents leave them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

impl Answer {
    fn of(e: &Explanation, skipped: Vec<String>) -> Answer {
        Answer {
            flow: e.flow.to_string(),
            verdict: match e.dropped_by() {
                Some(_) => "drop",
                None => "accept",
            },
            reason: e.to_string(),
            egress: e.egress.to_string(),
            ingress: e.ingress.to_string(),
            skipped,
        }
    }
}

/// An address of `end` of the family `v6` (a pod's from its `podIPs`).
fn address(inputs: &Inputs, end: &End, field: &str, v6: Option<bool>) -> Result<IpAddr> {
    match end {
        End::Address(a) => Ok(*a),
        End::Pod { namespace, name } => {
            let pod = inputs
                .pods
                .iter()
                .find(|p| {
                    p.metadata.namespace.as_deref() == Some(namespace)
                        && p.metadata.name.as_deref() == Some(name)
                })
                .ok_or_else(|| Error::NotFound {
                    asked: format!("{field} pod {namespace}/{name}"),
                    found: format!("no such pod in namespace {namespace}"),
                })?;
            let ips = crate::ipam::ApiPod::of(pod).ips;
            let pick = ips
                .iter()
                .find(|a| v6.is_none_or(|v6| a.is_ipv6() == v6))
                .copied();
            pick.ok_or_else(|| Error::NotFound {
                asked: format!("{field} pod {namespace}/{name}"),
                found: match (ips.is_empty(), v6) {
                    (true, _) => "the pod has no address yet".to_owned(),
                    (false, Some(true)) => "the pod has no IPv6 address".to_owned(),
                    (false, _) => "the pod has no IPv4 address".to_owned(),
                },
            })
        }
    }
}

/// Explains the flow from `src` to `dst` on `port` (as typed: `80/tcp`); `ipv4` picks pods'
/// IPv4 addresses (IPv6 by default, flock being IPv6-first).
pub fn explain(inputs: &Inputs, src: &End, dst: &End, port: &str, ipv4: bool) -> Result<Answer> {
    // the family: an address given decides; else IPv6 unless asked for IPv4
    let v6 = match (src, dst) {
        (End::Address(a), _) | (_, End::Address(a)) => a.is_ipv6(),
        _ => !ipv4,
    };
    let src_addr = address(inputs, src, "SRC", Some(v6))?;
    let dst_addr = address(inputs, dst, "DST", Some(v6))?;
    let transport = parse_transport(port, v6)?;
    let (model, skipped) = model(inputs)?;
    let flow = Flow {
        src: src_addr,
        dst: dst_addr,
        transport,
    };
    let e = model.explain(&flow).map_err(|e| Error::Usage {
        field: "flow",
        value: flow.to_string(),
        reason: e.to_string(),
    })?;
    Ok(Answer::of(&e, skipped))
}

/// The model of every pod, namespace and policy; the policies left out, with why.
pub fn model(inputs: &Inputs) -> Result<(Model, Vec<String>)> {
    let mut skipped = Vec::new();
    let mut policies = Vec::new();
    for np in &inputs.policies {
        match policy(np) {
            Ok(p) => policies.push(p),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    let mut cluster = Vec::new();
    for cnp in &inputs.cluster_policies {
        match cluster_policy(cnp) {
            Ok(c) => cluster.push(c.policy),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    let namespaces: Vec<flock_policy::Namespace> = inputs
        .namespaces
        .iter()
        .map(|ns| {
            let info = namespace(ns);
            flock_policy::Namespace {
                name: ns.metadata.name.clone().unwrap_or_default(),
                labels: info.labels,
                log: None,
            }
        })
        .collect();
    let pods: Vec<flock_policy::Pod> = inputs
        .pods
        .iter()
        .filter_map(|p| Some((p, cluster_pod(p)?)))
        .enumerate()
        .map(|(i, (p, c))| flock_policy::Pod {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            labels: Arc::clone(&c.labels),
            addresses: c.addresses,
            // a stand-in for its host veth: every pod is judged here
            host_if: Some(format!("pod{i:x}")),
            ports: c.ports,
        })
        .collect();
    let model =
        Model::with_cluster_policies(&cluster, &policies, &namespaces, &pods).map_err(|e| {
            Error::Usage {
                field: "policies",
                value: String::new(),
                reason: format!("the cluster's policies do not build a model: {e}"),
            }
        })?;
    Ok((model, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], ips: &[&str]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "namespace": ns, "name": name, "uid": name,
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<std::collections::BTreeMap<_, _>>() },
            "spec": { "nodeName": "node1", "containers": [{ "name": "c",
                "ports": [{ "name": "http", "containerPort": 80 }] }] },
            "status": { "phase": "Running", "podIPs": ips.iter().map(|i| serde_json::json!({"ip": i})).collect::<Vec<_>>() }
        }))
        .unwrap()
    }

    fn inputs() -> Inputs {
        let np: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": { "namespace": "shop", "name": "web-from-client" },
            "spec": {
                "podSelector": { "matchLabels": { "app": "web" } },
                "ingress": [{ "from": [{ "podSelector": { "matchLabels": { "app": "client" } } }],
                              "ports": [{ "port": "http" }] }]
            }
        }))
        .unwrap();
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": "shop" } })).unwrap();
        Inputs {
            pods: vec![
                pod(
                    "shop",
                    "web",
                    &[("app", "web")],
                    &["2001:db8:a1::1", "10.101.1.1"],
                ),
                pod(
                    "shop",
                    "client",
                    &[("app", "client")],
                    &["2001:db8:a2::2", "10.101.2.2"],
                ),
                pod(
                    "shop",
                    "other",
                    &[("app", "other")],
                    &["2001:db8:a2::3", "10.101.2.3"],
                ),
            ],
            namespaces: vec![ns],
            policies: vec![np],
            cluster_policies: vec![],
        }
    }

    fn end(s: &str) -> End {
        End::parse("SRC", s).unwrap()
    }

    #[test]
    fn names_the_rule_that_allows_and_the_policy_that_isolates() {
        let i = inputs();
        let a = explain(&i, &end("shop/client"), &end("shop/web"), "80/tcp", false).unwrap();
        assert_eq!(a.verdict, "accept");
        assert!(
            a.ingress
                .contains("networkpolicy shop/web-from-client (rule 0)"),
            "{a:?}"
        );
        assert!(
            a.flow.starts_with("2001:db8:a2::2 -> 2001:db8:a1::1"),
            "{a:?}"
        );
        let d = explain(&i, &end("shop/other"), &end("shop/web"), "80/tcp", true).unwrap();
        assert_eq!(d.verdict, "drop");
        assert!(d.reason.contains("shop/web-from-client"), "{d:?}");
        assert!(d.flow.starts_with("10.101.2.3 -> 10.101.1.1"), "{d:?}");
        // another port of the selected pod is not allowed either
        let p = explain(&i, &end("shop/client"), &end("shop/web"), "81/tcp", false).unwrap();
        assert_eq!(p.verdict, "drop");
    }

    #[test]
    fn bad_arguments_name_the_field_and_the_value() {
        let i = inputs();
        let e = explain(&i, &end("shop/nope"), &end("shop/web"), "80/tcp", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "SRC pod shop/nope: no such pod in namespace shop"
        );
        assert_eq!(e.exit_code(), 3);
        let e = explain(&i, &end("shop/client"), &end("shop/web"), "80/http", false).unwrap_err();
        assert!(e.to_string().starts_with("PORT/PROTO \"80/http\""), "{e}");
        assert_eq!(e.exit_code(), 2);
        assert!(End::parse("DST", "a/b/c").is_err());
        let e = explain(&i, &end("10.0.0.1"), &end("shop/web"), "80/tcp", false).unwrap();
        assert!(e.flow.starts_with("10.0.0.1 -> 10.101.1.1"), "{e:?}");
    }
}
