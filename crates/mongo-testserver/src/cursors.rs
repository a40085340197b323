//! Open cursors: query results still to be returned, and change streams.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bson::Document;
use tokio::time::Instant;

use crate::changestream::StreamCursor;

/// A cursor idle for this long is closed, as mongod's `cursorTimeoutMillis` default.
pub const CURSOR_TIMEOUT: Duration = Duration::from_secs(600);

/// What a cursor yields.
pub enum CursorKind {
    /// The remaining documents of a query, computed when the cursor opened.
    Query(VecDeque<Document>),
    /// A change stream.
    Stream(Box<StreamCursor>),
}

/// One open cursor.
pub struct Cursor {
    /// Database of the namespace.
    pub db: String,
    /// Collection of the namespace (as getMore must name it).
    pub coll: String,
    /// The namespace string reported in replies.
    pub ns: String,
    /// Contents.
    pub kind: CursorKind,
    /// Last time the cursor was used.
    pub last_used: Instant,
    /// Exempt from the idle timeout.
    pub no_timeout: bool,
}

/// All open cursors, by id.
#[derive(Default)]
pub struct Cursors {
    map: HashMap<i64, Cursor>,
}

impl Cursors {
    /// Registers a cursor and returns its new id (positive, never 0).
    pub fn open(&mut self, cursor: Cursor) -> i64 {
        loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 && !self.map.contains_key(&id) {
                self.map.insert(id, cursor);
                return id;
            }
        }
    }

    /// Whether the cursor is a change stream whose stages nest so deeply that its `getMore`s
    /// run on a thread with a large stack (see [`StreamCursor::deep`]).
    pub fn is_deep_stream(&self, id: i64) -> bool {
        matches!(
            self.map.get(&id),
            Some(Cursor {
                kind: CursorKind::Stream(sc),
                ..
            }) if sc.deep
        )
    }

    /// A cursor by id.
    pub fn get_mut(&mut self, id: i64) -> Option<&mut Cursor> {
        self.map.get_mut(&id)
    }

    /// How many cursors are open, and how many of them are change streams.
    pub fn open_counts(&self) -> (usize, usize) {
        let streams = self
            .map
            .values()
            .filter(|c| matches!(c.kind, CursorKind::Stream(_)))
            .count();
        (self.map.len(), streams)
    }

    /// Whether the cursor is a change stream.
    pub fn is_stream(&self, id: i64) -> bool {
        matches!(
            self.map.get(&id),
            Some(Cursor {
                kind: CursorKind::Stream(_),
                ..
            })
        )
    }

    /// Closes a cursor.
    pub fn remove(&mut self, id: i64) -> Option<Cursor> {
        self.map.remove(&id)
    }

    /// Closes cursors idle longer than [`CURSOR_TIMEOUT`].
    pub fn reap(&mut self, now: Instant) {
        self.map
            .retain(|_, c| c.no_timeout || now.duration_since(c.last_used) < CURSOR_TIMEOUT);
    }

    /// Closes the cursors of a namespace (collection dropped).
    pub fn kill_namespace(&mut self, db: &str, coll: Option<&str>) {
        self.map.retain(|_, c| {
            if matches!(c.kind, CursorKind::Stream(_)) {
                return true;
            }
            !(c.db == db && coll.is_none_or(|name| c.coll == name))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(last_used: Instant, no_timeout: bool) -> Cursor {
        Cursor {
            db: "db".into(),
            coll: "c".into(),
            ns: "db.c".into(),
            kind: CursorKind::Query(VecDeque::new()),
            last_used,
            no_timeout,
        }
    }

    #[test]
    fn idle_cursors_expire_after_ten_minutes() {
        let now = Instant::now() + Duration::from_secs(3600);
        let mut cursors = Cursors::default();
        let fresh = cursors.open(cursor(now - Duration::from_secs(599), false));
        let idle = cursors.open(cursor(now - Duration::from_secs(601), false));
        let pinned = cursors.open(cursor(now - Duration::from_secs(601), true));
        cursors.reap(now);
        assert!(cursors.get_mut(fresh).is_some());
        assert!(cursors.get_mut(idle).is_none());
        assert!(cursors.get_mut(pinned).is_some());
    }
}
