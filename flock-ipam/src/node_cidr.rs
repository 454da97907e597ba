//! Which pod CIDRs a node may have (NodeConfig `spec.cidr6` / `spec.cidr4`).

use std::fmt;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::{Error, Family, Result};

/// The longest IPv6 node prefix: a node needs at least 256 addresses, so random host bits
/// rarely collide and RFC 5453's reserved interface IDs leave room for pods.
pub const LONGEST_NODE_PREFIX6: u8 = 120;
/// The longest IPv4 node prefix: a /30 holds one pod (network, `.1` and broadcast are never
/// handed out).
pub const LONGEST_NODE_PREFIX4: u8 = 30;
/// The shortest IPv4 node prefix: the allocation bitmap holds at most a /8 (2 MiB of bits).
pub const SHORTEST_NODE_PREFIX4: u8 = 8;

/// Why a node pod CIDR is refused ([`Error::NodeCidr`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeCidrProblem {
    /// Not a CIDR of the family.
    Syntax {
        /// The family the field holds.
        family: Family,
    },
    /// Host bits are set.
    HostBits {
        /// The network it probably meant.
        network: IpNet,
    },
    /// The prefix is longer than the family allows.
    TooSmall {
        /// The longest prefix allowed.
        longest: u8,
    },
    /// The prefix is shorter than the family allows.
    TooLarge {
        /// The shortest prefix allowed.
        shortest: u8,
    },
}

impl fmt::Display for NodeCidrProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeCidrProblem::Syntax { family: Family::V6 } => {
                f.write_str("not an IPv6 CIDR such as 2001:db8:0:1::/64")
            }
            NodeCidrProblem::Syntax { family: Family::V4 } => {
                f.write_str("not an IPv4 CIDR such as 10.244.1.0/24")
            }
            NodeCidrProblem::HostBits { network } => {
                write!(f, "has host bits set; did you mean {network}?")
            }
            NodeCidrProblem::TooSmall { longest } => {
                write!(f, "a pod CIDR must be /{longest} or larger")
            }
            NodeCidrProblem::TooLarge { shortest } => write!(
                f,
                "a pod CIDR must be /{shortest} or smaller (at most a /{shortest} per node)"
            ),
        }
    }
}

impl Family {
    /// The NodeConfig field that holds the node's CIDR of this family: `spec.cidr6` or
    /// `spec.cidr4`.
    pub fn node_cidr_field(self) -> &'static str {
        match self {
            Family::V6 => "spec.cidr6",
            Family::V4 => "spec.cidr4",
        }
    }
}

fn refuse(family: Family, value: impl fmt::Display, problem: NodeCidrProblem) -> Error {
    Error::NodeCidr {
        family,
        value: value.to_string(),
        problem,
    }
}

/// Checks an IPv6 node CIDR: no host bits, at most a /[`LONGEST_NODE_PREFIX6`].
///
/// ```
/// use flock_ipam::validate_node_cidr6;
/// assert!(validate_node_cidr6("2001:db8:0:1::/64".parse()?).is_ok());
/// let e = validate_node_cidr6("2001:db8::/124".parse()?).unwrap_err();
/// assert_eq!(e.to_string(), r#"NodeConfig spec.cidr6 "2001:db8::/124": a pod CIDR must be /120 or larger"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn validate_node_cidr6(cidr: Ipv6Net) -> Result<Ipv6Net> {
    if cidr.trunc() != cidr {
        let network = IpNet::V6(cidr.trunc());
        return Err(refuse(
            Family::V6,
            cidr,
            NodeCidrProblem::HostBits { network },
        ));
    }
    if cidr.prefix_len() > LONGEST_NODE_PREFIX6 {
        let longest = LONGEST_NODE_PREFIX6;
        return Err(refuse(
            Family::V6,
            cidr,
            NodeCidrProblem::TooSmall { longest },
        ));
    }
    Ok(cidr)
}

/// Checks an IPv4 node CIDR: no host bits, between a /[`SHORTEST_NODE_PREFIX4`] and a
/// /[`LONGEST_NODE_PREFIX4`].
pub fn validate_node_cidr4(cidr: Ipv4Net) -> Result<Ipv4Net> {
    if cidr.trunc() != cidr {
        let network = IpNet::V4(cidr.trunc());
        return Err(refuse(
            Family::V4,
            cidr,
            NodeCidrProblem::HostBits { network },
        ));
    }
    if cidr.prefix_len() > LONGEST_NODE_PREFIX4 {
        let longest = LONGEST_NODE_PREFIX4;
        return Err(refuse(
            Family::V4,
            cidr,
            NodeCidrProblem::TooSmall { longest },
        ));
    }
    if cidr.prefix_len() < SHORTEST_NODE_PREFIX4 {
        let shortest = SHORTEST_NODE_PREFIX4;
        return Err(refuse(
            Family::V4,
            cidr,
            NodeCidrProblem::TooLarge { shortest },
        ));
    }
    Ok(cidr)
}

/// A node's pod CIDRs, each checked by [`validate_node_cidr6`] / [`validate_node_cidr4`];
/// either may be absent. [`Pools::new`](crate::Pools::new) accepts every `NodeCidrs`.
///
/// ```
/// use flock_ipam::{Error, Family, NodeCidrs, Pools};
/// let node = NodeCidrs::parse(Some("2001:db8:0:1::/64"), Some("10.244.1.0/24"))?;
/// let pools = Pools::new(node.cidr6(), node.cidr4())?;
/// assert_eq!(pools.cidr4(), node.cidr4());
/// match NodeCidrs::parse(None, Some("10.244.1.7/24")) {
///     Err(Error::NodeCidr { family: Family::V4, value, problem }) => {
///         assert_eq!(value, "10.244.1.7/24");
///         assert_eq!(problem.to_string(), "has host bits set; did you mean 10.244.1.0/24?");
///     }
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NodeCidrs {
    cidr6: Option<Ipv6Net>,
    cidr4: Option<Ipv4Net>,
}

impl NodeCidrs {
    /// Checks both CIDRs; the IPv6 one first.
    pub fn new(cidr6: Option<Ipv6Net>, cidr4: Option<Ipv4Net>) -> Result<NodeCidrs> {
        Ok(NodeCidrs {
            cidr6: cidr6.map(validate_node_cidr6).transpose()?,
            cidr4: cidr4.map(validate_node_cidr4).transpose()?,
        })
    }

    /// Parses and checks both CIDRs as written in a NodeConfig.
    pub fn parse(cidr6: Option<&str>, cidr4: Option<&str>) -> Result<NodeCidrs> {
        let cidr6 = cidr6
            .map(|v| {
                v.parse::<Ipv6Net>().map_err(|_| {
                    refuse(
                        Family::V6,
                        v,
                        NodeCidrProblem::Syntax { family: Family::V6 },
                    )
                })
            })
            .transpose()?;
        let cidr4 = cidr4
            .map(|v| {
                v.parse::<Ipv4Net>().map_err(|_| {
                    refuse(
                        Family::V4,
                        v,
                        NodeCidrProblem::Syntax { family: Family::V4 },
                    )
                })
            })
            .transpose()?;
        NodeCidrs::new(cidr6, cidr4)
    }

    /// The IPv6 pod CIDR.
    pub fn cidr6(&self) -> Option<Ipv6Net> {
        self.cidr6
    }

    /// The IPv4 pod CIDR.
    pub fn cidr4(&self) -> Option<Ipv4Net> {
        self.cidr4
    }
}
