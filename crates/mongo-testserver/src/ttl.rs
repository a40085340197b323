//! The TTL monitor: every `ttlMonitorSleepSecs` it deletes documents whose TTL index date has
//! passed (each deletion logs a change-stream delete event, as mongod's TTL deletes do).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bson::{Bson, DateTime};

use crate::engine::expr::Vars;
use crate::server::Shared;
use crate::store::{path_values, RecordId};

/// Runs the monitor until the task is aborted.
pub async fn run(shared: Arc<Shared>) {
    loop {
        let period = Duration::from_millis(shared.ttl_interval_ms.load(Ordering::SeqCst));
        tokio::select! {
            _ = tokio::time::sleep(period) => pass(&shared),
            // A new period takes effect at once.
            _ = shared.ttl_changed.notified() => {}
        }
    }
}

/// Whether a document with `values` at the TTL field has expired at `now`.
fn expired(values: &[Bson], expire_after_secs: i64, now_ms: i64) -> bool {
    // Arrays use their earliest date; non-dates never expire.
    let earliest = values
        .iter()
        .filter_map(|v| match v {
            Bson::DateTime(d) => Some(d.timestamp_millis()),
            _ => None,
        })
        .min();
    match earliest {
        Some(ms) => ms.saturating_add(expire_after_secs.saturating_mul(1000)) <= now_ms,
        None => false,
    }
}

/// One pass over every TTL index.
pub fn pass(shared: &Shared) {
    let now = DateTime::now();
    let vars = Vars::new(now);
    let mut st = shared.lock();
    let mut victims: Vec<(String, String, Vec<RecordId>)> = Vec::new();
    for (db_name, db) in &st.store.dbs {
        for (coll_name, coll) in &db.colls {
            if !coll.has_ttl() {
                continue;
            }
            let mut rids = Vec::new();
            for index in coll.indexes.iter() {
                let Some(secs) = index.expire_after_seconds else {
                    continue;
                };
                let Some((field, _)) = index.key.iter().next() else {
                    continue;
                };
                for (rid, doc) in coll.iter() {
                    if let Some((_, filter)) = &index.partial {
                        if !filter.matches(doc, &vars).unwrap_or(false) {
                            continue;
                        }
                    }
                    if expired(&path_values(doc, field), secs, now.timestamp_millis()) {
                        rids.push(rid);
                    }
                }
            }
            if !rids.is_empty() {
                rids.sort_unstable();
                rids.dedup();
                victims.push((db_name.clone(), coll_name.clone(), rids));
            }
        }
    }
    for (db, coll, rids) in victims {
        for rid in rids {
            st.delete_doc(&db, &coll, rid, &vars);
        }
    }
}

/// Closes idle cursors and forgets idle sessions, every 30 seconds.
pub async fn janitor(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let now = tokio::time::Instant::now();
        let mut st = shared.lock();
        st.cursors.reap(now);
        st.sessions.reap(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_rules() {
        let d = |ms| Bson::DateTime(DateTime::from_millis(ms));
        assert!(expired(&[d(1000)], 1, 2000));
        assert!(!expired(&[d(1500)], 1, 2000));
        assert!(expired(&[d(5000), d(1000)], 0, 2000));
        assert!(!expired(&[Bson::String("x".into())], 0, i64::MAX));
        assert!(!expired(&[], 0, i64::MAX));
    }
}
