//! `ClusterNetworkPolicy` objects (network-policy-api v0.3.0, `policy.networking.k8s.io`
//! `v1beta1`) to `flock-policy`'s [`ClusterPolicy`]. Pure.
//!
//! The agent watches them as dynamic objects and reads `spec` with the types below, which
//! follow the API's JSON. What flock does not enforce is handled as the API's "fail closed"
//! rule asks of an implementation that meets a peer it does not know: an Accept rule's
//! unsupported peer matches nothing, a Deny or Pass rule with one denies everything in its
//! direction. Either way the policy is reported ([`Converted::unsupported`]).

use std::collections::BTreeMap;

use flock_policy::{Action, ClusterPeer, ClusterPolicy, ClusterPort, ClusterRule, Protocol, Tier};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;
use serde_json::Value;

use super::convert::{ConvertError, selector};

/// The API group, version and kind the agent watches.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "policy.networking.k8s.io",
            "v1beta1",
            "ClusterNetworkPolicy",
        ),
        "clusternetworkpolicies",
    )
}

/// A converted policy, and what of it flock does not enforce as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The policy to enforce.
    pub policy: ClusterPolicy,
    /// Each field flock does not support, with what was done instead; empty when none.
    pub unsupported: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    tier: String,
    priority: i64,
    subject: Selecting,
    #[serde(default)]
    ingress: Vec<RuleSpec>,
    #[serde(default)]
    egress: Vec<RuleSpec>,
}

/// A subject or a peer: exactly one field is set.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selecting {
    namespaces: Option<meta::LabelSelector>,
    pods: Option<NamespacedPod>,
    networks: Option<Vec<String>>,
    /// Every other field (experimental `nodes`, `domainNames`, or a newer API's): unsupported.
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NamespacedPod {
    namespace_selector: Option<meta::LabelSelector>,
    pod_selector: Option<meta::LabelSelector>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleSpec {
    #[serde(default)]
    name: String,
    action: String,
    #[serde(default)]
    from: Vec<Selecting>,
    #[serde(default)]
    to: Vec<Selecting>,
    #[serde(default)]
    protocols: Vec<ProtocolSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProtocolSpec {
    tcp: Option<PortHolder>,
    udp: Option<PortHolder>,
    sctp: Option<PortHolder>,
    destination_named_port: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PortHolder {
    destination_port: Option<DestinationPort>,
}

#[derive(Debug, Deserialize)]
struct DestinationPort {
    number: Option<i64>,
    range: Option<PortRange>,
}

#[derive(Debug, Deserialize)]
struct PortRange {
    start: i64,
    end: i64,
}

/// A ClusterNetworkPolicy as `flock-policy` takes it, validated; the error names the policy,
/// the field and the value.
pub fn cluster_policy(object: &DynamicObject) -> Result<Converted, ConvertError> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let id = format!("clusternetworkpolicy {name}");
    let spec_value = object.data.get("spec").cloned().unwrap_or(Value::Null);
    let spec: Spec = serde_json::from_value(spec_value).map_err(|e| ConvertError::Field {
        policy: id.clone(),
        field: "spec".into(),
        value: e.to_string(),
        reason: "does not have the API's shape",
    })?;
    let field = |at: String, value: &str, reason| ConvertError::Field {
        policy: id.clone(),
        field: at,
        value: value.to_owned(),
        reason,
    };
    let tier = match spec.tier.as_str() {
        "Admin" => Tier::Admin,
        "Baseline" => Tier::Baseline,
        other => {
            return Err(field(
                "spec.tier".into(),
                other,
                "must be Admin or Baseline",
            ));
        }
    };
    let priority = u32::try_from(spec.priority).map_err(|_| {
        field(
            "spec.priority".into(),
            &spec.priority.to_string(),
            "must be 0 to 1000",
        )
    })?;
    let mut unsupported = Vec::new();
    let subject = match selecting(&id, "spec.subject", &spec.subject, false)? {
        Some(peer) => peer,
        None => {
            return Err(field(
                "spec.subject".into(),
                &fields(&spec.subject),
                "must be namespaces or pods",
            ));
        }
    };
    let mut rules = |list: &[RuleSpec], dir: &str| -> Result<Vec<ClusterRule>, ConvertError> {
        let mut out = Vec::new();
        for (i, r) in list.iter().enumerate() {
            let at = format!("spec.{dir}[{i}]");
            let action = match r.action.as_str() {
                "Accept" => Action::Accept,
                "Deny" => Action::Deny,
                "Pass" => Action::Pass,
                other => {
                    return Err(field(
                        format!("{at}.action"),
                        other,
                        "must be Accept, Deny or Pass",
                    ));
                }
            };
            let (word, list) = if dir == "ingress" {
                ("from", &r.from)
            } else {
                ("to", &r.to)
            };
            let mut peers = Vec::new();
            let mut closed = false;
            for (j, p) in list.iter().enumerate() {
                let pat = format!("{at}.{word}[{j}]");
                match selecting(&id, &pat, p, dir == "egress")? {
                    Some(peer) => peers.push(peer),
                    None => {
                        closed = true;
                        unsupported.push(format!(
                            "{pat}: {} is not supported: {}",
                            fields(p),
                            if action == Action::Accept {
                                "the peer matches nothing"
                            } else {
                                "the rule denies every peer"
                            }
                        ));
                    }
                }
            }
            if closed && action != Action::Accept {
                // fail closed: "Deny all" in this direction
                out.push(ClusterRule {
                    name: r.name.clone(),
                    action: Action::Deny,
                    peers: vec![ClusterPeer::Everything],
                    ports: Vec::new(),
                });
                continue;
            }
            if peers.is_empty() && closed {
                continue; // an Accept rule whose every peer matches nothing
            }
            let mut ports = Vec::new();
            for (k, p) in r.protocols.iter().enumerate() {
                ports.push(protocol(&id, &format!("{at}.protocols[{k}]"), p)?);
            }
            out.push(ClusterRule {
                name: r.name.clone(),
                action,
                peers,
                ports,
            });
        }
        Ok(out)
    };
    let ingress = rules(&spec.ingress, "ingress")?;
    let egress = rules(&spec.egress, "egress")?;
    let policy = ClusterPolicy {
        name,
        tier,
        priority,
        subject,
        ingress,
        egress,
    };
    policy.validate()?;
    Ok(Converted {
        policy,
        unsupported,
    })
}

/// The names of the fields set on a subject or peer.
fn fields(s: &Selecting) -> String {
    let mut names: Vec<&str> = Vec::new();
    if s.namespaces.is_some() {
        names.push("namespaces");
    }
    if s.pods.is_some() {
        names.push("pods");
    }
    if s.networks.is_some() {
        names.push("networks");
    }
    names.extend(s.other.keys().map(String::as_str));
    if names.is_empty() {
        "no field".into()
    } else {
        names.join(", ")
    }
}

/// A subject or peer; `None` when its field is one flock does not support (`networks` is
/// supported where the API has it: egress peers).
fn selecting(
    id: &str,
    at: &str,
    s: &Selecting,
    networks: bool,
) -> Result<Option<ClusterPeer>, ConvertError> {
    let set = usize::from(s.namespaces.is_some())
        + usize::from(s.pods.is_some())
        + usize::from(s.networks.is_some())
        + s.other.len();
    if set != 1 {
        return Err(ConvertError::Field {
            policy: id.to_owned(),
            field: at.to_owned(),
            value: fields(s),
            reason: "exactly one field must be set",
        });
    }
    Ok(if let Some(n) = &s.namespaces {
        Some(ClusterPeer::Namespaces(selector(
            id,
            &format!("{at}.namespaces"),
            Some(n),
        )?))
    } else if let Some(p) = &s.pods {
        Some(ClusterPeer::Pods {
            namespaces: selector(
                id,
                &format!("{at}.pods.namespaceSelector"),
                p.namespace_selector.as_ref(),
            )?,
            pods: selector(
                id,
                &format!("{at}.pods.podSelector"),
                p.pod_selector.as_ref(),
            )?,
        })
    } else if networks {
        s.networks.clone().map(ClusterPeer::Networks)
    } else {
        None
    })
}

fn protocol(id: &str, at: &str, p: &ProtocolSpec) -> Result<ClusterPort, ConvertError> {
    let field = |f: String, value: String, reason| ConvertError::Field {
        policy: id.to_owned(),
        field: f,
        value,
        reason,
    };
    let set: Vec<(Protocol, &PortHolder)> = [
        (Protocol::Tcp, &p.tcp),
        (Protocol::Udp, &p.udp),
        (Protocol::Sctp, &p.sctp),
    ]
    .into_iter()
    .filter_map(|(proto, h)| h.as_ref().map(|h| (proto, h)))
    .collect();
    match (set.as_slice(), &p.destination_named_port) {
        ([], Some(name)) => Ok(ClusterPort::Named(name.clone())),
        ([(proto, holder)], None) => {
            let f = format!("{at}.{}.destinationPort", proto.as_str());
            let port = |n: i64, f: String| {
                u16::try_from(n)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| field(f, n.to_string(), "must be 1 to 65535"))
            };
            match &holder.destination_port {
                Some(DestinationPort {
                    number: Some(n),
                    range: None,
                }) => Ok(ClusterPort::Number(
                    *proto,
                    port(*n, format!("{f}.number"))?,
                )),
                Some(DestinationPort {
                    number: None,
                    range: Some(r),
                }) => Ok(ClusterPort::Range(
                    *proto,
                    port(r.start, format!("{f}.range.start"))?,
                    port(r.end, format!("{f}.range.end"))?,
                )),
                _ => Err(field(
                    f,
                    "absent or both number and range".into(),
                    "must hold a number or a range",
                )),
            }
        }
        _ => Err(field(
            at.to_owned(),
            "several or none of tcp, udp, sctp, destinationNamedPort".into(),
            "exactly one must be set",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flock_policy::LabelSelector;
    use serde_json::json;

    fn object(spec: Value) -> DynamicObject {
        let mut o = DynamicObject::new("guard", &api_resource());
        o.data = json!({ "spec": spec });
        o
    }

    #[test]
    fn a_policy_of_the_conformance_suite_converts() {
        let c = cluster_policy(&object(json!({
            "tier": "Admin", "priority": 16,
            "subject": { "namespaces": { "matchLabels": {
                "kubernetes.io/metadata.name": "network-policy-conformance-gryffindor" } } },
            "ingress": [
                { "name": "accept-ravenclaw", "action": "Accept",
                  "from": [{ "namespaces": { "matchLabels": {
                      "kubernetes.io/metadata.name": "network-policy-conformance-ravenclaw" } } }],
                  "protocols": [{ "tcp": { "destinationPort": { "number": 80 } } },
                                { "udp": { "destinationPort": { "range": { "start": 53, "end": 54 } } } }] },
                { "action": "Deny",
                  "from": [{ "pods": { "namespaceSelector": {}, "podSelector": {
                      "matchLabels": { "app": "x" } } } }] }
            ],
            "egress": [
                { "action": "Pass", "to": [{ "networks": ["10.0.0.0/8", "2001:db8::/32"] }] },
                { "action": "Accept", "to": [{ "namespaces": {} }],
                  "protocols": [{ "destinationNamedPort": "web" }] }
            ]
        })))
        .unwrap();
        assert!(c.unsupported.is_empty());
        let p = c.policy;
        assert_eq!(
            (p.tier, p.priority, p.ingress.len(), p.egress.len()),
            (Tier::Admin, 16, 2, 2)
        );
        assert_eq!(
            p.ingress[0].ports,
            [
                ClusterPort::Number(Protocol::Tcp, 80),
                ClusterPort::Range(Protocol::Udp, 53, 54)
            ]
        );
        assert_eq!(p.egress[1].ports, [ClusterPort::Named("web".into())]);
        assert_eq!(
            p.egress[0].peers,
            [ClusterPeer::Networks(vec![
                "10.0.0.0/8".into(),
                "2001:db8::/32".into()
            ])]
        );
    }

    #[test]
    fn unsupported_peers_fail_closed_and_are_reported() {
        let c = cluster_policy(&object(json!({
            "tier": "Baseline", "priority": 1,
            "subject": { "namespaces": {} },
            "egress": [
                { "action": "Accept", "to": [{ "domainNames": ["example.com"] }, { "namespaces": {} }] },
                { "action": "Deny", "to": [{ "nodes": {} }] }
            ]
        })))
        .unwrap();
        assert_eq!(
            c.policy.egress[0].peers,
            [ClusterPeer::Namespaces(LabelSelector::all())]
        );
        assert_eq!(c.policy.egress[1].action, Action::Deny);
        assert_eq!(c.policy.egress[1].peers, [ClusterPeer::Everything]);
        assert_eq!(
            c.unsupported,
            [
                "spec.egress[0].to[0]: domainNames is not supported: the peer matches nothing",
                "spec.egress[1].to[0]: nodes is not supported: the rule denies every peer"
            ]
        );
    }

    /// `networks` is an egress peer: on ingress (a newer API's) it is unsupported, and a Deny
    /// rule with it denies everything, from pods and from anywhere else.
    #[test]
    fn an_ingress_network_peer_fails_closed() {
        let c = cluster_policy(&object(json!({
            "tier": "Admin", "priority": 1,
            "subject": { "namespaces": {} },
            "ingress": [{ "action": "Deny", "from": [{ "networks": ["192.0.2.0/24"] }] }]
        })))
        .unwrap();
        assert_eq!(c.policy.ingress[0].peers, [ClusterPeer::Everything]);
        assert_eq!(
            c.unsupported,
            ["spec.ingress[0].from[0]: networks is not supported: the rule denies every peer"]
        );
    }

    #[test]
    fn errors_name_the_policy_the_field_and_the_value() {
        let err = |spec: Value| cluster_policy(&object(spec)).unwrap_err().to_string();
        assert_eq!(
            err(json!({ "tier": "Middle", "priority": 1, "subject": { "namespaces": {} } })),
            "clusternetworkpolicy guard: spec.tier = \"Middle\": must be Admin or Baseline"
        );
        assert_eq!(
            err(json!({ "tier": "Admin", "priority": 1,
                        "subject": { "namespaces": {}, "pods": { "podSelector": {} } } })),
            "clusternetworkpolicy guard: spec.subject = \"namespaces, pods\": exactly one field must be set"
        );
        assert_eq!(
            err(
                json!({ "tier": "Admin", "priority": 1, "subject": { "namespaces": {} },
                        "ingress": [{ "action": "Allow", "from": [{ "namespaces": {} }] }] })
            ),
            "clusternetworkpolicy guard: spec.ingress[0].action = \"Allow\": must be Accept, Deny or Pass"
        );
        assert_eq!(
            err(
                json!({ "tier": "Admin", "priority": 1, "subject": { "namespaces": {} },
                        "egress": [{ "action": "Deny", "to": [{ "namespaces": {} }],
                                     "protocols": [{ "tcp": { "destinationPort": { "number": 70000 } } }] }] })
            ),
            "clusternetworkpolicy guard: spec.egress[0].protocols[0].tcp.destinationPort.number = \"70000\": must be 1 to 65535"
        );
        assert_eq!(
            err(json!({ "tier": "Admin", "priority": 2000, "subject": { "namespaces": {} } })),
            "clusternetworkpolicy guard: spec.priority \"2000\": must be 0 to 1000"
        );
    }
}
