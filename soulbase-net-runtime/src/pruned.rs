//! [`PrunedMap`]: entries by name whose removable ones go in bulk, at a mark that grows with
//! what has to stay.
//!
//! Why: a map by host or origin is bounded by pruning what may go (an origin without
//! connections, a host whose SLO controller is back at the policy's values, a host or tenant
//! of the limiter without calls) once it is full. When
//! nothing may go, a check at a fixed size scans the whole map again for every new key — the
//! pool's origins did, two thirds of the client's CPU with 10 000 hosts. Here the next scan
//! waits until the map has grown by as much again as the last one left: amortised O(1) per
//! new key.

use foldhash::HashMap;

/// Entries by name, pruned in bulk once the map reaches its mark; the next mark is twice what
/// the pruning left, and never below `floor`.
#[derive(Debug)]
pub(crate) struct PrunedMap<V> {
    /// The entries; look up, insert and remove through it.
    pub(crate) map: HashMap<Box<str>, V>,
    floor: usize,
    prune_at: usize,
}

impl<V> PrunedMap<V> {
    /// An empty map pruned first when it holds `floor` entries.
    pub(crate) fn new(floor: usize) -> Self {
        Self {
            map: HashMap::default(),
            floor,
            prune_at: floor,
        }
    }

    /// Drops the entries `keep` refuses once the map has reached its mark, and sets the next
    /// mark. Called before inserting a key the map lacks.
    pub(crate) fn make_room(&mut self, mut keep: impl FnMut(&V) -> bool) {
        if self.map.len() < self.prune_at {
            return;
        }
        self.map.retain(|_, value| keep(value));
        self.prune_at = self.map.len().saturating_mul(2).max(self.floor);
    }

    /// The size at which the next pruning happens.
    #[cfg(test)]
    pub(crate) fn prune_at(&self) -> usize {
        self.prune_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: usize = 64;

    /// `n` entries from `from` on, each `true` when it has to stay.
    fn add(m: &mut PrunedMap<bool>, from: usize, n: usize, stays: bool) {
        for i in from..from + n {
            m.map.insert(format!("h{i}").into(), stays);
        }
    }

    #[test]
    fn entries_are_pruned_at_a_mark_that_grows_with_those_that_stay() {
        let mut m = PrunedMap::new(FLOOR);
        let keep = |stays: &bool| *stays;
        // Half may go: pruned at the mark, which stays at the floor.
        add(&mut m, 0, FLOOR / 2, true);
        add(&mut m, FLOOR, FLOOR / 2, false);
        m.make_room(keep);
        assert_eq!((m.map.len(), m.prune_at()), (FLOOR / 2, FLOOR));
        // All stay: nothing to prune, and the next scan waits until the map doubles.
        add(&mut m, 2 * FLOOR, FLOOR / 2, true);
        m.make_room(keep);
        assert_eq!((m.map.len(), m.prune_at()), (FLOOR, 2 * FLOOR));
        add(&mut m, 4 * FLOOR, FLOOR - 1, false);
        m.make_room(keep);
        assert_eq!(m.map.len(), 2 * FLOOR - 1, "below the mark: no scan");
        add(&mut m, 6 * FLOOR, 1, false);
        m.make_room(keep);
        assert_eq!((m.map.len(), m.prune_at()), (FLOOR, 2 * FLOOR));
    }

    #[test]
    fn a_map_whose_entries_all_stay_costs_amortised_constant_visits_per_new_key() {
        let mut m = PrunedMap::new(FLOOR);
        let mut scans = 0;
        for i in 0..100 * FLOOR {
            m.make_room(|_| {
                scans += 1;
                true
            });
            m.map.insert(format!("h{i}").into(), true);
        }
        // Each scan visits the whole map, and the map doubles between two scans: the visits
        // add up to less than twice the entries inserted (one visit per entry with a fixed
        // mark would be 100 * FLOOR per new key once full).
        assert!(scans < 2 * 100 * FLOOR, "{scans} visits");
        assert_eq!(m.map.len(), 100 * FLOOR);
    }
}
