//! A two-level bitmap: one bit per address, plus one summary bit per word
//! that is set when the word is full, so the next free address is found in
//! O(words / 64) summary steps at worst instead of a scan from the start.

/// A fixed-size set of indices `0..len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bitmap {
    len: u32,
    words: Vec<u64>,
    /// Bit `i` set ⇔ `words[i]` is all ones.
    full: Vec<u64>,
    count: u32,
}

impl Bitmap {
    pub(crate) fn new(len: u32) -> Self {
        let words = len.div_ceil(64) as usize;
        Self {
            len,
            words: vec![0; words],
            full: vec![0; words.div_ceil(64)],
            count: 0,
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    pub(crate) fn get(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Sets bit `i`; returns whether it was clear.
    pub(crate) fn insert(&mut self, i: u32) -> bool {
        if i >= self.len || self.get(i) {
            return false;
        }
        let w = (i / 64) as usize;
        self.words[w] |= 1 << (i % 64);
        if self.words[w] == u64::MAX {
            self.full[w / 64] |= 1 << (w % 64);
        }
        self.count += 1;
        true
    }

    /// Clears bit `i`; returns whether it was set.
    pub(crate) fn remove(&mut self, i: u32) -> bool {
        if !self.get(i) {
            return false;
        }
        let w = (i / 64) as usize;
        self.words[w] &= !(1 << (i % 64));
        self.full[w / 64] &= !(1 << (w % 64));
        self.count -= 1;
        true
    }

    /// The first clear index in `lo..hi`.
    pub(crate) fn first_free(&self, lo: u32, hi: u32) -> Option<u32> {
        let hi = hi.min(self.len);
        if lo >= hi {
            return None;
        }
        let mut w = (lo / 64) as usize;
        // the first word, ignoring bits below `lo`
        let mut free = !self.words[w] & (u64::MAX << (lo % 64));
        loop {
            if free != 0 {
                let i = (w as u32) * 64 + free.trailing_zeros();
                return (i < hi).then_some(i);
            }
            w = self.next_non_full_word(w + 1)?;
            if (w as u32) * 64 >= hi {
                return None;
            }
            free = !self.words[w];
        }
    }

    /// The index of the first word at or after `from` that is not full.
    fn next_non_full_word(&self, from: usize) -> Option<usize> {
        if from >= self.words.len() {
            return None;
        }
        let mut s = from / 64;
        let mut not_full = !self.full[s] & (u64::MAX << (from % 64));
        loop {
            if not_full != 0 {
                let w = s * 64 + not_full.trailing_zeros() as usize;
                return (w < self.words.len()).then_some(w);
            }
            s += 1;
            if s >= self.full.len() {
                return None;
            }
            not_full = !self.full[s];
        }
    }

    /// Every set index, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut word = word;
            std::iter::from_fn(move || {
                if word == 0 {
                    return None;
                }
                let bit = word.trailing_zeros();
                word &= word - 1;
                Some(w as u32 * 64 + bit)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Bitmap;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn first_free_agrees_with_a_scan(
            len in 1u32..5000,
            set in prop::collection::vec(any::<prop::sample::Index>(), 0..6000),
            lo in any::<prop::sample::Index>(),
            hi in any::<prop::sample::Index>(),
        ) {
            let mut b = Bitmap::new(len);
            let mut model = vec![false; len as usize];
            for i in &set {
                let i = i.index(len as usize);
                b.insert(i as u32);
                model[i] = true;
            }
            let (lo, hi) = (lo.index(len as usize + 1) as u32, hi.index(len as usize + 1) as u32);
            let want = (lo..hi).find(|&i| !model[i as usize]);
            prop_assert_eq!(b.first_free(lo, hi), want);
            prop_assert_eq!(b.count() as usize, model.iter().filter(|x| **x).count());
            let listed: Vec<u32> = b.iter().collect();
            let model_listed: Vec<u32> = (0..len).filter(|&i| model[i as usize]).collect();
            prop_assert_eq!(listed, model_listed);
        }
    }

    #[test]
    fn full_summary_follows_removals() {
        let mut b = Bitmap::new(64 * 70);
        for i in 0..64 * 70 {
            assert!(b.insert(i));
        }
        assert_eq!(b.first_free(0, 64 * 70), None);
        assert!(b.remove(64 * 69 + 5));
        assert_eq!(b.first_free(0, 64 * 70), Some(64 * 69 + 5));
        assert_eq!(b.first_free(0, 64 * 69), None);
        assert!(!b.remove(64 * 69 + 5));
        assert!(!b.insert(64 * 70));
    }
}
