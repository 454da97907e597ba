//! [`BirdModel::validate`]: every field of the model checked, the neighbors' names derived,
//! the lists sorted and de-duplicated into a [`ValidModel`]; each error names the field and
//! the value.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use crate::error::{Error, Result};
use crate::model::{
    BirdModel, Community, Families, GracefulRestart, Neighbor, NeighborSpec, Timers, ValidModel,
    is_link_local, peer_label,
};

impl BirdModel {
    /// Checks every value and normalises every list (sorted, without
    /// repeats). The first problem found is returned, naming the field and
    /// the value.
    pub fn validate(&self) -> Result<ValidModel> {
        let router_id: Ipv4Addr =
            self.router_id
                .trim()
                .parse()
                .map_err(|source| Error::RouterIdSyntax {
                    value: self.router_id.clone(),
                    source,
                })?;
        if router_id.is_unspecified() {
            return Err(Error::RouterIdZero);
        }
        let asn = check_asn("bgp.asn", self.asn)?;
        if let Some(time) = self.graceful_restart {
            check_restart_time(time).map_err(|reason| Error::GracefulRestart {
                field: "bgp.gracefulRestart".to_owned(),
                reason,
            })?;
        }
        let default_gr = match self.graceful_restart {
            Some(restart_time) => GracefulRestart::On {
                restart_time,
                long_lived_stale_time: None,
            },
            None => GracefulRestart::Off,
        };

        let mut cidrs = BTreeSet::new();
        for &cidr in &self.cidrs {
            if cidr.trunc() != cidr {
                return Err(Error::CidrHostBits {
                    value: cidr,
                    truncated: cidr.trunc(),
                });
            }
            check_announceable("cidrs", cidr)?;
            cidrs.insert(cidr);
        }
        let mut host_routes = BTreeSet::new();
        for &addr in &self.addresses {
            let net = IpNet::from(addr);
            check_announceable("addresses", net)?;
            if !cidrs.iter().any(|c| c.contains(&addr)) {
                host_routes.insert(net);
            }
        }
        for &addr in &self.anycast {
            let net = IpNet::from(addr);
            check_announceable("anycast", net)?;
            host_routes.insert(net);
        }
        let mut services = BTreeSet::new();
        for &net in &self.services {
            if net.trunc() != net {
                return Err(Error::ServiceRouteHostBits {
                    value: net,
                    truncated: net.trunc(),
                });
            }
            check_announceable("services", net)?;
            services.insert(net);
        }
        let announced = cidrs
            .iter()
            .chain(host_routes.iter())
            .chain(services.iter());
        let (mut ipv6, mut ipv4) = (false, false);
        for net in announced {
            match net {
                IpNet::V6(_) => ipv6 = true,
                IpNet::V4(_) => ipv4 = true,
            }
        }
        let families = if ipv6 || ipv4 {
            Families { ipv6, ipv4 }
        } else {
            Families {
                ipv6: true,
                ipv4: true,
            }
        };

        let mut neighbors = Vec::with_capacity(self.neighbors.len());
        for (index, spec) in self.neighbors.iter().enumerate() {
            neighbors.push(check_neighbor(index, spec, families, default_gr)?);
        }
        neighbors.sort_by(|a, b| (a.address, &a.interface).cmp(&(b.address, &b.interface)));
        for pair in neighbors.windows(2) {
            let same_address = pair[0].address.is_some() && pair[0].address == pair[1].address;
            // A link-local address is unique only on its link; a dynamic
            // neighbor may be given once per interface.
            let same_link = pair[0].interface == pair[1].interface;
            let ll = pair[0].address.is_none_or(is_link_local);
            if (same_address && (!ll || same_link))
                || (pair[0].address.is_none() && pair[1].address.is_none() && same_link)
            {
                return Err(Error::DuplicateNeighbor {
                    peer: pair[0].peer(),
                });
            }
        }
        let mut names = BTreeSet::new();
        for n in &neighbors {
            if !names.insert(n.name.as_str()) {
                return Err(Error::DuplicateNeighborName {
                    name: n.name.clone(),
                });
            }
        }

        let communities: BTreeSet<Community> = self.communities.iter().copied().collect();
        Ok(ValidModel {
            router_id,
            asn,
            neighbors,
            graceful_restart: self.graceful_restart,
            families,
            cidrs: cidrs.into_iter().collect(),
            host_routes: host_routes.into_iter().collect(),
            services: services.into_iter().collect(),
            communities: communities.into_iter().collect(),
            import_default: self.import_default,
            graceful_shutdown: self.graceful_shutdown,
        })
    }
}

fn check_asn(field: &str, value: u64) -> Result<u32> {
    match u32::try_from(value) {
        Ok(asn) if asn != 0 => Ok(asn),
        _ => Err(Error::Asn {
            field: field.to_owned(),
            value,
        }),
    }
}

fn check_announceable(field: &'static str, net: IpNet) -> Result<()> {
    let reason = if net.prefix_len() == 0 {
        Some("a default route is not a pod prefix")
    } else {
        unusable(net.network())
    };
    match reason {
        Some(reason) => Err(Error::Unannounceable {
            field,
            value: net,
            reason,
        }),
        None => Ok(()),
    }
}

/// Why an address can neither be announced nor peered with, if it cannot.
fn unusable(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V6(a) if a.is_unspecified() => Some("unspecified address"),
        IpAddr::V6(a) if a.is_loopback() => Some("loopback address"),
        IpAddr::V6(a) if a.is_multicast() => Some("multicast address"),
        IpAddr::V6(a) if a.is_unicast_link_local() => Some("link-local address"),
        IpAddr::V4(a) if a.is_unspecified() => Some("unspecified address"),
        IpAddr::V4(a) if a.is_loopback() => Some("loopback address"),
        IpAddr::V4(a) if a.is_multicast() => Some("multicast address"),
        IpAddr::V4(a) if a.is_link_local() => Some("link-local address"),
        IpAddr::V4(a) if a.is_broadcast() => Some("broadcast address"),
        _ => None,
    }
}

fn check_neighbor(
    index: usize,
    spec: &NeighborSpec,
    families: Families,
    default_gr: GracefulRestart,
) -> Result<Neighbor> {
    let interface = match &spec.interface {
        Some(ifname) => {
            check_interface(ifname).map_err(|reason| Error::NeighborInterface {
                index,
                value: ifname.clone(),
                reason,
            })?;
            Some(ifname.clone())
        }
        None => None,
    };
    let text = spec.address.trim();
    let address = if text.is_empty() {
        if interface.is_none() {
            return Err(Error::NeighborAddressMissing { index });
        }
        None
    } else {
        let address: IpAddr = text
            .parse()
            .map_err(|source| Error::NeighborAddressSyntax {
                index,
                value: spec.address.clone(),
                source,
            })?;
        match (is_link_local(address), &interface) {
            (true, None) => {
                return Err(Error::NeighborAddressUnusable {
                    index,
                    address,
                    reason: "link-local address without an interface; set interface too",
                });
            }
            (false, Some(ifname)) => {
                return Err(Error::InterfaceNeedsLinkLocal {
                    index,
                    address,
                    interface: ifname.clone(),
                });
            }
            (true, Some(_)) => {}
            (false, None) => {
                if let Some(reason) = unusable(address) {
                    return Err(Error::NeighborAddressUnusable {
                        index,
                        address,
                        reason,
                    });
                }
            }
        }
        Some(address)
    };
    let peer = peer_label(address, interface.as_deref());
    let ipv4_session = address.is_some_and(|a| a.is_ipv4());
    if ipv4_session && !families.ipv4 {
        return Err(Error::NeighborNoFamily { index, peer });
    }
    let asn = check_asn(&format!("bgp.neighbors[{index}].asn"), spec.asn)?;
    let name = match &spec.name {
        Some(name) => {
            check_name(name).map_err(|reason| Error::NeighborName {
                index,
                value: name.clone(),
                reason,
            })?;
            name.clone()
        }
        None => derived_name(address, interface.as_deref()),
    };
    if let Some(password) = &spec.password {
        check_password(password).map_err(|reason| Error::Password {
            index,
            peer: peer.clone(),
            reason,
        })?;
    }
    if let Some(hops) = spec.multihop {
        if interface.is_some() {
            return Err(Error::InterfaceMultihop { index, peer });
        }
        if hops == 0 {
            return Err(Error::Multihop {
                index,
                peer,
                value: hops,
            });
        }
        if spec.bfd && spec.source_address.is_none() {
            return Err(Error::MultihopBfdNeedsSource { index, peer });
        }
    }
    if let Some(source_address) = spec.source_address
        && source_address.is_ipv4() != ipv4_session
    {
        return Err(Error::SourceFamily {
            index,
            peer,
            source_address,
        });
    }
    if let Some(t) = spec.timers {
        check_timers(t).map_err(|reason| Error::Timers {
            index,
            peer: peer.clone(),
            reason,
        })?;
    }
    if let Some(b) = spec.bfd_timing {
        let reason = if !(1..=60_000).contains(&b.interval_ms) {
            Some(format!(
                "interval {} ms is out of range (1 to 60000 ms)",
                b.interval_ms
            ))
        } else if b.multiplier == 0 {
            Some("multiplier 0 is out of range (1 to 255)".to_owned())
        } else if !spec.bfd {
            Some("BFD timing is set but BFD is off".to_owned())
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::Bfd {
                index,
                peer,
                reason,
            });
        }
    }
    let graceful_restart = spec.graceful_restart.unwrap_or(default_gr);
    if let GracefulRestart::On {
        restart_time,
        long_lived_stale_time,
    } = graceful_restart
    {
        let field = format!("bgp.neighbors[{index}].gracefulRestart");
        check_restart_time(restart_time).map_err(|reason| Error::GracefulRestart {
            field: field.clone(),
            reason,
        })?;
        if let Some(stale) = long_lived_stale_time
            && !(1..=0xff_ffff).contains(&stale)
        {
            return Err(Error::GracefulRestart {
                field,
                reason: format!(
                    "long-lived stale time {stale} is out of range (1 to 16777215 seconds)"
                ),
            });
        }
    }
    Ok(Neighbor {
        name,
        address,
        interface,
        asn,
        password: spec.password.clone(),
        bfd: spec.bfd,
        bfd_timing: spec.bfd_timing,
        graceful_restart,
        multihop: spec.multihop,
        source_address: spec.source_address,
        timers: spec.timers,
    })
}

fn check_restart_time(time: u16) -> Result<(), String> {
    if (1..=4095).contains(&time) {
        Ok(())
    } else {
        Err(format!(
            "restart time {time} is out of range (1 to 4095 seconds); turn graceful restart off instead of 0"
        ))
    }
}

/// A Linux interface name BIRD can be given in quotes.
fn check_interface(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 15 {
        return Err("it is longer than 15 bytes, the Linux limit");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
    {
        return Err("it has a character other than a letter, a digit, '-', '_', '.' or '@'");
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    match chars.next() {
        None => return Err("it is empty"),
        Some(c) if !c.is_ascii_alphabetic() => return Err("it does not start with a letter"),
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("it has a character other than a letter, a digit or '_'");
    }
    if name.len() > 64 {
        return Err("it is longer than 64 characters");
    }
    if name.starts_with("flock_") {
        return Err("names starting with \"flock_\" are flock's own protocols");
    }
    Ok(())
}

/// `peer6_2001_db8__fe`: the address in its canonical text form with
/// separators turned into `_`. Canonical text is unique per address and the
/// family tag keeps IPv4 and IPv6 names apart. A link-local session adds its
/// interface (`peer6_fe80__2_eth0`); a dynamic one is named after the
/// interface alone (`peer6_eth0`).
fn derived_name(address: Option<IpAddr>, interface: Option<&str>) -> String {
    let tag = if address.is_some_and(|a| a.is_ipv4()) {
        "peer4"
    } else {
        "peer6"
    };
    let mut name = String::from(tag);
    for part in [address.map(|a| a.to_string()), interface.map(str::to_owned)]
        .into_iter()
        .flatten()
    {
        name.push('_');
        name.extend(
            part.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
        );
    }
    name
}

fn check_password(password: &str) -> Result<(), &'static str> {
    if password.is_empty() {
        return Err("is empty; leave it out for no password");
    }
    if password.contains('"') {
        return Err("contains '\"', which cannot be written into the BIRD configuration");
    }
    if password.contains('\\') {
        return Err("contains '\\', which cannot be written into the BIRD configuration");
    }
    if password.chars().any(|c| c.is_control()) {
        return Err("contains a control character (a newline?)");
    }
    if password.len() > 80 {
        return Err("is longer than 80 bytes, the TCP MD5 key limit");
    }
    Ok(())
}

fn check_timers(t: Timers) -> Result<(), String> {
    if t.hold != 0 && t.hold < 3 {
        return Err(format!("hold {} must be 0 or at least 3 seconds", t.hold));
    }
    if t.keepalive == 0 {
        return Err("keepalive 0 is not allowed".to_owned());
    }
    if t.hold != 0 && t.keepalive >= t.hold {
        return Err(format!(
            "keepalive {} must be below hold {} (a third of it is usual)",
            t.keepalive, t.hold
        ));
    }
    if t.connect_retry == 0 {
        return Err("connect_retry 0 is not allowed".to_owned());
    }
    Ok(())
}
