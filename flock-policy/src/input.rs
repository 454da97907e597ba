//! What the crate is given: policies, namespaces and pods as plain data (the agent converts
//! them from the Kubernetes API objects), label selectors, and their validation.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::error::{Error, Result};
use crate::selector::{LabelSelector, Labels, NAMESPACE_NAME_LABEL};

/// Which directions a policy isolates (`policyTypes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PolicyTypes {
    /// `Ingress` is listed.
    pub ingress: bool,
    /// `Egress` is listed.
    pub egress: bool,
}

/// A `NetworkPolicy`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The policy's namespace: it selects pods there, and a peer's `podSelector` without a
    /// `namespaceSelector` means pods there.
    pub namespace: String,
    /// The policy's name.
    pub name: String,
    /// `spec.podSelector`: the pods of [`namespace`](Self::namespace) the policy applies to.
    pub pod_selector: LabelSelector,
    /// `spec.policyTypes`; `None` (or neither set) is the API's default: ingress always,
    /// egress when there are egress rules. See [`Policy::effective_types`].
    pub policy_types: Option<PolicyTypes>,
    /// `spec.ingress`: who may connect to the selected pods.
    pub ingress: Vec<Rule>,
    /// `spec.egress`: where the selected pods may connect.
    pub egress: Vec<Rule>,
}

impl Policy {
    /// `namespace/name`, as errors and rendered comments name it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The directions the policy isolates, with the API server's defaulting applied.
    pub fn effective_types(&self) -> PolicyTypes {
        match self.policy_types {
            Some(t) if t.ingress || t.egress => t,
            _ => PolicyTypes {
                ingress: true,
                egress: !self.egress.is_empty(),
            },
        }
    }

    /// Checks everything Kubernetes' own validation checks that matters here (selector
    /// requirements, peers, CIDRs and excepts, ports, port names, `endPort`).
    pub fn validate(&self) -> Result<()> {
        self.checked().map(|_| ())
    }

    pub(crate) fn checked(&self) -> Result<CheckedPolicy> {
        let id = format!("networkpolicy {}", self.id());
        self.pod_selector.validate(&id, "spec.podSelector")?;
        let types = self.effective_types();
        let rules = |rules: &[Rule], dir: &str, peer_word: &str| -> Result<Vec<CheckedRule>> {
            rules
                .iter()
                .enumerate()
                .map(|(i, r)| r.checked(&id, &format!("spec.{dir}[{i}]"), peer_word))
                .collect()
        };
        let ingress = rules(&self.ingress, "ingress", "from")?;
        let egress = rules(&self.egress, "egress", "to")?;
        Ok(CheckedPolicy {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            pod_selector: self.pod_selector.clone(),
            ingress: types.ingress.then_some(ingress),
            egress: types.egress.then_some(egress),
        })
    }
}

/// One ingress or egress rule: traffic matching any peer and any port is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// `from` / `to`; empty means every address.
    pub peers: Vec<Peer>,
    /// `ports`; empty means every port of every protocol (ICMP included).
    pub ports: Vec<PortSpec>,
}

impl Rule {
    fn checked(&self, policy: &str, field: &str, peer_word: &str) -> Result<CheckedRule> {
        let peers = self
            .peers
            .iter()
            .enumerate()
            .map(|(j, p)| p.checked(policy, &format!("{field}.{peer_word}[{j}]")))
            .collect::<Result<_>>()?;
        for (k, p) in self.ports.iter().enumerate() {
            p.validate(policy, &format!("{field}.ports[{k}]"))?;
        }
        Ok(CheckedRule {
            peers,
            ports: self.ports.clone(),
        })
    }
}

/// A `NetworkPolicyPeer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Pods by labels. `namespace_selector: None` means the policy's own namespace;
    /// `pod_selector: None` means every pod of the selected namespaces. Both `None` is
    /// invalid.
    Pods {
        /// `namespaceSelector`.
        namespace_selector: Option<LabelSelector>,
        /// `podSelector`.
        pod_selector: Option<LabelSelector>,
    },
    /// Addresses: `cidr` minus every `except`.
    IpBlock {
        /// `ipBlock.cidr` as given (`10.0.0.0/8`; host bits are ignored, as the API server's
        /// parser always has).
        cidr: String,
        /// `ipBlock.except`: CIDRs strictly inside `cidr`.
        except: Vec<String>,
    },
}

impl Peer {
    /// Pods of the policy's namespace matching `selector`.
    pub fn pods(selector: LabelSelector) -> Peer {
        Peer::Pods {
            namespace_selector: None,
            pod_selector: Some(selector),
        }
    }

    /// Every pod of the namespaces matching `selector`.
    pub fn namespaces(selector: LabelSelector) -> Peer {
        Peer::Pods {
            namespace_selector: Some(selector),
            pod_selector: None,
        }
    }

    /// An `ipBlock`.
    pub fn ip_block(cidr: &str, except: &[&str]) -> Peer {
        Peer::IpBlock {
            cidr: cidr.to_owned(),
            except: except.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn checked(&self, policy: &str, field: &str) -> Result<CheckedPeer> {
        match self {
            Peer::Pods {
                namespace_selector: None,
                pod_selector: None,
            } => Err(Error::EmptyPeer {
                policy: policy.to_owned(),
                field: field.to_owned(),
            }),
            Peer::Pods {
                namespace_selector,
                pod_selector,
            } => {
                if let Some(s) = namespace_selector {
                    s.validate(policy, &format!("{field}.namespaceSelector"))?;
                }
                if let Some(s) = pod_selector {
                    s.validate(policy, &format!("{field}.podSelector"))?;
                }
                Ok(CheckedPeer::Pods {
                    namespace_selector: namespace_selector.as_ref().map(LabelSelector::canonical),
                    pod_selector: pod_selector.as_ref().map(LabelSelector::canonical),
                })
            }
            Peer::IpBlock { cidr, except } => {
                let parse = |field: String, value: &str| -> Result<IpNet> {
                    value
                        .trim()
                        .parse::<IpNet>()
                        .map(|n| n.trunc())
                        .map_err(|source| Error::Cidr {
                            policy: policy.to_owned(),
                            field,
                            value: value.to_owned(),
                            source,
                        })
                };
                let net = parse(format!("{field}.ipBlock.cidr"), cidr)?;
                let mut excepts = Vec::new();
                for (k, e) in except.iter().enumerate() {
                    let field = format!("{field}.ipBlock.except[{k}]");
                    let ex = parse(field.clone(), e)?;
                    let inside = match (net, ex) {
                        (IpNet::V4(n), IpNet::V4(x)) => {
                            n.contains(&x.network()) && x.prefix_len() > n.prefix_len()
                        }
                        (IpNet::V6(n), IpNet::V6(x)) => {
                            n.contains(&x.network()) && x.prefix_len() > n.prefix_len()
                        }
                        _ => false,
                    };
                    if !inside {
                        return Err(Error::ExceptOutside {
                            policy: policy.to_owned(),
                            field,
                            value: e.clone(),
                            cidr: cidr.clone(),
                        });
                    }
                    excepts.push(ex);
                }
                Ok(CheckedPeer::Block { net, excepts })
            }
        }
    }
}

/// Transport protocols a NetworkPolicy port names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP, the API's default.
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The name nftables and Kubernetes' lower-cased spelling share.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// A port of a rule: a number or the name of a container port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Port {
    /// A port number.
    Number(u16),
    /// A container port's name, resolved on the destination pod.
    Name(String),
}

/// A `NetworkPolicyPort`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSpec {
    /// `protocol` (TCP when absent).
    pub protocol: Protocol,
    /// `port`; `None` means every port of the protocol.
    pub port: Option<Port>,
    /// `endPort`: with a numeric `port`, the inclusive end of a range.
    pub end_port: Option<u16>,
}

impl PortSpec {
    /// One numbered port.
    pub fn number(protocol: Protocol, port: u16) -> PortSpec {
        PortSpec {
            protocol,
            port: Some(Port::Number(port)),
            end_port: None,
        }
    }

    /// A named port.
    pub fn name(protocol: Protocol, name: &str) -> PortSpec {
        PortSpec {
            protocol,
            port: Some(Port::Name(name.to_owned())),
            end_port: None,
        }
    }

    /// `port` to `end_port` inclusive.
    pub fn range(protocol: Protocol, port: u16, end_port: u16) -> PortSpec {
        PortSpec {
            protocol,
            port: Some(Port::Number(port)),
            end_port: Some(end_port),
        }
    }

    fn validate(&self, policy: &str, field: &str) -> Result<()> {
        let p = policy.to_owned();
        match (&self.port, self.end_port) {
            (Some(Port::Number(0)), _) => Err(Error::PortZero {
                policy: p,
                field: format!("{field}.port"),
            }),
            (Some(Port::Name(name)), _) if port_name_error(name).is_some() => {
                Err(Error::PortName {
                    policy: p,
                    field: format!("{field}.port"),
                    value: name.clone(),
                    reason: port_name_error(name).unwrap_or_default(),
                })
            }
            (Some(Port::Number(port)), Some(end)) if end < *port => Err(Error::EndPortBelowPort {
                policy: p,
                field: format!("{field}.endPort"),
                port: *port,
                end_port: end,
            }),
            (Some(Port::Name(_)) | None, Some(end)) => Err(Error::EndPortWithoutNumber {
                policy: p,
                field: format!("{field}.endPort"),
                end_port: end,
            }),
            _ => Ok(()),
        }
    }
}

/// Why `name` is not an IANA service name as Kubernetes accepts it for a port name.
pub(crate) fn port_name_error(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 15 {
        Some("must be 1 to 15 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Some("may hold only lower-case letters, digits and '-'")
    } else if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        Some("must hold at least one letter")
    } else if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        Some("may not start or end with '-' or hold \"--\"")
    } else {
        None
    }
}

/// A namespace and its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: Labels,
    /// Which decisions of its pods' chains are logged; `None`: none.
    pub log: Option<crate::LogMode>,
}

impl Namespace {
    /// The labels with [`NAMESPACE_NAME_LABEL`] added if missing (the API server sets it on
    /// every namespace; a namespace the caller did not list has only that one).
    pub fn effective_labels(&self) -> Labels {
        let mut labels = self.labels.clone();
        labels
            .entry(NAMESPACE_NAME_LABEL.to_owned())
            .or_insert_with(|| self.name.clone());
        labels
    }
}

/// A named container port of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    /// `ports[].name`.
    pub name: String,
    /// `ports[].protocol`.
    pub protocol: Protocol,
    /// `ports[].containerPort`.
    pub port: u16,
}

/// A flock pod of the cluster (not a `hostNetwork` one: those are the node's traffic; leave
/// them, and finished pods whose addresses may be reused, out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels, shared: the pods of one ReplicaSet have the same, and a rebuild's copy of
    /// the inputs shares them with the caller's cache (issue 15's memory budget).
    pub labels: Arc<Labels>,
    /// Every address it answers on: its /128, its /32, fixed `addresses`, anycast.
    pub addresses: Vec<IpAddr>,
    /// Its host veth (`flock1a2b3c4d`) when it runs on this node; `None` on other nodes.
    pub host_if: Option<String>,
    /// Its named container ports.
    pub ports: Vec<NamedPort>,
}

impl Pod {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The number its container port `name` of `protocol` has, if it has one.
    pub fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let Some(host_if) = &self.host_if else {
            return Ok(());
        };
        let err = |reason| Error::HostIf {
            pod: self.id(),
            value: host_if.clone(),
            reason,
        };
        if host_if.is_empty() || host_if.len() > 15 {
            return Err(err("must be 1 to 15 characters"));
        }
        if !host_if
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            return Err(err(
                "may hold only letters, digits, '_', '-' and '.' (flock's veths are flock<8 hex>)",
            ));
        }
        if !host_if.as_bytes()[0].is_ascii_alphabetic() {
            return Err(err("must start with a letter"));
        }
        Ok(())
    }
}

/// A validated policy with its CIDRs parsed; a direction it does not isolate is `None`.
#[derive(Debug, Clone)]
pub(crate) struct CheckedPolicy {
    pub namespace: String,
    /// Only for explanations: the rules never depend on it.
    pub name: String,
    pub pod_selector: LabelSelector,
    pub ingress: Option<Vec<CheckedRule>>,
    pub egress: Option<Vec<CheckedRule>>,
}

#[derive(Debug, Clone)]
pub(crate) struct CheckedRule {
    pub peers: Vec<CheckedPeer>,
    pub ports: Vec<PortSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CheckedPeer {
    Pods {
        namespace_selector: Option<LabelSelector>,
        pod_selector: Option<LabelSelector>,
    },
    Block {
        net: IpNet,
        excepts: Vec<IpNet>,
    },
}
