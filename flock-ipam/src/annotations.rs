//! The pod annotations of DESIGN §3, parsed into a [`PodRequest`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use flock_embed::IpAlgo;
use ipnet::{Ipv4Net, Ipv6Net};

use crate::{Error, Result};

/// Every flock annotation starts with this.
pub const ANNOTATION_PREFIX: &str = "flock.fritzlab.net/";
/// `true`/`false`: give the pod an IPv6 address.
pub const KEY_IPV6: &str = "flock.fritzlab.net/ipv6";
/// `true`/`false`: give the pod an IPv4 address.
pub const KEY_IPV4: &str = "flock.fritzlab.net/ipv4";
/// Comma-separated IPv6 CIDRs to allocate from.
pub const KEY_CIDR6: &str = "flock.fritzlab.net/cidr6";
/// Comma-separated IPv4 CIDRs to allocate from.
pub const KEY_CIDR4: &str = "flock.fritzlab.net/cidr4";
/// A preset or a field list (DESIGN §4); also read from the NodeConfig.
pub const KEY_IP_ALGO: &str = "flock.fritzlab.net/ip-algo";
/// Comma-separated anycast addresses.
pub const KEY_ANYCAST: &str = "flock.fritzlab.net/anycast";
/// Comma-separated extra fixed addresses.
pub const KEY_ADDRESSES: &str = "flock.fritzlab.net/addresses";

const KNOWN_KEYS: [&str; 7] = [
    KEY_IPV6,
    KEY_IPV4,
    KEY_CIDR6,
    KEY_CIDR4,
    KEY_IP_ALGO,
    KEY_ANYCAST,
    KEY_ADDRESSES,
];

/// Whether a family was asked for, and by whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// No address of this family.
    No,
    /// An address, because the node's defaults say so.
    ByDefault,
    /// An address, because the pod's annotation says `true`.
    ByAnnotation,
}

impl Want {
    /// Whether an address of this family is wanted.
    pub fn wanted(self) -> bool {
        !matches!(self, Want::No)
    }
}

/// Where the ip-algo of a request comes from (for error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgoSource {
    /// The pod's `flock.fritzlab.net/ip-algo` annotation.
    Pod,
    /// The NodeConfig's `flock.fritzlab.net/ip-algo` annotation.
    Node,
    /// Neither: the `random` preset.
    Default,
}

/// The node's side of the defaults: NodeConfig `spec.defaults`, its ip-algo
/// annotation and which CIDRs it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDefaults {
    /// NodeConfig `defaults.ipv6` (true unless set).
    pub ipv6: bool,
    /// NodeConfig `defaults.ipv4` (true unless set; only applies with `cidr4`).
    pub ipv4: bool,
    /// The NodeConfig's `flock.fritzlab.net/ip-algo` annotation, parsed.
    pub ip_algo: Option<IpAlgo>,
    /// Whether the node has `spec.cidr6`.
    pub has_cidr6: bool,
    /// Whether the node has `spec.cidr4`.
    pub has_cidr4: bool,
}

impl NodeDefaults {
    /// Defaults of DESIGN §3 for a node with the given CIDRs: both families
    /// on where the node has a CIDR, ip-algo `random`.
    pub fn for_cidrs(has_cidr6: bool, has_cidr4: bool) -> Self {
        Self {
            ipv6: true,
            ipv4: true,
            ip_algo: None,
            has_cidr6,
            has_cidr4,
        }
    }
}

/// What a pod asks for, from its annotations and the node's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// IPv6 wanted?
    pub ipv6: Want,
    /// IPv4 wanted?
    pub ipv4: Want,
    /// `cidr6`, in order; empty means the node CIDR.
    pub cidr6: Vec<Ipv6Net>,
    /// `cidr4`, in order; empty means the node CIDR.
    pub cidr4: Vec<Ipv4Net>,
    /// How to derive the IPv6 host bits.
    pub ip_algo: IpAlgo,
    /// Where `ip_algo` comes from.
    pub ip_algo_source: AlgoSource,
    /// Anycast addresses (not held by the pool: many pods share one).
    pub anycast: Vec<IpAddr>,
    /// Extra fixed addresses, held by the pool like allocated ones.
    pub addresses: Vec<IpAddr>,
}

impl PodRequest {
    /// The request of a pod without flock annotations.
    pub fn defaults(node: &NodeDefaults) -> Self {
        let want = |on: bool| if on { Want::ByDefault } else { Want::No };
        let (ip_algo, ip_algo_source) = match &node.ip_algo {
            Some(algo) => (algo.clone(), AlgoSource::Node),
            None => (IpAlgo::random(), AlgoSource::Default),
        };
        Self {
            ipv6: want(node.ipv6 && node.has_cidr6),
            ipv4: want(node.ipv4 && node.has_cidr4),
            cidr6: Vec::new(),
            cidr4: Vec::new(),
            ip_algo,
            ip_algo_source,
            anycast: Vec::new(),
            addresses: Vec::new(),
        }
    }

    /// Reads the `flock.fritzlab.net/*` annotations of a pod; other keys are
    /// ignored, an unknown `flock.fritzlab.net/` key is an error (a typo must
    /// not be silently ignored).
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use flock_ipam::{NodeDefaults, PodRequest, Want};
    /// let mut annotations = BTreeMap::new();
    /// annotations.insert("flock.fritzlab.net/ipv4".to_owned(), "false".to_owned());
    /// annotations.insert("flock.fritzlab.net/ip-algo".to_owned(), "workload".to_owned());
    /// let req = PodRequest::from_annotations(&annotations, &NodeDefaults::for_cidrs(true, true))?;
    /// assert_eq!((req.ipv6, req.ipv4), (Want::ByDefault, Want::No));
    /// assert_eq!(req.ip_algo.to_string(), "workload");
    /// # Ok::<(), flock_ipam::Error>(())
    /// ```
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
        node: &NodeDefaults,
    ) -> Result<Self> {
        let mut req = Self::defaults(node);
        for (key, value) in annotations {
            if !key.starts_with(ANNOTATION_PREFIX) {
                continue;
            }
            let bad = |reason: String| Error::Annotation {
                key: key.clone(),
                value: value.clone(),
                reason,
            };
            match key.as_str() {
                KEY_IPV6 => req.ipv6 = parse_bool(value).map_err(bad)?,
                KEY_IPV4 => req.ipv4 = parse_bool(value).map_err(bad)?,
                KEY_CIDR6 => {
                    req.cidr6 = parse_list(value, |item| {
                        let net: Ipv6Net = item.parse().map_err(|_| {
                            if item.parse::<Ipv4Net>().is_ok() {
                                format!("{item:?} is an IPv4 CIDR; IPv4 CIDRs go in {KEY_CIDR4}")
                            } else {
                                format!("{item:?} is not an IPv6 CIDR such as 2001:db8:0:1::/64")
                            }
                        })?;
                        if net != net.trunc() {
                            return Err(format!(
                                "{item:?} has host bits set; did you mean {}?",
                                net.trunc()
                            ));
                        }
                        Ok(net)
                    })
                    .map_err(bad)?;
                }
                KEY_CIDR4 => {
                    req.cidr4 = parse_list(value, |item| {
                        let net: Ipv4Net = item.parse().map_err(|_| {
                            if item.parse::<Ipv6Net>().is_ok() {
                                format!("{item:?} is an IPv6 CIDR; IPv6 CIDRs go in {KEY_CIDR6}")
                            } else {
                                format!("{item:?} is not an IPv4 CIDR such as 10.244.1.0/24")
                            }
                        })?;
                        if net != net.trunc() {
                            return Err(format!(
                                "{item:?} has host bits set; did you mean {}?",
                                net.trunc()
                            ));
                        }
                        if net.prefix_len() > crate::MIN_PREFIX4 {
                            return Err(format!(
                                "{item:?} is smaller than a /30 and holds no usable pod address (network, .1 and broadcast are never handed out)"
                            ));
                        }
                        Ok(net)
                    })
                    .map_err(bad)?;
                }
                KEY_IP_ALGO => {
                    req.ip_algo = value
                        .parse()
                        .map_err(|e: flock_embed::Error| bad(e.to_string()))?;
                    req.ip_algo_source = AlgoSource::Pod;
                }
                KEY_ANYCAST => req.anycast = parse_addresses(value).map_err(bad)?,
                KEY_ADDRESSES => req.addresses = parse_addresses(value).map_err(bad)?,
                _ => {
                    return Err(bad(format!(
                        "unknown flock annotation; known keys: {}",
                        KNOWN_KEYS.join(", ")
                    )));
                }
            }
        }
        if let Some(both) = req.addresses.iter().find(|a| req.anycast.contains(a)) {
            return Err(Error::Annotation {
                key: KEY_ADDRESSES.to_owned(),
                value: annotations.get(KEY_ADDRESSES).cloned().unwrap_or_default(),
                reason: format!(
                    "{both} is also listed in {KEY_ANYCAST}; an address is either fixed or anycast"
                ),
            });
        }
        if !req.ipv6.wanted() && !req.ipv4.wanted() {
            // only an explicit `false` can be blamed; otherwise the node has no CIDR
            for key in [KEY_IPV6, KEY_IPV4] {
                if let Some(value) = annotations.get(key) {
                    return Err(Error::Annotation {
                        key: key.to_owned(),
                        value: value.clone(),
                        reason: "the pod would get no address at all: leave at least one of ipv6 and ipv4 on".to_owned(),
                    });
                }
            }
        }
        Ok(req)
    }
}

fn parse_bool(value: &str) -> Result<Want, String> {
    match value.trim() {
        "true" => Ok(Want::ByAnnotation),
        "false" => Ok(Want::No),
        _ => Err("expected true or false".to_owned()),
    }
}

fn parse_list<T: PartialEq + std::fmt::Display>(
    value: &str,
    item: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    if value.trim().is_empty() {
        return Err("empty list; remove the annotation to use the default".to_owned());
    }
    let mut out: Vec<T> = Vec::new();
    for (index, raw) in value.split(',').enumerate() {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(format!(
                "empty item at position {} (two commas in a row?)",
                index + 1
            ));
        }
        let parsed = item(raw)?;
        if out.contains(&parsed) {
            return Err(format!("{parsed} is listed twice"));
        }
        out.push(parsed);
    }
    Ok(out)
}

fn parse_addresses(value: &str) -> Result<Vec<IpAddr>, String> {
    parse_list(value, |item| {
        item.parse::<IpAddr>().map_err(|_| {
            if item.contains('/') {
                format!("{item:?} is a CIDR; list single addresses without a prefix length")
            } else {
                format!("{item:?} is not an IP address")
            }
        })
    })
}
