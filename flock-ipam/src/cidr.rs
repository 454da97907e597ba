//! The effective-CIDR rule of DESIGN §3.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::{Error, Family, Result};

/// The effective IPv6 CIDR: the annotation's CIDRs in order, the first one
/// that is not disjoint from the node CIDR wins — equal or a supernet gives
/// the node CIDR, a subnet gives itself. No annotation CIDR gives the node
/// CIDR; all disjoint is [`Error::NoEffectiveCidr`].
///
/// ```
/// use flock_ipam::effective_cidr6;
/// let node = "2001:db8:0:1::/64".parse()?;
/// let sub = "2001:db8:0:1:ff00::/72".parse()?;
/// let other = "2001:db8:9::/48".parse()?;
/// assert_eq!(effective_cidr6(&[other, sub], node)?, sub);
/// assert_eq!(effective_cidr6(&["2001:db8::/32".parse()?], node)?, node);
/// assert!(effective_cidr6(&[other], node).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn effective_cidr6(annotation: &[Ipv6Net], node: Ipv6Net) -> Result<Ipv6Net> {
    effective(
        annotation,
        node.trunc(),
        Family::V6,
        Ipv6Net::trunc,
        |a, b| a.contains(b),
    )
}

/// The effective IPv4 CIDR; the same rule as [`effective_cidr6`].
pub fn effective_cidr4(annotation: &[Ipv4Net], node: Ipv4Net) -> Result<Ipv4Net> {
    effective(
        annotation,
        node.trunc(),
        Family::V4,
        Ipv4Net::trunc,
        |a, b| a.contains(b),
    )
}

fn effective<N>(
    annotation: &[N],
    node: N,
    family: Family,
    trunc: impl Fn(&N) -> N,
    contains: impl Fn(&N, &N) -> bool,
) -> Result<N>
where
    N: Copy + std::fmt::Display + Into<IpNet>,
{
    if annotation.is_empty() {
        return Ok(node);
    }
    for cidr in annotation {
        let cidr = trunc(cidr);
        if contains(&cidr, &node) {
            // equal or supernet
            return Ok(node);
        }
        if contains(&node, &cidr) {
            return Ok(cidr);
        }
    }
    Err(Error::NoEffectiveCidr {
        family,
        requested: annotation
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        node: node.into(),
    })
}
