//! How deep each queue is on a shard: its unfinished jobs counted by state,
//! and how long its oldest ready job has waited. The one read of queue depth:
//! the metrics exporter, `shardq status`, the dashboard and `Client::depth`
//! go through [`read_within`] (the full read, and a bounded one past half
//! its deadline); [`read`] is the full read alone.

use super::exec;
use super::sql;
use crate::shards::{Shard, ShardError};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

/// A queue's unfinished jobs, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StateCounts {
    /// Ready to be claimed (`queued`).
    pub queued: i64,
    /// Keyed, parked behind the running or retrying job of their key.
    pub waiting: i64,
    /// Scheduled again after a failed attempt, waiting out the backoff.
    pub retrying: i64,
    /// Scheduled for later, never attempted.
    pub delayed: i64,
    /// Workflows parked until a durable sleep ends or what they wait for
    /// (a message, a child) arrives: they hold no slot, lease or permit.
    pub parked: i64,
    /// Claimed by a worker, under a lease.
    pub running: i64,
}

impl StateCounts {
    /// The state names, in the order of [`StateCounts::counts`]: the labels
    /// of the metrics and the rows of `shardq status`.
    pub const STATES: [&'static str; 6] = [
        "queued", "waiting", "retrying", "delayed", "parked", "running",
    ];

    /// The states a bounded read ([`read_within`]) counts: the others it
    /// leaves out (zero, [`BoundedBacklog::bounded`]).
    pub const COUNTED_WHEN_BOUNDED: [&'static str; 2] = ["queued", "running"];

    /// Whether a bounded read leaves `state` (one of
    /// [`StateCounts::STATES`]) out: `waiting`, `retrying`, `delayed` and
    /// `parked`.
    pub fn left_out_when_bounded(state: &str) -> bool {
        Self::STATES.contains(&state) && !Self::COUNTED_WHEN_BOUNDED.contains(&state)
    }

    /// The count of `state` (one of [`StateCounts::STATES`]; 0 for any
    /// other name).
    pub fn get(&self, state: &str) -> i64 {
        Self::STATES
            .iter()
            .position(|s| *s == state)
            .map_or(0, |i| self.counts()[i])
    }

    /// The counts, in the order of [`StateCounts::STATES`].
    pub fn counts(&self) -> [i64; 6] {
        [
            self.queued,
            self.waiting,
            self.retrying,
            self.delayed,
            self.parked,
            self.running,
        ]
    }

    /// All unfinished jobs.
    pub fn total(&self) -> i64 {
        self.counts().iter().sum()
    }

    /// Adds `other`'s counts (another shard's, say).
    pub fn add(&mut self, other: &StateCounts) {
        self.queued += other.queued;
        self.waiting += other.waiting;
        self.retrying += other.retrying;
        self.delayed += other.delayed;
        self.parked += other.parked;
        self.running += other.running;
    }

    /// The count of state `state` (one of [`StateCounts::STATES`]).
    fn slot(&mut self, state: &str) -> &mut i64 {
        match state {
            "queued" => &mut self.queued,
            "waiting" => &mut self.waiting,
            "retrying" => &mut self.retrying,
            "delayed" => &mut self.delayed,
            "parked" => &mut self.parked,
            "running" => &mut self.running,
            other => panic!("unknown backlog state `{other}` from QUEUE_BACKLOG"),
        }
    }
}

/// One queue's backlog on one shard.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueBacklog {
    /// Queue.
    pub queue: String,
    /// Its unfinished jobs by state.
    pub depth: StateCounts,
    /// Seconds since the first ready job (the first to be claimed) of the
    /// queue's longest-waiting priority and kind became due: the oldest
    /// `run_at` among those first jobs, by the shard's clock; `None` when
    /// none is ready. A job made ready again (recovered, promoted behind
    /// its key) keeps its `run_at` but takes its place at the end.
    pub oldest_ready_s: Option<f64>,
}

/// The backlog of every queue with an unfinished job on `shard` (only of
/// `queue` when given), sorted by queue, in one statement
/// ([`sql::QUEUE_BACKLOG`]) that reads only partial indexes of unfinished
/// jobs: finished rows cost it nothing.
///
/// # Errors
///
/// [`ShardError`] when the shard fails or passes its statement deadline.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn read(shard: &Shard, queue: Option<&str>) -> Result<Vec<QueueBacklog>, ShardError> {
    let rows = exec::query(shard, sql::QUEUE_BACKLOG, &[(&queue, Type::TEXT)]).await?;
    Ok(by_queue(&rows))
}

/// A backlog read within a deadline ([`read_within`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BoundedBacklog {
    /// Every queue's backlog; without its `waiting` and scheduled counts
    /// (zero) when `bounded`.
    pub queues: Vec<QueueBacklog>,
    /// Whether the full read ran past its share of the deadline and only
    /// the ready and running jobs were counted ([`sql::QUEUE_BACKLOG_BOUNDED`]).
    pub bounded: bool,
}

/// The share of the deadline the full read may take (1 / this): the
/// bounded read has the rest.
const FULL_READ_SHARE: u32 = 2;

/// [`read`] of every queue (only of `queue` when given) within
/// `deadline` (and the shard's own: the client side gives up at that one,
/// so a caller with a shorter deadline bounds the call itself), as every
/// reader of queue depth reads each shard: the full read within half of
/// what is left once a connection is lent; past that (a long transaction
/// holding the horizon makes its counts of `waiting` and scheduled jobs
/// walk every job that left those states since; or millions of such jobs
/// wait), the ready and running counts alone, from their floors, within
/// the rest less a margin. Each read is a transaction of its own, with
/// the server's statement timeout set to its share.
///
/// # Errors
///
/// [`ShardError`] when the shard fails, or the bounded read passes what
/// is left of the deadline.
///
/// # Cancel safety
///
/// Cancel safe: reads only; dropped, its connection is closed.
pub async fn read_within(
    shard: &Shard,
    queue: Option<&str>,
    deadline: Duration,
) -> Result<BoundedBacklog, ShardError> {
    let started = Instant::now();
    // The shard's own deadline bounds the whole read too.
    let deadline = deadline.min(shard.deadline());
    shard
        .within(async {
            let mut client = shard.lend().await?;
            let reads = [sql::QUEUE_BACKLOG, sql::QUEUE_BACKLOG_BOUNDED];
            let read = read_within_on(&mut client, reads, queue, deadline, started).await;
            client.settle();
            read.map_err(|e| shard.query_error(e))
        })
        .await
}

/// [`read_within`] on a connection with its two reads (`full`, else
/// `bounded`), for a read that began at `started`.
async fn read_within_on(
    client: &mut tokio_postgres::Client,
    [full, bounded]: [&str; 2],
    queue: Option<&str>,
    deadline: Duration,
    started: Instant,
) -> Result<BoundedBacklog, tokio_postgres::Error> {
    let ms = |d: Duration| d.as_millis().max(1).to_string();
    let params: [sql::Param; 1] = [(&queue, Type::TEXT)];
    // What is left once a connection was lent and the transaction began.
    let left = |started: Instant| deadline.saturating_sub(started.elapsed());
    let tx = client.transaction().await?;
    let share = left(started) / FULL_READ_SHARE;
    tx.query_typed(sql::LOCAL_STATEMENT_TIMEOUT, &[(&ms(share), Type::TEXT)])
        .await?;
    match tx.query_typed(full, &params).await {
        Ok(rows) => {
            tx.commit().await?;
            return Ok(BoundedBacklog {
                queues: by_queue(&rows),
                bounded: false,
            });
        }
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => tx.rollback().await?,
        Err(e) => return Err(e),
    }
    let tx = client.transaction().await?;
    // A margin, so that the server cancels the read before the caller's
    // deadline drops the connection (reopened at the next read).
    let rest = left(started);
    let rest = rest.saturating_sub((rest / 10).max(Duration::from_millis(10)));
    tx.query_typed(sql::LOCAL_STATEMENT_TIMEOUT, &[(&ms(rest), Type::TEXT)])
        .await?;
    let rows = tx.query_typed(bounded, &params).await?;
    tx.commit().await?;
    Ok(BoundedBacklog {
        queues: by_queue(&rows),
        bounded: true,
    })
}

/// The rows of [`sql::QUEUE_BACKLOG`] (or its bounded form), by queue.
fn by_queue(rows: &[tokio_postgres::Row]) -> Vec<QueueBacklog> {
    let mut out: BTreeMap<String, QueueBacklog> = BTreeMap::new();
    for r in rows {
        let name: String = r.get("queue");
        let entry = out.entry(name.clone()).or_insert_with(|| QueueBacklog {
            queue: name,
            depth: StateCounts::default(),
            oldest_ready_s: None,
        });
        *entry.depth.slot(r.get("state")) += r.get::<_, i64>("count");
        if let Some(age) = r.get::<_, Option<f64>>("oldest_ready_s") {
            entry.oldest_ready_s = Some(age);
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardq_local::EphemeralServer;

    /// Rows of the backlog's shape: one queue's `queued` count, `$1` ready.
    const READY_ONLY: &str = "SELECT 'q'::text AS queue, 'queued' AS state, \
        7::bigint AS count, 1.5::float8 AS oldest_ready_s WHERE $1::text IS NULL";
    /// The same with a `waiting` count, after sleeping past any share of a
    /// deadline under a minute.
    const SLOW: &str = "SELECT 'q'::text AS queue, s.state, 3::bigint AS count, \
        NULL::float8 AS oldest_ready_s \
        FROM pg_sleep(60), (VALUES ('queued'), ('waiting')) s(state) WHERE $1::text IS NULL";
    const DEADLINE: Duration = Duration::from_millis(2_000);

    /// A full read past its share: the bounded read's rows, said bounded,
    /// within the deadline; a full read within it: its rows. Neither
    /// leaves its statement timeout on the connection.
    #[tokio::test]
    async fn a_full_read_past_its_share_gives_way_to_the_bounded_one() {
        let server = EphemeralServer::start().await.expect("server");
        let (mut db, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let timeout_before: String = db
            .query_one("SHOW statement_timeout", &[])
            .await
            .unwrap()
            .get(0);

        let started = Instant::now();
        let read = read_within_on(&mut db, [SLOW, READY_ONLY], None, DEADLINE, started)
            .await
            .expect("answered");
        assert!(started.elapsed() < DEADLINE, "{:?}", started.elapsed());
        assert!(read.bounded);
        assert_eq!(read.queues.len(), 1);
        assert_eq!(read.queues[0].depth.queued, 7, "the bounded read's rows");
        assert_eq!(read.queues[0].depth.waiting, 0);

        let read = read_within_on(&mut db, [READY_ONLY, SLOW], None, DEADLINE, Instant::now())
            .await
            .expect("answered");
        assert!(!read.bounded);
        assert_eq!(read.queues[0].depth.queued, 7);
        assert_eq!(read.queues[0].oldest_ready_s, Some(1.5));
        let timeout_after: String = db
            .query_one("SHOW statement_timeout", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(timeout_after, timeout_before);
    }
}
