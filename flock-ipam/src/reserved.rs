//! Addresses that are never handed out.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// Reserved interface identifiers of RFC 5453 (inclusive ranges), checked on
/// the low 64 bits of every address, whatever the CIDR's prefix length (an
/// address of a /120 still has a 64-bit interface ID).
pub(crate) const RESERVED_IIDS: [(u64, u64); 3] = [
    // Subnet-Router Anycast (RFC 4291)
    (0, 0),
    // Reserved Subnet Anycast Addresses (RFC 2526)
    (0xFDFF_FFFF_FFFF_FF80, 0xFDFF_FFFF_FFFF_FFFF),
    // IANA Ethernet block (RFC 4291), including Proxy Mobile IPv6 at
    // 0200:5EFF:FE00:5213 (RFC 6543) between its two halves
    (0x0200_5EFF_FE00_0000, 0x0200_5EFF_FEFF_FFFF),
];

/// How many addresses of one /64 [`RESERVED_IIDS`] cover.
pub(crate) const RESERVED_PER_64: u128 = {
    let mut total = 0u128;
    let mut i = 0;
    while i < RESERVED_IIDS.len() {
        total += (RESERVED_IIDS[i].1 - RESERVED_IIDS[i].0) as u128 + 1;
        i += 1;
    }
    total
};

fn is_reserved_iid(iid: u64) -> bool {
    RESERVED_IIDS
        .iter()
        .any(|&(lo, hi)| (lo..=hi).contains(&iid))
}

/// Whether `addr` must never be given to a pod of `cidr`: the all-zero host
/// (subnet-router anycast) and the reserved interface IDs of RFC 5453.
pub fn is_forbidden6(addr: Ipv6Addr, cidr: Ipv6Net) -> bool {
    let bits = u128::from(addr);
    bits & u128::from(cidr.hostmask()) == 0 || is_reserved_iid(bits as u64)
}

/// How many addresses of `cidr` [`is_forbidden6`] refuses.
pub(crate) fn forbidden_count6(cidr: Ipv6Net) -> u128 {
    if cidr.prefix_len() <= 64 {
        // Every /64 inside holds each reserved IID once; its zero host is IID 0.
        let per64 = 1u128 << (64 - u32::from(cidr.prefix_len()));
        return per64.saturating_mul(RESERVED_PER_64);
    }
    // The CIDR's addresses share their high 64 bits: count the IIDs of its span.
    let (lo, hi) = (
        u128::from(cidr.network()) as u64,
        u128::from(cidr.broadcast()) as u64,
    );
    let reserved: u128 = RESERVED_IIDS
        .iter()
        .map(|&(a, b)| {
            let (from, to) = (a.max(lo), b.min(hi));
            if from <= to {
                u128::from(to - from) + 1
            } else {
                0
            }
        })
        .sum();
    // The zero host, unless it is a reserved IID already.
    reserved + u128::from(!is_reserved_iid(lo))
}

/// Whether `addr` must never be given to a pod of `cidr`: its network
/// address, its first host (`.1`, flock's gateway convention) and its
/// broadcast address.
pub fn is_forbidden4(addr: Ipv4Addr, cidr: Ipv4Net) -> bool {
    let a = u32::from(addr);
    let net = u32::from(cidr.network());
    a == net || a == net.wrapping_add(1) || a == u32::from(cidr.broadcast())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `forbidden_count6` agrees with `is_forbidden6` over every address of small CIDRs
    /// placed across the reserved ranges' edges.
    #[test]
    fn forbidden_count_matches_the_predicate() {
        for (base, len) in [
            ("2001:db8::", 120u8),
            ("2001:db8:0:1:fdff:ffff:ffff:ff00", 120),
            ("2001:db8:0:1:fdff:ffff:ffff:ff80", 121),
            ("2001:db8:0:1:fdff:ffff:ffff:ff00", 122),
            ("2001:db8:0:1:200:5eff:fdff:ff00", 112),
            ("2001:db8:0:1:200:5eff:feff:ff00", 120),
            ("2001:db8:0:1:200:5eff:fe00:5200", 120),
        ] {
            let cidr = Ipv6Net::new(base.parse().unwrap(), len).unwrap().trunc();
            let all =
                (u128::from(cidr.network())..=u128::from(cidr.broadcast())).map(Ipv6Addr::from);
            let counted = all.filter(|&a| is_forbidden6(a, cidr)).count() as u128;
            assert_eq!(forbidden_count6(cidr), counted, "{cidr}");
        }
    }

    #[test]
    fn rfc5453_list() {
        let net: Ipv6Net = "2001:db8:0:1::/64".parse().unwrap();
        for bad in [
            "2001:db8:0:1::",
            "2001:db8:0:1:fdff:ffff:ffff:ff80",
            "2001:db8:0:1:fdff:ffff:ffff:ffff",
            "2001:db8:0:1:200:5eff:fe00:0",
            "2001:db8:0:1:200:5eff:fe00:5212",
            "2001:db8:0:1:200:5eff:fe00:5213",
            "2001:db8:0:1:200:5eff:fe00:5214",
            "2001:db8:0:1:200:5eff:feff:ffff",
        ] {
            assert!(is_forbidden6(bad.parse().unwrap(), net), "{bad}");
        }
        for good in [
            "2001:db8:0:1::1",
            "2001:db8:0:1:fdff:ffff:ffff:ff7f",
            "2001:db8:0:1:fe00::",
            "2001:db8:0:1:200:5eff:fdff:ffff",
            "2001:db8:0:1:200:5eff:ff00:0",
        ] {
            assert!(!is_forbidden6(good.parse().unwrap(), net), "{good}");
        }
        // shorter prefix: IIDs of every /64 inside; longer: the zero host and
        // the reserved IIDs its span holds
        let wide: Ipv6Net = "2001:db8::/48".parse().unwrap();
        assert!(is_forbidden6("2001:db8:0:7::".parse().unwrap(), wide));
        let narrow: Ipv6Net = "2001:db8::ff00/120".parse().unwrap();
        assert!(is_forbidden6("2001:db8::ff00".parse().unwrap(), narrow));
        assert!(!is_forbidden6("2001:db8::ffff".parse().unwrap(), narrow));
        assert_eq!(forbidden_count6(narrow), 1);
        let anycast: Ipv6Net = "2001:db8:0:1:fdff:ffff:ffff:ff00/120".parse().unwrap();
        assert!(is_forbidden6(
            "2001:db8:0:1:fdff:ffff:ffff:ff80".parse().unwrap(),
            anycast
        ));
        assert!(is_forbidden6(
            "2001:db8:0:1:fdff:ffff:ffff:ffff".parse().unwrap(),
            anycast
        ));
        assert!(!is_forbidden6(
            "2001:db8:0:1:fdff:ffff:ffff:ff7f".parse().unwrap(),
            anycast
        ));
        assert_eq!(forbidden_count6(anycast), 1 + 128);
        assert_eq!(RESERVED_PER_64, 1 + 128 + (1 << 24));
        assert_eq!(forbidden_count6(net), RESERVED_PER_64);
        assert_eq!(forbidden_count6(wide), RESERVED_PER_64 << 16);
    }

    #[test]
    fn ipv4_forbidden() {
        let net: Ipv4Net = "10.244.1.0/24".parse().unwrap();
        for (a, bad) in [
            ("10.244.1.0", true),
            ("10.244.1.1", true),
            ("10.244.1.255", true),
            ("10.244.1.2", false),
            ("10.244.1.254", false),
        ] {
            assert_eq!(is_forbidden4(a.parse().unwrap(), net), bad, "{a}");
        }
    }
}
