//! The node's pools and every address held on it.

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use flock_embed::{Identity, Layout};
use ipnet::{Ipv4Net, Ipv6Net};

use crate::annotations::{
    AlgoSource, KEY_ADDRESSES, KEY_CIDR4, KEY_CIDR6, KEY_IP_ALGO, KEY_IPV4, KEY_IPV6,
};
use crate::bitmap::Bitmap;
use crate::reserved::{forbidden_count6, is_forbidden6};
use crate::{Error, Family, PodRequest, Result, Want, effective_cidr4, effective_cidr6};

/// Random IPv6 host bits are drawn at most this often before giving up.
pub const MAX_RANDOM_TRIES: u32 = 16;
/// The longest IPv4 prefix that still holds a pod address (a /30 holds one).
pub const MIN_PREFIX4: u8 = 30;
/// The shortest IPv4 node prefix the bitmap accepts (a /8 is 2 MiB of bits).
const MAX_PREFIX4_SIZE: u8 = 8;
/// When random tries fail and at most this many bits are random, the free
/// values are enumerated from a random start instead of failing.
const ENUMERATE_RANDOM_BITS: u8 = 16;

/// The addresses handed to one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The pod's IPv6 address (a /128 on its interface).
    pub ipv6: Option<Ipv6Addr>,
    /// The pod's IPv4 address (a /32 on its interface).
    pub ipv4: Option<Ipv4Addr>,
    /// The effective IPv6 CIDR it came from.
    pub cidr6: Option<Ipv6Net>,
    /// The effective IPv4 CIDR it came from.
    pub cidr4: Option<Ipv4Net>,
    /// The ip-algo counter `n` used, when the spec has one.
    pub counter: Option<u64>,
    /// The `addresses` annotation, held for this pod.
    pub addresses: Vec<IpAddr>,
}

impl Allocation {
    /// Every address this allocation holds in the pools.
    pub fn held(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ipv6
            .map(IpAddr::V6)
            .into_iter()
            .chain(self.ipv4.map(IpAddr::V4))
            .chain(self.addresses.iter().copied())
    }
}

/// Usage and sizes of the node's pools, for metrics and STATUS.
///
/// `allocatedN` and `capacityN` count the same set — the addresses of the current node CIDR
/// a pod may be given — so `allocatedN <= capacityN` always holds and `allocatedN ==
/// capacityN` means the pool is exhausted ([`Pools::exhausted`]). Addresses held outside
/// that set (fixed `addresses` elsewhere, anycast addresses reserved in the pools, pods left
/// in an old CIDR after a CIDR change, a forbidden address reserved by hand) are counted
/// only in `heldN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// IPv6 addresses held inside the node's IPv6 CIDR that a pod may get (the all-zero
    /// host and RFC 5453's reserved interface IDs excluded).
    pub allocated6: usize,
    /// IPv4 addresses held inside the node's IPv4 CIDR that a pod may get (network, first
    /// host and broadcast excluded).
    pub allocated4: usize,
    /// Every IPv6 address held, inside the node CIDR or not.
    pub held6: usize,
    /// Every IPv4 address held, inside the node CIDR or not.
    pub held4: usize,
    /// Addresses of the node's IPv6 CIDR a pod may get (saturating; 0 without a CIDR).
    pub capacity6: u128,
    /// Addresses of the node's IPv4 CIDR a pod may get (0 without a CIDR).
    pub capacity4: u64,
}

#[derive(Debug, Clone)]
struct Pool4 {
    cidr: Ipv4Net,
    base: u32,
    bits: Bitmap,
    /// Where the next search starts: after the last address handed out, so
    /// a released address is not reused at once while others are free.
    cursor: u32,
}

impl Pool4 {
    /// How many of the addresses never handed out — network, first host, broadcast — are
    /// held anyway (reserved by hand, or pods of an older, larger CIDR).
    fn never_handed_out_held(&self) -> usize {
        let last = self.bits.len() - 1;
        let mut never = vec![0, 1.min(last), last];
        never.dedup();
        never.into_iter().filter(|&i| self.bits.get(i)).count()
    }
}

/// The node's pools: its optional IPv6 and IPv4 CIDRs and every address in
/// use — allocated, reserved at start-up, or fixed by the `addresses`
/// annotation, inside the CIDRs or not.
///
/// ```
/// use flock_embed::Identity;
/// use flock_ipam::{NodeDefaults, PodRequest, Pools};
/// use rand_chacha::{ChaCha8Rng, rand_core::SeedableRng};
///
/// let mut pools = Pools::new(Some("2001:db8:0:1::/64".parse()?), Some("10.244.1.0/24".parse()?))?;
/// let request = PodRequest::defaults(&NodeDefaults::for_cidrs(true, true));
/// let pod = Identity { namespace: "default", workload: "web", pod: "web-0", ..Identity::default() };
/// let got = pools.allocate(&request, &pod, &mut ChaCha8Rng::seed_from_u64(7))?;
/// assert_eq!(got.ipv4, Some("10.244.1.2".parse()?));
/// assert!(pools.is_allocated(got.ipv6.unwrap().into()));
/// pools.release_allocation(&got);
/// assert_eq!(pools.stats().allocated6, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Pools {
    cidr6: Option<Ipv6Net>,
    held6: HashSet<Ipv6Addr>,
    /// How many of `held6` a pod of `cidr6` may get (inside it, not forbidden).
    pooled6: usize,
    v4: Option<Pool4>,
    /// IPv4 addresses held outside the node's IPv4 CIDR.
    held4_outside: BTreeSet<Ipv4Addr>,
}

impl Pools {
    /// Empty pools for the node's CIDRs (host bits are ignored).
    pub fn new(cidr6: Option<Ipv6Net>, cidr4: Option<Ipv4Net>) -> Result<Self> {
        let mut pools = Self {
            cidr6: None,
            held6: HashSet::new(),
            pooled6: 0,
            v4: None,
            held4_outside: BTreeSet::new(),
        };
        pools.set_node_cidrs(cidr6, cidr4)?;
        Ok(pools)
    }

    /// The node's IPv6 CIDR.
    pub fn cidr6(&self) -> Option<Ipv6Net> {
        self.cidr6
    }

    /// The node's IPv4 CIDR.
    pub fn cidr4(&self) -> Option<Ipv4Net> {
        self.v4.as_ref().map(|p| p.cidr)
    }

    /// Changes the node's CIDRs. Every held address stays held — also those
    /// now outside the CIDRs — until released (DESIGN §3: a CIDR change must
    /// not strand live pods). On error nothing changes.
    pub fn set_node_cidrs(&mut self, cidr6: Option<Ipv6Net>, cidr4: Option<Ipv4Net>) -> Result<()> {
        let cidr4 = cidr4.map(|c| c.trunc());
        if cidr4 != self.cidr4() {
            let mut v4 = match cidr4 {
                Some(cidr) if cidr.prefix_len() < MAX_PREFIX4_SIZE => {
                    return Err(Error::CidrTooLarge { cidr: cidr.into() });
                }
                Some(cidr) => {
                    let base = u32::from(cidr.network());
                    let len = u32::try_from(1u64 << (32 - cidr.prefix_len())).unwrap_or(u32::MAX);
                    Some(Pool4 {
                        cidr,
                        base,
                        bits: Bitmap::new(len),
                        cursor: 0,
                    })
                }
                None => None,
            };
            let mut outside = BTreeSet::new();
            let old: Vec<Ipv4Addr> = self.held4().collect();
            for addr in old {
                match v4.as_mut().filter(|p| p.cidr.contains(&addr)) {
                    Some(pool) => {
                        pool.bits.insert(u32::from(addr) - pool.base);
                    }
                    None => {
                        outside.insert(addr);
                    }
                }
            }
            self.v4 = v4;
            self.held4_outside = outside;
        }
        self.cidr6 = cidr6.map(|c| c.trunc());
        self.pooled6 = self.held6.iter().filter(|&&a| self.in_pool6(a)).count();
        Ok(())
    }

    /// Whether `addr` is an address of the node's IPv6 CIDR a pod may get.
    fn in_pool6(&self, addr: Ipv6Addr) -> bool {
        self.cidr6
            .is_some_and(|c| c.contains(&addr) && !is_forbidden6(addr, c))
    }

    /// Holds `addr`; false if it already was.
    fn insert6(&mut self, addr: Ipv6Addr) -> bool {
        let fresh = self.held6.insert(addr);
        if fresh && self.in_pool6(addr) {
            self.pooled6 += 1;
        }
        fresh
    }

    /// Frees `addr`; false if it was not held.
    fn remove6(&mut self, addr: Ipv6Addr) -> bool {
        let held = self.held6.remove(&addr);
        if held && self.in_pool6(addr) {
            self.pooled6 -= 1;
        }
        held
    }

    fn held4(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        let inside = self
            .v4
            .iter()
            .flat_map(|p| p.bits.iter().map(move |i| Ipv4Addr::from(p.base + i)));
        inside.chain(self.held4_outside.iter().copied())
    }

    /// Whether `addr` is held.
    pub fn is_allocated(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V6(a) => self.held6.contains(&a),
            IpAddr::V4(a) => match &self.v4 {
                Some(p) if p.cidr.contains(&a) => p.bits.get(u32::from(a) - p.base),
                _ => self.held4_outside.contains(&a),
            },
        }
    }

    /// Marks `addr` as held — for start-up reconcile and fixed addresses —
    /// failing with [`Error::InUse`] if it already is. Any address can be
    /// reserved, inside the node CIDRs or not.
    pub fn reserve(&mut self, addr: IpAddr) -> Result<()> {
        let fresh = match addr {
            IpAddr::V6(a) => self.insert6(a),
            IpAddr::V4(a) => match &mut self.v4 {
                Some(p) if p.cidr.contains(&a) => p.bits.insert(u32::from(a) - p.base),
                _ => self.held4_outside.insert(a),
            },
        };
        if fresh {
            Ok(())
        } else {
            Err(Error::InUse { addr })
        }
    }

    /// Frees `addr`; returns whether it was held.
    pub fn release(&mut self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V6(a) => self.remove6(a),
            IpAddr::V4(a) => match &mut self.v4 {
                Some(p) if p.cidr.contains(&a) => p.bits.remove(u32::from(a) - p.base),
                _ => self.held4_outside.remove(&a),
            },
        }
    }

    /// Frees every address of an allocation.
    pub fn release_allocation(&mut self, allocation: &Allocation) {
        for addr in allocation.held() {
            self.release(addr);
        }
    }

    /// Every held address, sorted (IPv4 before IPv6).
    pub fn snapshot(&self) -> Vec<IpAddr> {
        let mut all: Vec<IpAddr> = self
            .held4()
            .map(IpAddr::V4)
            .chain(self.held6.iter().copied().map(IpAddr::V6))
            .collect();
        all.sort_unstable();
        all
    }

    /// Usage and pool sizes per family; see [`PoolStats`] for what is counted where.
    pub fn stats(&self) -> PoolStats {
        let capacity6 = self.cidr6.map_or(0, |c| {
            let host = 128 - u32::from(c.prefix_len());
            let total = if host >= 128 {
                u128::MAX
            } else {
                1u128 << host
            };
            total.saturating_sub(forbidden_count6(c))
        });
        let capacity4 = self.v4.as_ref().map_or(0, |p| {
            if p.cidr.prefix_len() > MIN_PREFIX4 {
                0
            } else {
                u64::from(p.bits.len()) - 3
            }
        });
        let (allocated4, inside4) = self.v4.as_ref().map_or((0, 0), |p| {
            let inside = p.bits.count() as usize;
            (inside - p.never_handed_out_held(), inside)
        });
        PoolStats {
            allocated6: self.pooled6,
            allocated4,
            held6: self.held6.len(),
            held4: inside4 + self.held4_outside.len(),
            capacity6,
            capacity4,
        }
    }

    /// Whether the node's pool of `family` has no address left for a pod — every address of
    /// the node CIDR a pod may get is held — and if so, the [`Error::Exhausted`] naming the
    /// CIDR and how many of its addresses are in use. Addresses held outside the node CIDR do
    /// not count (see [`PoolStats`]). A family the node has no CIDR for is not exhausted, it
    /// is absent ([`Error::NoNodeCidr`] on allocation): `None`.
    ///
    /// This is the node-wide answer STATUS gives; an allocation from a smaller effective CIDR
    /// (a `cidr6`/`cidr4` annotation) can still fail while the node's pool is not exhausted.
    pub fn exhausted(&self, family: Family) -> Option<Error> {
        let s = self.stats();
        let (cidr, full, allocated) = match family {
            Family::V6 => (
                self.cidr6?.into(),
                s.allocated6 as u128 >= s.capacity6,
                s.allocated6,
            ),
            Family::V4 => (
                self.cidr4()?.into(),
                s.allocated4 as u64 >= s.capacity4,
                s.allocated4,
            ),
        };
        full.then_some(Error::Exhausted {
            family,
            cidr,
            allocated,
        })
    }

    /// Serves a pod: holds its fixed `addresses`, then an IPv6 and an IPv4
    /// address from the effective CIDRs as asked. All or nothing: on error
    /// nothing stays held.
    pub fn allocate(
        &mut self,
        request: &PodRequest,
        identity: &Identity<'_>,
        rng: &mut (impl rand_core::Rng + ?Sized),
    ) -> Result<Allocation> {
        if !request.ipv6.wanted() && !request.ipv4.wanted() {
            return Err(Error::NoFamily);
        }
        let mut taken: Vec<IpAddr> = Vec::new();
        let result = self.allocate_into(request, identity, rng, &mut taken);
        if result.is_err() {
            for addr in taken {
                self.release(addr);
            }
        }
        result
    }

    fn allocate_into(
        &mut self,
        request: &PodRequest,
        identity: &Identity<'_>,
        rng: &mut (impl rand_core::Rng + ?Sized),
        taken: &mut Vec<IpAddr>,
    ) -> Result<Allocation> {
        for &addr in &request.addresses {
            self.reserve(addr).map_err(|_| Error::Annotation {
                key: KEY_ADDRESSES.to_owned(),
                value: join(&request.addresses),
                reason: format!("{addr} is already in use"),
            })?;
            taken.push(addr);
        }
        let mut allocation = Allocation {
            ipv6: None,
            ipv4: None,
            cidr6: None,
            cidr4: None,
            counter: None,
            addresses: request.addresses.clone(),
        };
        if request.ipv6.wanted() {
            let node = self
                .cidr6
                .ok_or_else(|| no_node_cidr(Family::V6, request.ipv6))?;
            let cidr = effective_cidr6(&request.cidr6, node)
                .map_err(|e| cidr_annotation(KEY_CIDR6, join(&request.cidr6), e))?;
            let (addr, counter) = self.allocate6(cidr, request, identity, rng)?;
            taken.push(addr.into());
            allocation.ipv6 = Some(addr);
            allocation.cidr6 = Some(cidr);
            allocation.counter = counter;
        }
        if request.ipv4.wanted() {
            let node = self
                .cidr4()
                .ok_or_else(|| no_node_cidr(Family::V4, request.ipv4))?;
            let cidr = effective_cidr4(&request.cidr4, node)
                .map_err(|e| cidr_annotation(KEY_CIDR4, join(&request.cidr4), e))?;
            let addr = self.allocate4(cidr)?;
            taken.push(addr.into());
            allocation.ipv4 = Some(addr);
            allocation.cidr4 = Some(cidr);
        }
        Ok(allocation)
    }

    fn allocate6(
        &mut self,
        cidr: Ipv6Net,
        request: &PodRequest,
        identity: &Identity<'_>,
        rng: &mut (impl rand_core::Rng + ?Sized),
    ) -> Result<(Ipv6Addr, Option<u64>)> {
        let algo = &request.ip_algo;
        let algo_error = |reason: String| Error::Annotation {
            key: KEY_IP_ALGO.to_owned(),
            value: algo.to_string(),
            reason: match request.ip_algo_source {
                AlgoSource::Pod => reason,
                AlgoSource::Node => {
                    format!("{reason} (the node's default, from its NodeConfig annotation)")
                }
                AlgoSource::Default => format!("{reason} (the default)"),
            },
        };
        if cidr.prefix_len() == 128 {
            return Err(Error::CidrTooSmall { cidr: cidr.into() });
        }
        let layout = algo
            .layout(128 - cidr.prefix_len())
            .map_err(|e| algo_error(format!("{e} (effective CIDR {cidr})")))?;
        let base = u128::from(cidr.network());
        if let Some(values) = layout.counter_values() {
            // Each n gives a distinct address, so this ends after at most
            // (held + forbidden + 1) tries even for a 64-bit counter.
            let mut n: u64 = 0;
            loop {
                let addr = Ipv6Addr::from(base | layout.host_bits(identity, n, rng));
                if self.take6(addr, cidr) {
                    return Ok((addr, Some(n)));
                }
                if u128::from(n) + 1 >= values {
                    return Err(algo_error(format!(
                        "all {values} values of the counter n give addresses in use in {cidr}; widen n or add random bits"
                    )));
                }
                n += 1;
            }
        }
        if layout.random_bits() == 0 {
            let addr = Ipv6Addr::from(base | layout.host_bits(identity, 0, rng));
            if self.take6(addr, cidr) {
                return Ok((addr, None));
            }
            if is_forbidden6(addr, cidr) {
                return Err(algo_error(format!(
                    "gives {addr}, the all-zero host or a reserved interface ID of RFC 5453 in {cidr}; add an n field or random bits"
                )));
            }
            return Err(algo_error(format!(
                "{addr} is already in use and the spec has neither a counter n nor random bits to try another; add an n field"
            )));
        }
        for _ in 0..MAX_RANDOM_TRIES {
            let addr = Ipv6Addr::from(base | layout.host_bits(identity, 0, rng));
            if self.take6(addr, cidr) {
                return Ok((addr, None));
            }
        }
        if layout.random_bits() <= ENUMERATE_RANDOM_BITS
            && let Some(addr) = self.enumerate6(&layout, base, cidr, identity, rng)
        {
            return Ok((addr, None));
        }
        Err(Error::Exhausted {
            family: Family::V6,
            cidr: cidr.into(),
            allocated: self.pooled6,
        })
    }

    /// Small random spaces: every value of the random bits, from a random start.
    fn enumerate6(
        &mut self,
        layout: &Layout,
        base: u128,
        cidr: Ipv6Net,
        identity: &Identity<'_>,
        rng: &mut (impl rand_core::Rng + ?Sized),
    ) -> Option<Ipv6Addr> {
        let span = 1u64 << layout.random_bits();
        let start = rng.next_u64() % span;
        (0..span).find_map(|i| {
            let random = u128::from((start + i) % span);
            let addr = Ipv6Addr::from(base | layout.host_bits_with(identity, 0, random));
            self.take6(addr, cidr).then_some(addr)
        })
    }

    fn take6(&mut self, addr: Ipv6Addr, cidr: Ipv6Net) -> bool {
        !is_forbidden6(addr, cidr) && self.insert6(addr)
    }

    fn allocate4(&mut self, cidr: Ipv4Net) -> Result<Ipv4Addr> {
        if cidr.prefix_len() > MIN_PREFIX4 {
            return Err(Error::CidrTooSmall { cidr: cidr.into() });
        }
        let found = self.v4.as_ref().and_then(|pool| {
            // never the network, the first host or the broadcast address
            let lo = u32::from(cidr.network()) - pool.base + 2;
            let hi = u32::from(cidr.broadcast()) - pool.base;
            let start = pool.cursor.clamp(lo, hi);
            pool.bits
                .first_free(start, hi)
                .or_else(|| pool.bits.first_free(lo, start))
        });
        let (Some(index), Some(pool)) = (found, self.v4.as_mut()) else {
            return Err(Error::Exhausted {
                family: Family::V4,
                cidr: cidr.into(),
                allocated: self.stats().allocated4,
            });
        };
        pool.bits.insert(index);
        pool.cursor = index + 1;
        Ok(Ipv4Addr::from(pool.base + index))
    }
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn no_node_cidr(family: Family, want: Want) -> Error {
    match want {
        Want::ByAnnotation => Error::Annotation {
            key: if family == Family::V6 {
                KEY_IPV6
            } else {
                KEY_IPV4
            }
            .to_owned(),
            value: "true".to_owned(),
            reason: format!(
                "the node has no {family} pod CIDR (NodeConfig spec.cidr{})",
                if family == Family::V6 { "6" } else { "4" }
            ),
        },
        _ => Error::NoNodeCidr { family },
    }
}

fn cidr_annotation(key: &str, value: String, error: Error) -> Error {
    match error {
        Error::NoEffectiveCidr { node, .. } => Error::Annotation {
            key: key.to_owned(),
            value,
            reason: format!("none of these CIDRs overlaps the node's pod CIDR {node}"),
        },
        other => other,
    }
}
