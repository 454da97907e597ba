//! Address arithmetic: an `ipBlock` (a CIDR minus its excepts) as the fewest prefixes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv6 (first: flock is IPv6-first).
    V6,
    /// IPv4.
    V4,
}

impl Family {
    /// The family of `addr`.
    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The family of `net`.
    pub fn of_net(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }

    fn bits(self) -> u8 {
        match self {
            Family::V6 => 128,
            Family::V4 => 32,
        }
    }
}

fn to_u128(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn prefix(family: Family, start: u128, len: u8) -> IpNet {
    match family {
        // `start` came from a 32-bit address; the conversion cannot fail.
        Family::V4 => IpNet::V4(
            Ipv4Net::new(Ipv4Addr::from(u32::try_from(start).unwrap_or(0)), len)
                .unwrap_or_default(),
        ),
        Family::V6 => IpNet::V6(Ipv6Net::new(Ipv6Addr::from(start), len).unwrap_or_default()),
    }
}

fn range_of(net: &IpNet) -> (u128, u128) {
    (to_u128(net.network()), to_u128(net.broadcast()))
}

fn addr(family: Family, value: u128) -> IpAddr {
    match family {
        // `value` came from a 32-bit address; the conversion cannot fail.
        Family::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(value).unwrap_or(0))),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// An inclusive address range of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddrRange {
    /// First address.
    pub first: IpAddr,
    /// Last address.
    pub last: IpAddr,
}

impl AddrRange {
    /// Whether `a` is in the range (addresses of the other family never are).
    pub fn contains(&self, a: &IpAddr) -> bool {
        Family::of(a) == Family::of(&self.first) && self.first <= *a && *a <= self.last
    }

    /// The range as one prefix, if it is exactly one.
    pub fn as_prefix(&self) -> Option<IpNet> {
        let family = Family::of(&self.first);
        match range_prefixes(family, to_u128(self.first), to_u128(self.last)).as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }
}

/// `net` minus every `except`: sorted, disjoint, non-adjacent ranges. All must be of one
/// family.
pub(crate) fn subtract(net: IpNet, excepts: &[IpNet]) -> Vec<AddrRange> {
    let family = Family::of_net(&net);
    let mut ranges = vec![range_of(&net)];
    for ex in excepts {
        let (xs, xe) = range_of(ex);
        let mut next = Vec::with_capacity(ranges.len() + 1);
        for (s, e) in ranges {
            if xe < s || xs > e {
                next.push((s, e));
                continue;
            }
            if xs > s {
                next.push((s, xs - 1));
            }
            if xe < e {
                next.push((xe + 1, e));
            }
        }
        ranges = next;
    }
    ranges
        .into_iter()
        .map(|(s, e)| AddrRange {
            first: addr(family, s),
            last: addr(family, e),
        })
        .collect()
}

/// The fewest prefixes that cover `start..=end` exactly.
fn range_prefixes(family: Family, mut start: u128, end: u128) -> Vec<IpNet> {
    let bits = u32::from(family.bits());
    let mut out = Vec::new();
    loop {
        // the largest block aligned at `start` that does not pass `end`
        let mut host = start.trailing_zeros().min(bits);
        while host > 0 && block_last(start, host) > end {
            host -= 1;
        }
        // host <= bits <= 128, so the prefix length fits in a u8
        out.push(prefix(family, start, (bits - host) as u8));
        let last = block_last(start, host);
        if last >= end {
            return out;
        }
        start = last + 1;
    }
}

/// The last address of the block of `2^host` addresses starting at `start`.
fn block_last(start: u128, host: u32) -> u128 {
    if host >= 128 {
        u128::MAX
    } else {
        start | ((1u128 << host) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(net: &str, excepts: &[&str]) -> Vec<String> {
        let excepts: Vec<IpNet> = excepts.iter().map(|s| s.parse().unwrap()).collect();
        subtract(net.parse().unwrap(), &excepts)
            .iter()
            .map(|r| match r.as_prefix() {
                Some(p) => p.to_string(),
                None => format!("{}-{}", r.first, r.last),
            })
            .collect()
    }

    #[test]
    fn cidr_minus_excepts_is_disjoint_ranges() {
        assert_eq!(shown("10.0.0.0/24", &["10.0.0.128/25"]), ["10.0.0.0/25"]);
        assert_eq!(
            shown("10.0.0.0/30", &["10.0.0.1/32"]),
            ["10.0.0.0/32", "10.0.0.2/31"]
        );
        assert_eq!(
            shown("10.0.0.0/8", &["10.244.0.0/16", "10.1.2.3/32"]),
            [
                "10.0.0.0-10.1.2.2",
                "10.1.2.4-10.243.255.255",
                "10.245.0.0-10.255.255.255"
            ]
        );
        assert_eq!(shown("0.0.0.0/0", &["128.0.0.0/1"]), ["0.0.0.0/1"]);
        assert_eq!(shown("::/0", &["::/1"]), ["8000::/1"]);
        assert_eq!(shown("::/0", &[]), ["::/0"]);
        assert_eq!(
            shown("2001:db8::/32", &["2001:db8::/34", "2001:db8:8000::/33"]),
            ["2001:db8:4000::/34"]
        );
        // excepts that overlap each other
        assert_eq!(
            shown("10.0.0.0/24", &["10.0.0.0/25", "10.0.0.0/26"]),
            ["10.0.0.128/25"]
        );
    }
}
