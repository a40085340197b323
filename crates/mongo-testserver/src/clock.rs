//! The cluster time: a BSON Timestamp that increases with every write.

use bson::Timestamp;

/// Hands out strictly increasing cluster times.
pub struct ClusterClock {
    last: Timestamp,
}

impl Default for ClusterClock {
    fn default() -> Self {
        ClusterClock {
            last: Timestamp {
                time: unix_secs(),
                increment: 1,
            },
        }
    }
}

fn unix_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

impl ClusterClock {
    /// The latest cluster time handed out.
    pub fn now(&self) -> Timestamp {
        self.last
    }

    /// A new cluster time, greater than every previous one (for one write).
    pub fn tick(&mut self) -> Timestamp {
        let secs = unix_secs();
        self.last = if secs > self.last.time {
            Timestamp {
                time: secs,
                increment: 1,
            }
        } else if self.last.increment == u32::MAX {
            Timestamp {
                time: self.last.time + 1,
                increment: 1,
            }
        } else {
            Timestamp {
                time: self.last.time,
                increment: self.last.increment + 1,
            }
        };
        self.last
    }
}

/// Orders two timestamps.
pub fn ts_cmp(a: Timestamp, b: Timestamp) -> std::cmp::Ordering {
    (a.time, a.increment).cmp(&(b.time, b.increment))
}
