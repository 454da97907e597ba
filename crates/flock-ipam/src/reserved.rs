//! Addresses that are never handed out.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// Reserved interface identifiers of RFC 5453 (inclusive ranges), checked on
/// the low 64 bits of addresses in CIDRs of /64 or shorter.
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

/// Whether `addr` must never be given to a pod of `cidr`: the all-zero host
/// (subnet-router anycast) for any prefix length, and for prefixes of /64 or
/// shorter the reserved interface IDs of RFC 5453.
pub fn is_forbidden6(addr: Ipv6Addr, cidr: Ipv6Net) -> bool {
    let bits = u128::from(addr);
    if bits & u128::from(cidr.hostmask()) == 0 {
        return true;
    }
    if cidr.prefix_len() <= 64 {
        let iid = bits as u64; // the low 64 bits are the interface ID
        return RESERVED_IIDS
            .iter()
            .any(|&(lo, hi)| (lo..=hi).contains(&iid));
    }
    false
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
        // shorter prefix: IIDs of every /64 inside; longer: only the zero host
        let wide: Ipv6Net = "2001:db8::/48".parse().unwrap();
        assert!(is_forbidden6("2001:db8:0:7::".parse().unwrap(), wide));
        let narrow: Ipv6Net = "2001:db8::ff00/120".parse().unwrap();
        assert!(is_forbidden6("2001:db8::ff00".parse().unwrap(), narrow));
        assert!(!is_forbidden6("2001:db8::ffff".parse().unwrap(), narrow));
        assert_eq!(RESERVED_PER_64, 1 + 128 + (1 << 24));
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
