//! The CIDRs already taken (kept assignments and hand-written NodeConfigs) of one family,
//! sorted so that those overlapping a pool are found by binary search, and the ones that
//! overlap each other reported.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::problems::{ClaimConflict, ClaimOwner};
use super::slots::Range;
use crate::Family;

/// Who holds a claim: an index into the kept assignments or the reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Holder {
    Kept(usize),
    Reserved(usize),
}

/// The claims of one family, sorted by range, with the running maximum of their last
/// addresses so that those overlapping a pool are found without scanning them all.
pub(super) struct Claims {
    sorted: Vec<(Range, Holder)>,
    max_last: Vec<u128>,
}

impl Claims {
    pub(super) fn new(mut sorted: Vec<(Range, Holder)>) -> Claims {
        sorted.sort_unstable();
        let max_last = sorted
            .iter()
            .scan(0u128, |m, (r, _)| {
                *m = (*m).max(r.last);
                Some(*m)
            })
            .collect();
        Claims { sorted, max_last }
    }

    /// The claims that overlap `pool`, in order.
    pub(super) fn within(&self, pool: Range) -> impl Iterator<Item = &Range> {
        // Those starting inside the pool, plus those starting before it that reach into it
        // (the running maximum of last addresses is sorted too).
        let start_in = self.sorted.partition_point(|(r, _)| r.first < pool.first);
        let end = self.sorted.partition_point(|(r, _)| r.first <= pool.last);
        let back = self.max_last[..start_in].partition_point(|m| *m < pool.first);
        self.sorted[back..end]
            .iter()
            .map(|(r, _)| r)
            .filter(move |r| r.overlaps(&pool))
    }

    /// Claims that overlap an earlier one.
    pub(super) fn conflicts(
        &self,
        family: Family,
        owner: impl Fn(Holder) -> ClaimOwner,
    ) -> Vec<ClaimConflict> {
        let mut out = Vec::new();
        let mut widest: Option<usize> = None;
        for (k, (range, holder)) in self.sorted.iter().enumerate() {
            if let Some(w) = widest {
                let (wr, wh) = &self.sorted[w];
                if wr.overlaps(range) {
                    out.push(ClaimConflict {
                        family,
                        first: owner(*wh),
                        first_cidr: net_of(wr, family),
                        second: owner(*holder),
                        second_cidr: net_of(range, family),
                    });
                }
                if range.last > wr.last {
                    widest = Some(k);
                }
            } else {
                widest = Some(k);
            }
        }
        out
    }
}

fn net_of(r: &Range, family: Family) -> IpNet {
    let (width, first) = match family {
        Family::V6 => (128u32, IpAddr::V6(Ipv6Addr::from(r.first))),
        Family::V4 => (
            32,
            IpAddr::V4(Ipv4Addr::from(u32::try_from(r.first).unwrap_or(0))),
        ),
    };
    let host = (r.last - r.first)
        .checked_add(1)
        .map_or(128, |n| n.trailing_zeros());
    let len = u8::try_from(width - host.min(width)).unwrap_or(0);
    IpNet::new(first, len).expect("a prefix length within the family")
}
