//! A watchdog for shards that stop making progress: when a shard has claimed
//! jobs outstanding but no outcome was written there for a while, it records
//! what that shard's backends are doing (state, wait event, statement, and
//! the statement of the backend blocking them), so a stall can be explained
//! afterwards.

use super::cluster::Cluster;
use serde::Serialize;
use std::time::{Duration, Instant};

/// No progress for this long counts as a stall.
const STALL_AFTER: Duration = Duration::from_secs(2);

/// Reports kept per run.
const MAX_REPORTS: usize = 4;

/// Non-idle client backends grouped by what they do and who blocks them.
const ACTIVITY_SQL: &str = "SELECT a.state, coalesce(a.wait_event_type, ''), \
        coalesce(a.wait_event, ''), left(regexp_replace(a.query, '\\s+', ' ', 'g'), 60), \
        coalesce(left(regexp_replace(b.query, '\\s+', ' ', 'g'), 60), ''), \
        count(*), coalesce(max(extract(epoch FROM now() - a.xact_start)), 0)::float8 \
    FROM pg_stat_activity a \
    LEFT JOIN LATERAL (SELECT query FROM pg_stat_activity \
        WHERE pid = (pg_blocking_pids(a.pid))[1]) b ON true \
    WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid() \
        AND a.state <> 'idle' \
    GROUP BY 1, 2, 3, 4, 5 ORDER BY 6 DESC LIMIT 8";

/// Backends of one shard doing the same thing.
#[derive(Debug, Clone, Serialize)]
pub struct Activity {
    /// Shard index.
    pub shard: usize,
    /// `active`, `idle in transaction`, ...
    pub state: String,
    /// e.g. `Lock`, `LWLock`, `IO` (empty: running on a CPU or waiting for one).
    pub wait_event_type: String,
    /// e.g. `transactionid`, `LockManager`.
    pub wait_event: String,
    /// The statement's first 60 characters.
    pub query: String,
    /// The first 60 characters of the statement of the backend blocking them.
    pub blocked_by: String,
    /// How many backends.
    pub backends: i64,
    /// The oldest of their transactions, seconds.
    pub oldest_xact_s: f64,
}

/// One stall.
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    /// Seconds since the start of the run.
    pub at_s: f64,
    /// The shard.
    pub shard: usize,
    /// Outcomes written there so far.
    pub completed: u64,
    /// Jobs claimed there but not completed.
    pub outstanding: u64,
    /// What the backends were doing.
    pub activity: Vec<Activity>,
}

/// Watches progress through [`Watch::tick`].
pub struct Watch {
    go: Instant,
    /// Per shard: outcomes written at the last change, and when.
    last: Vec<(u64, Instant)>,
    /// The stalls seen.
    pub stalls: Vec<Stall>,
}

impl Watch {
    /// Starts watching `shards` shards at `go`.
    pub fn new(go: Instant, shards: usize) -> Watch {
        Watch {
            go,
            last: vec![(0, go); shards],
            stalls: Vec::new(),
        }
    }

    /// Called with the jobs claimed and the outcomes written so far, by
    /// shard; snapshots a shard's activity when it has jobs outstanding and
    /// wrote nothing for [`STALL_AFTER`].
    pub async fn tick(&mut self, cluster: &Cluster, claimed: &[u64], completed: &[u64]) {
        let now = Instant::now();
        for (i, (&done, &taken)) in completed.iter().zip(claimed).enumerate() {
            let (last, since) = self.last[i];
            if done != last || taken <= done {
                self.last[i] = (done, now);
                continue;
            }
            if now - since < STALL_AFTER || self.stalls.len() >= MAX_REPORTS {
                continue;
            }
            self.last[i] = (done, now);
            let activity = activity(cluster, i).await;
            self.stalls.push(Stall {
                at_s: now.duration_since(self.go).as_secs_f64(),
                shard: i,
                completed: done,
                outstanding: taken - done,
                activity,
            });
        }
    }
}

/// What shard `i`'s backends are doing (empty when it cannot be asked).
async fn activity(cluster: &Cluster, i: usize) -> Vec<Activity> {
    let shard = cluster.admin.get(i);
    let Ok(db) = shard.client().await else {
        return Vec::new();
    };
    let Ok(rows) = db.query(ACTIVITY_SQL, &[]).await else {
        return Vec::new();
    };
    rows.iter()
        .map(|r| Activity {
            shard: i,
            state: r.get::<_, Option<String>>(0).unwrap_or_default(),
            wait_event_type: r.get(1),
            wait_event: r.get(2),
            query: r.get::<_, Option<String>>(3).unwrap_or_default(),
            blocked_by: r.get(4),
            backends: r.get(5),
            oldest_xact_s: r.get(6),
        })
        .collect()
}
