//! A set of byte ranges, pure: what a journal vouches for and what a receiver has verified.

use std::collections::BTreeMap;

/// A set of byte ranges `[start, end)`, kept sorted and coalesced (ranges that overlap or
/// touch are merged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start → end.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Adds `[start, end)` (empty ranges are ignored), merging with its neighbours.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        // A range starting at or before `end` may overlap or touch; walk back from there.
        let touching: Vec<(u64, u64)> = self
            .map
            .range(..=end)
            .rev()
            .take_while(|(_, &re)| re >= start)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in touching {
            self.map.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.map.insert(s, e);
    }

    /// Whether every byte of `[start, end)` is in the set.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        start >= end
            || self
                .map
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }

    /// The end of the range that starts at 0 (0 if none does).
    pub fn prefix(&self) -> u64 {
        self.map.get(&0).copied().unwrap_or(0)
    }

    /// The end of the last range (0 if empty).
    pub fn end(&self) -> u64 {
        self.map.last_key_value().map_or(0, |(_, &e)| e)
    }

    /// Bytes in the set.
    pub fn total(&self) -> u64 {
        self.map.iter().map(|(s, e)| e - s).sum()
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }

    /// The ranges of `[0, size)` not in the set, in order.
    pub fn missing(&self, size: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = 0;
        for (s, e) in self.iter() {
            if s >= size {
                break;
            }
            if s > pos {
                out.push((pos, s));
            }
            pos = pos.max(e);
        }
        if pos < size {
            out.push((pos, size));
        }
        out
    }

    /// The set limited to its first `n` ranges (what a journal slot can vouch for).
    pub fn first(&self, n: usize) -> RangeSet {
        RangeSet {
            map: self.map.iter().take(n).map(|(&s, &e)| (s, e)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Random insertions against a byte map: same bytes covered, ranges disjoint and
        /// not touching, `missing` the exact complement (the journal's round trip is
        /// `codec`'s test).
        #[test]
        fn range_set_matches_a_naive_model(
            ins in proptest::collection::vec((0u64..200, 0u64..40), 0..40)
        ) {
            let mut s = RangeSet::new();
            let mut model = [false; 240];
            for &(a, l) in &ins {
                s.insert(a, a + l);
                for b in &mut model[a as usize..(a + l) as usize] {
                    *b = true;
                }
            }
            let mut covered = [false; 240];
            let mut prev: Option<u64> = None;
            for (a, b) in s.iter() {
                proptest::prop_assert!(a < b);
                proptest::prop_assert!(prev.is_none_or(|p| p < a), "touching or overlapping");
                prev = Some(b);
                for c in &mut covered[a as usize..b as usize] {
                    *c = true;
                }
            }
            proptest::prop_assert_eq!(covered, model);
            for (a, b) in s.missing(240) {
                proptest::prop_assert!(model[a as usize..b as usize].iter().all(|c| !c));
            }
            let holes: u64 = s.missing(240).iter().map(|(a, b)| b - a).sum();
            proptest::prop_assert_eq!(holes + s.total(), 240);
        }
    }
}
