//! LoadBalancer address assignment from the pools' `loadBalancerCIDRs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::ServiceKey;
use crate::Family;

/// A LoadBalancer Service flock serves, as the assignment reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbRequest {
    /// The Service.
    pub key: ServiceKey,
    /// `spec.ipFamilies`, primary first; empty: IPv6 only.
    pub families: Vec<Family>,
    /// Addresses the Service asks for (`spec.loadBalancerIP`, flock's annotation), at most
    /// one per family.
    pub requested: Vec<IpAddr>,
    /// The addresses its status holds now (`status.loadBalancer.ingress`): the durable
    /// record of an earlier assignment, kept when still valid.
    pub current: Vec<IpAddr>,
}

/// The outcome of [`assign_lb_addresses`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LbPlan {
    /// Every Service's addresses, in the order of its families (a family that could not be
    /// served is left out and explained in `problems`).
    pub addresses: BTreeMap<ServiceKey, Vec<IpAddr>>,
    /// What could not be done, sorted by Service.
    pub problems: Vec<LbProblem>,
}

/// Why a Service did not get (all) its addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LbProblem {
    /// The Service.
    pub service: ServiceKey,
    /// What is wrong, naming the address or the family and what to change.
    pub reason: String,
}

fn family_of(addr: IpAddr) -> Family {
    if addr.is_ipv6() {
        Family::V6
    } else {
        Family::V4
    }
}

/// Addresses that are never handed out: an IPv6 subnet's all-zero host (subnet-router
/// anycast) and an IPv4 subnet's network and broadcast addresses.
fn reserved(addr: IpAddr, cidr: IpNet) -> bool {
    match (addr, cidr) {
        (IpAddr::V6(a), IpNet::V6(c)) => c.prefix_len() < 127 && a == c.network(),
        (IpAddr::V4(a), IpNet::V4(c)) => {
            c.prefix_len() < 31 && (a == c.network() || a == c.broadcast())
        }
        _ => true,
    }
}

fn usable(addr: IpAddr, cidrs: &[IpNet]) -> bool {
    cidrs
        .iter()
        .any(|c| c.contains(&addr) && !reserved(addr, *c))
        && super::unroutable(addr).is_none()
}

fn next(addr: IpAddr) -> Option<IpAddr> {
    match addr {
        IpAddr::V6(a) => u128::from(a)
            .checked_add(1)
            .map(|b| IpAddr::V6(Ipv6Addr::from(b))),
        IpAddr::V4(a) => u32::from(a)
            .checked_add(1)
            .map(|b| IpAddr::V4(Ipv4Addr::from(b))),
    }
}

/// The lowest usable address of `family` in `cidrs` (in their order) that is not taken.
fn lowest_free(cidrs: &[IpNet], family: Family, taken: &BTreeSet<IpAddr>) -> Option<IpAddr> {
    for &cidr in cidrs.iter().filter(|c| family_of(c.network()) == family) {
        let mut candidate = Some(cidr.network());
        // Every step past the first few skips a taken address, so the walk is bounded by
        // the number of addresses in use, never by the size of the CIDR.
        while let Some(addr) = candidate.filter(|a| cidr.contains(a)) {
            if !reserved(addr, cidr) && !taken.contains(&addr) && super::unroutable(addr).is_none()
            {
                return Some(addr);
            }
            candidate = next(addr);
        }
    }
    None
}

/// Hands out LoadBalancer addresses from `cidrs` (every pool's `loadBalancerCIDRs`).
///
/// - One address per family of `families` (IPv6 when empty), primary family first.
/// - A Service keeps the address of a family it holds ([`LbRequest::current`]) while that
///   address is inside the CIDRs, agrees with its request and no Service earlier in
///   `namespace/name` order holds it: the Service's status is the durable record, so a
///   restarted controller re-reads the same plan.
/// - A requested address is given if it is inside the CIDRs and free; otherwise the family
///   is left out and the problem named.
/// - Any other family gets the lowest free address of the CIDRs (never an IPv6 subnet's
///   zero host, an IPv4 network or broadcast address).
/// - An address no longer held by any request (its Service gone or no longer a flock
///   LoadBalancer) is free again.
///
/// No address is given to two Services; the plan does not depend on the order of
/// `requests` or of `cidrs` beyond which CIDR is searched first.
pub fn assign_lb_addresses(cidrs: &[IpNet], requests: &[LbRequest]) -> LbPlan {
    let cidrs: Vec<IpNet> = cidrs.iter().map(IpNet::trunc).collect();
    let mut sorted: Vec<&LbRequest> = requests.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    sorted.dedup_by(|a, b| a.key == b.key);

    let mut problems = BTreeSet::new();
    let mut problem = |key: &ServiceKey, reason: String| {
        problems.insert(LbProblem {
            service: key.clone(),
            reason,
        });
    };
    // Per service: the families it wants and the address (if any) wanted for each.
    struct Want<'r> {
        request: &'r LbRequest,
        families: Vec<(Family, Option<IpAddr>)>,
        got: BTreeMap<usize, IpAddr>,
    }
    let mut wants: Vec<Want<'_>> = Vec::with_capacity(sorted.len());
    for request in sorted {
        let mut families: Vec<(Family, Option<IpAddr>)> = Vec::new();
        let listed = if request.families.is_empty() {
            vec![Family::V6]
        } else {
            request.families.clone()
        };
        for f in listed {
            if !families.iter().any(|(g, _)| *g == f) {
                families.push((f, None));
            }
        }
        for &addr in &request.requested {
            let f = family_of(addr);
            match families.iter_mut().find(|(g, _)| *g == f) {
                None => problem(
                    &request.key,
                    format!("asks for {f} address {addr} but its ipFamilies do not include {f}"),
                ),
                Some((_, Some(first))) if *first != addr => problem(
                    &request.key,
                    format!("asks for two {f} addresses, {first} and {addr}; keep one"),
                ),
                Some((_, slot)) => *slot = Some(addr),
            }
        }
        wants.push(Want {
            request,
            families,
            got: BTreeMap::new(),
        });
    }

    let mut taken: BTreeMap<IpAddr, ServiceKey> = BTreeMap::new();
    // 1. Keep what each Service holds.
    for want in &mut wants {
        for (i, &(f, requested)) in want.families.iter().enumerate() {
            let keep = want.request.current.iter().copied().find(|&a| {
                family_of(a) == f
                    && usable(a, &cidrs)
                    && requested.is_none_or(|r| r == a)
                    && !taken.contains_key(&a)
            });
            if let Some(addr) = keep {
                taken.insert(addr, want.request.key.clone());
                want.got.insert(i, addr);
            }
        }
    }
    // 2. Requested addresses.
    for want in &mut wants {
        for (i, &(f, requested)) in want.families.iter().enumerate() {
            let Some(addr) = requested else { continue };
            if want.got.contains_key(&i) {
                continue;
            }
            if !usable(addr, &cidrs) {
                let within: Vec<String> = cidrs
                    .iter()
                    .filter(|c| family_of(c.network()) == f)
                    .map(ToString::to_string)
                    .collect();
                problem(
                    &want.request.key,
                    if within.is_empty() {
                        format!(
                            "asks for {addr} but no NodePool has {f} spec.services.loadBalancerCIDRs"
                        )
                    } else {
                        format!(
                            "asks for {addr}, which is not a usable address of the NodePools' spec.services.loadBalancerCIDRs ({})",
                            within.join(", ")
                        )
                    },
                );
            } else if let Some(holder) = taken.get(&addr) {
                problem(
                    &want.request.key,
                    format!("asks for {addr}, which Service {holder} holds"),
                );
            } else {
                taken.insert(addr, want.request.key.clone());
                want.got.insert(i, addr);
            }
        }
    }
    // 3. The lowest free address for every other family.
    let set: BTreeSet<IpAddr> = taken.keys().copied().collect();
    let mut set = set;
    for want in &mut wants {
        for (i, &(f, requested)) in want.families.iter().enumerate() {
            if requested.is_some() || want.got.contains_key(&i) {
                continue;
            }
            if !cidrs.iter().any(|c| family_of(c.network()) == f) {
                problem(
                    &want.request.key,
                    format!(
                        "wants an {f} address but no NodePool has {f} spec.services.loadBalancerCIDRs"
                    ),
                );
                continue;
            }
            match lowest_free(&cidrs, f, &set) {
                Some(addr) => {
                    set.insert(addr);
                    want.got.insert(i, addr);
                }
                None => problem(
                    &want.request.key,
                    format!(
                        "no free {f} address left in the NodePools' spec.services.loadBalancerCIDRs"
                    ),
                ),
            }
        }
    }
    let addresses = wants
        .into_iter()
        .map(|w| (w.request.key.clone(), w.got.into_values().collect()))
        .collect();
    LbPlan {
        addresses,
        problems: problems.into_iter().collect(),
    }
}
