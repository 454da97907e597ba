//! A pool's CIDR as a row of equal per-node slots, and the slots a set of claimed CIDRs
//! covers: sorted, merged intervals of slot indexes, so that counting and finding the lowest
//! free slot cost O(claims · log claims) whatever the pool's size (a /8 cut into /120s has
//! 2^112 slots).

/// One family's pool: `base/len` cut into `/slot` prefixes, addresses as `u128` of `width`
/// bits (128 for IPv6, 32 for IPv4).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotSpace {
    pub base: u128,
    pub len: u8,
    pub slot: u8,
    pub width: u8,
}

/// A claimed address range, inclusive at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Range {
    pub first: u128,
    pub last: u128,
}

fn shr(x: u128, n: u8) -> u128 {
    x.checked_shr(u32::from(n)).unwrap_or(0)
}

fn shl(x: u128, n: u8) -> u128 {
    x.checked_shl(u32::from(n)).unwrap_or(0)
}

/// The mask of the low `bits` bits.
fn low_mask(bits: u8) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

impl Range {
    /// The addresses of `first/len` in a `width`-bit family.
    pub fn of_prefix(first: u128, len: u8, width: u8) -> Range {
        Range {
            first,
            last: first | low_mask(width - len),
        }
    }

    /// Whether two ranges share an address.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

impl SlotSpace {
    /// Every address of the pool.
    pub fn range(&self) -> Range {
        Range::of_prefix(self.base, self.len, self.width)
    }

    /// How many slots the pool has (at most 2^120: a slot is never longer than a /120 for
    /// IPv6, a /30 for IPv4).
    pub fn capacity(&self) -> u128 {
        shl(1, self.slot - self.len)
    }

    /// The first address of slot `index`.
    pub fn slot_address(&self, index: u128) -> u128 {
        self.base + shl(index, self.width - self.slot)
    }

    /// The slots `claim` touches, as a half-open interval of indexes; `None` when it misses
    /// the pool.
    pub fn slots_of(&self, claim: &Range) -> Option<(u128, u128)> {
        let pool = self.range();
        if !pool.overlaps(claim) {
            return None;
        }
        let lo = claim.first.max(pool.first) - self.base;
        let hi = claim.last.min(pool.last) - self.base;
        let host = self.width - self.slot;
        Some((shr(lo, host), shr(hi, host) + 1))
    }

    /// The slots the claims cover, sorted and merged (no two intervals touch).
    pub fn occupied<'c>(&self, claims: impl Iterator<Item = &'c Range>) -> Vec<(u128, u128)> {
        let mut slots: Vec<(u128, u128)> = claims.filter_map(|c| self.slots_of(c)).collect();
        slots.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(slots.len());
        for (start, end) in slots {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }
}

/// Walks the free slots of a pool from the lowest up.
pub(crate) struct FreeSlots<'a> {
    occupied: &'a [(u128, u128)],
    next: usize,
    cursor: u128,
    capacity: u128,
}

impl<'a> FreeSlots<'a> {
    pub fn new(occupied: &'a [(u128, u128)], capacity: u128) -> FreeSlots<'a> {
        FreeSlots {
            occupied,
            next: 0,
            cursor: 0,
            capacity,
        }
    }

    /// The lowest free slot not handed out yet.
    pub fn take(&mut self) -> Option<u128> {
        while let Some(&(start, end)) = self.occupied.get(self.next) {
            if self.cursor < start {
                break;
            }
            self.cursor = self.cursor.max(end);
            self.next += 1;
        }
        if self.cursor < self.capacity {
            self.cursor += 1;
            Some(self.cursor - 1)
        } else {
            None
        }
    }
}

/// The number of slots in merged intervals.
pub(crate) fn count(occupied: &[(u128, u128)]) -> u128 {
    occupied.iter().map(|(s, e)| e - s).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_32_into_64s_and_a_slash_0_into_120s() {
        let base = u128::from(0x2001_0db8u32) << 96;
        let space = SlotSpace {
            base,
            len: 32,
            slot: 64,
            width: 128,
        };
        assert_eq!(space.capacity(), 1 << 32);
        assert_eq!(space.slot_address(1), base + (1u128 << 64));
        let claim = Range::of_prefix(base + (256u128 << 64), 56, 128);
        // a /56 covers 256 /64s
        assert_eq!(space.slots_of(&claim), Some((256, 512)));
        let whole = SlotSpace {
            base: 0,
            len: 0,
            slot: 120,
            width: 128,
        };
        assert_eq!(whole.capacity(), 1 << 120);
        assert_eq!(whole.range().last, u128::MAX);
        let supernet = Range::of_prefix(0, 0, 128);
        assert_eq!(whole.slots_of(&supernet), Some((0, 1 << 120)));
        let one = SlotSpace {
            base: 0,
            len: 0,
            slot: 0,
            width: 128,
        };
        assert_eq!(one.capacity(), 1);
        assert_eq!(one.slots_of(&Range { first: 7, last: 9 }), Some((0, 1)));
    }

    #[test]
    fn free_slots_skip_merged_claims() {
        let occupied = [(0, 2), (3, 4), (6, 8)];
        let mut free = FreeSlots::new(&occupied, 10);
        let got: Vec<u128> = std::iter::from_fn(|| free.take()).collect();
        assert_eq!(got, [2, 4, 5, 8, 9]);
        assert_eq!(count(&occupied), 5);
    }
}
