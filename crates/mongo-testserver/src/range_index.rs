//! Index-backed reads: the ordered entries of a secondary index's first field, so that a query
//! reads the documents its indexable conditions point at instead of the whole collection (as
//! mongod's planner does), and the counters `serverStatus` reports as
//! `metrics.queryExecutor.scanned` (index keys) and `scannedObjects` (documents).
//!
//! The planner never decides what matches: [`Filter::index_scans`] yields probes whose union
//! holds *at least* every document the filter can match, and every candidate is then tested
//! with the whole filter. So an index can only make a query cheaper, never change its answer.
//! To keep that superset property simple, an index here serves only a plain ascending or
//! descending first field that is not `_id`, on indexes that are neither partial nor sparse, on
//! paths without numeric components; a document whose path crosses an array before its last
//! component is kept aside and returned by every probe.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use bson::{Bson, Document};

use crate::engine::compare::{type_rank, OrdBson};
use crate::engine::matcher::{Filter, Probe, Scan};
use crate::store::RecordId;

/// `metrics.queryExecutor` counters, shared by every collection of a server.
#[derive(Debug, Default)]
pub struct ScanCounters {
    /// Index keys examined.
    pub keys: AtomicU64,
    /// Documents examined (fetched and tested against a filter).
    pub objects: AtomicU64,
}

impl ScanCounters {
    /// Counts `n` documents examined.
    pub fn examined(&self, n: u64) {
        self.objects.fetch_add(n, Ordering::Relaxed);
    }
}

/// The ordered entries of one index field.
#[derive(Debug, Default)]
pub struct RangeIndex {
    path: String,
    entries: BTreeMap<OrdBson, BTreeSet<RecordId>>,
    /// Documents whose path crosses an array: candidates of every probe.
    always: BTreeSet<RecordId>,
}

/// How a document appears in a [`RangeIndex`].
enum Keys {
    Values(Vec<Bson>),
    Always,
}

impl RangeIndex {
    /// The range index for an index with key pattern `key`, if this server can use one for it.
    pub fn for_key(key: &Document, partial: bool, sparse: bool) -> Option<RangeIndex> {
        let (path, direction) = key.iter().next()?;
        let plain = matches!(direction, Bson::Int32(1 | -1))
            || matches!(direction, Bson::Int64(1 | -1))
            || matches!(direction, Bson::Double(d) if *d == 1.0 || *d == -1.0);
        let numeric_part = path
            .split('.')
            .any(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        (plain && !partial && !sparse && path != "_id" && !numeric_part).then(|| RangeIndex {
            path: path.clone(),
            ..RangeIndex::default()
        })
    }

    /// The indexed path.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn keys(&self, doc: &Document) -> Keys {
        let mut current = doc;
        let mut parts = self.path.split('.').peekable();
        while let Some(part) = parts.next() {
            let last = parts.peek().is_none();
            match current.get(part) {
                None => return Keys::Values(vec![Bson::Null]),
                Some(v) if last => {
                    return Keys::Values(match v {
                        Bson::Array(a) if a.is_empty() => vec![Bson::Undefined],
                        Bson::Array(a) => a.clone(),
                        other => vec![other.clone()],
                    })
                }
                Some(Bson::Document(d)) => current = d,
                Some(Bson::Array(_)) => return Keys::Always,
                // A scalar before the last component: the path is missing.
                Some(_) => return Keys::Values(vec![Bson::Null]),
            }
        }
        Keys::Values(vec![Bson::Null])
    }

    /// Adds the entries of document `rid`.
    pub fn insert(&mut self, rid: RecordId, doc: &Document) {
        match self.keys(doc) {
            Keys::Always => {
                self.always.insert(rid);
            }
            Keys::Values(values) => {
                for v in values {
                    self.entries.entry(OrdBson(v)).or_default().insert(rid);
                }
            }
        }
    }

    /// Removes the entries of document `rid` (as stored: `doc`).
    pub fn remove(&mut self, rid: RecordId, doc: &Document) {
        match self.keys(doc) {
            Keys::Always => {
                self.always.remove(&rid);
            }
            Keys::Values(values) => {
                for v in values {
                    let key = OrdBson(v);
                    if let Some(set) = self.entries.get_mut(&key) {
                        set.remove(&rid);
                        if set.is_empty() {
                            self.entries.remove(&key);
                        }
                    }
                }
            }
        }
    }

    /// Adds to `out` the records whose keys `probe` covers; returns the number of keys read.
    fn probe(&self, probe: &Probe, out: &mut BTreeSet<RecordId>) -> u64 {
        out.extend(self.always.iter().copied());
        let mut keys = 0;
        let mut take = |set: &BTreeSet<RecordId>| {
            keys += set.len() as u64;
            out.extend(set.iter().copied());
        };
        match probe {
            Probe::Point(v) => {
                // Equality with null also matches undefined (and a missing field, indexed as
                // null).
                let mut points = vec![v.clone()];
                if matches!(v, Bson::Null) {
                    points.push(Bson::Undefined);
                }
                for p in points {
                    if let Some(set) = self.entries.get(&OrdBson(p)) {
                        take(set);
                    }
                }
            }
            Probe::Below(v, inclusive) => {
                let upper = OrdBson(v.clone());
                let hi = if *inclusive {
                    Bound::Included(&upper)
                } else {
                    Bound::Excluded(&upper)
                };
                let rank = type_rank(v);
                for (_, set) in self
                    .entries
                    .range((Bound::Unbounded, hi))
                    .rev()
                    .take_while(|(k, _)| type_rank(&k.0) == rank)
                {
                    take(set);
                }
            }
            Probe::Above(v, inclusive) => {
                let lower = OrdBson(v.clone());
                let lo = if *inclusive {
                    Bound::Included(&lower)
                } else {
                    Bound::Excluded(&lower)
                };
                let rank = type_rank(v);
                for (_, set) in self
                    .entries
                    .range((lo, Bound::Unbounded))
                    .take_while(|(k, _)| type_rank(&k.0) == rank)
                {
                    take(set);
                }
            }
        }
        keys
    }
}

/// The candidates of `filter` through the given range indexes (`None`: no index serves it, so
/// every document is a candidate), in natural (record) order, counting the keys read.
pub fn candidates<'a>(
    filter: &Filter,
    indexes: impl Iterator<Item = &'a RangeIndex> + Clone,
    counters: &ScanCounters,
) -> Option<Vec<RecordId>> {
    let find = |path: &str| indexes.clone().find(|i| i.path() == path);
    let plans = filter.index_scans(&|path| find(path).is_some());
    let mut best: Option<BTreeSet<RecordId>> = None;
    for plan in plans {
        let mut set = BTreeSet::new();
        for Scan { path, probes } in &plan {
            let Some(index) = find(path) else {
                continue;
            };
            for probe in probes {
                let keys = index.probe(probe, &mut set);
                counters.keys.fetch_add(keys, Ordering::Relaxed);
            }
        }
        if best.as_ref().is_none_or(|b| set.len() < b.len()) {
            best = Some(set);
        }
    }
    best.map(|s| s.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;
    use crate::engine::expr::Vars;

    fn index(path: &str, docs: &[Document]) -> RangeIndex {
        let mut i = RangeIndex::for_key(&doc! { path: 1 }, false, false).unwrap();
        for (rid, d) in docs.iter().enumerate() {
            i.insert(rid as RecordId, d);
        }
        i
    }

    /// The candidates always include every match (checked against a full scan).
    fn check(docs: &[Document], path: &str, filter: Document) -> Option<Vec<RecordId>> {
        let i = index(path, docs);
        let f = Filter::parse(&filter).unwrap();
        let counters = ScanCounters::default();
        let got = candidates(&f, [&i].into_iter(), &counters);
        let vars = Vars::new(bson::DateTime::now());
        let matching: Vec<RecordId> = docs
            .iter()
            .enumerate()
            .filter(|(_, d)| f.matches(d, &vars).unwrap())
            .map(|(r, _)| r as RecordId)
            .collect();
        if let Some(c) = &got {
            for m in &matching {
                assert!(c.contains(m), "{filter:?}: match {m} not among {c:?}");
            }
        }
        got
    }

    #[test]
    fn candidates_are_a_superset_of_the_matches() {
        let now = bson::DateTime::from_millis(1_000_000);
        let later = bson::DateTime::from_millis(2_000_000);
        let docs = vec![
            doc! {"l": {"id": "a", "exp": now}},
            doc! {"l": {"id": null, "exp": later}},
            doc! {"x": 1},
            doc! {"l": {"id": ["a", "b"], "exp": later}},
            doc! {"l": [{"id": "a"}, {"z": 1}]},
            doc! {"l": {"id": [], "exp": 5}},
            doc! {"l": {"id": 1.0, "exp": "s"}},
            doc! {"l": 3},
        ];
        for filter in [
            doc! {"l.id": null},
            doc! {"l.id": "a"},
            doc! {"l.id": {"$in": ["b", null]}},
            doc! {"l.id": 1},
            doc! {"l.id": {"$lte": null}},
            doc! {"$or": [{"l.id": null}, {"l.id": "a"}]},
            doc! {"$and": [{"x": 1}, {"l.id": null}]},
        ] {
            assert!(check(&docs, "l.id", filter.clone()).is_some(), "{filter:?}");
        }
        for filter in [
            doc! {"l.exp": {"$lte": now}},
            doc! {"l.exp": {"$lt": later}},
            doc! {"l.exp": {"$gt": now}},
            doc! {"l.exp": {"$gte": 5}},
            doc! {"$or": [{"l.exp": {"$lte": now}, "$expr": true}, {"l.exp": null}]},
        ] {
            assert!(
                check(&docs, "l.exp", filter.clone()).is_some(),
                "{filter:?}"
            );
        }
        // A range reads only its own type, and a point only its key.
        assert_eq!(
            check(&docs, "l.exp", doc! {"l.exp": {"$lte": now}}),
            Some(vec![0, 4])
        );
        assert_eq!(check(&docs, "l.id", doc! {"l.id": "b"}), Some(vec![3, 4]));
        // Not served: an unindexed path, an $or with an unindexed branch, array values.
        assert_eq!(check(&docs, "l.id", doc! {"x": 1}), None);
        assert_eq!(
            check(&docs, "l.id", doc! {"$or": [{"l.id": "a"}, {"x": 1}]}),
            None
        );
        assert_eq!(check(&docs, "l.id", doc! {"l.id": ["a", "b"]}), None);
    }

    #[test]
    fn removal_forgets_a_document() {
        let d = doc! {"a": 1};
        let mut i = index("a", std::slice::from_ref(&d));
        i.remove(0, &d);
        let mut out = BTreeSet::new();
        assert_eq!(i.probe(&Probe::Point(Bson::Int32(1)), &mut out), 0);
        assert!(out.is_empty());
    }

    #[test]
    fn only_plain_first_fields_of_full_indexes_are_served() {
        assert!(RangeIndex::for_key(&doc! {"a": 1, "b": -1}, false, false).is_some());
        assert!(RangeIndex::for_key(&doc! {"a": "hashed"}, false, false).is_none());
        assert!(RangeIndex::for_key(&doc! {"a": 1}, true, false).is_none());
        assert!(RangeIndex::for_key(&doc! {"a": 1}, false, true).is_none());
        assert!(RangeIndex::for_key(&doc! {"_id": 1}, false, false).is_none());
        assert!(RangeIndex::for_key(&doc! {"a.0.b": 1}, false, false).is_none());
    }
}
