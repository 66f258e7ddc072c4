//! What holds a shard's xmin horizon back, and how many dead row versions
//! the queue table carries: while any transaction holds the horizon, vacuum
//! removes no dead version made since it began, and they pile up. Read by
//! the metrics exporter (`shardq_oldest_xmin_age_seconds` and beside it) and
//! `shardq status`, with the age of the lease floor, which an open
//! transaction that took an id also holds back.

use super::sql;
use crate::shards::{Shard, ShardError};
use std::time::Duration;
use tokio_postgres::types::Type;

/// The table whose dead row versions are reported: every claim and
/// completion rewrites one of its rows.
pub const QUEUE_TABLE: &str = "workflow_status";

/// Server-side limit of the read. The views it reads are in memory and
/// answer in milliseconds; a server that takes longer is sick, and the
/// read must not sit among the shard's connections meanwhile.
pub const READ_STATEMENT_TIMEOUT: Duration = Duration::from_secs(1);

/// Who can hold a shard's xmin horizon back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Holder {
    /// A session of the shard's database in a transaction: a report query,
    /// `pg_dump`, a session left idle in transaction.
    Backend,
    /// A standby's `hot_standby_feedback`, through its walsender (no slot).
    Standby,
    /// A replication slot's `xmin` (a physical slot fed by a standby's
    /// `hot_standby_feedback`); it holds every database of the server.
    ReplicationSlot,
    /// A prepared transaction (`PREPARE TRANSACTION`) never committed or
    /// rolled back.
    Prepared,
}

impl Holder {
    /// Every holder, in the order [`Horizon::held`] lists them.
    pub const ALL: [Holder; 4] = [
        Holder::Backend,
        Holder::Standby,
        Holder::ReplicationSlot,
        Holder::Prepared,
    ];

    /// The name used as the metrics' `holder` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Holder::Backend => "backend",
            Holder::Standby => "standby",
            Holder::ReplicationSlot => "replication_slot",
            Holder::Prepared => "prepared",
        }
    }
}

/// How far back one kind of holder holds the horizon: its oldest one.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HeldBack {
    /// Which kind.
    pub holder: Holder,
    /// Seconds since its oldest transaction began, by the shard's clock;
    /// 0 when none holds it; `None` for holders with no start time
    /// (standbys, slots).
    pub seconds: Option<f64>,
    /// How many transaction ids ago its oldest xmin (or xid) was; 0 when
    /// none holds it.
    pub xids: i64,
}

/// The queue table's row versions, from the statistics collector (an
/// estimate it updates a while after each write, not a count).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TableVacuum {
    /// Dead row versions not yet removed (`n_dead_tup`).
    pub dead_rows: i64,
    /// Live rows (`n_live_tup`).
    pub live_rows: i64,
    /// Seconds since autovacuum last finished on it; `None` when never.
    pub last_autovacuum_s: Option<f64>,
}

/// What holds one shard's xmin horizon back, and what it left behind.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Horizon {
    /// One entry per [`Holder::ALL`], in that order.
    pub held: Vec<HeldBack>,
    /// The pid of the session in the oldest transaction (of those of
    /// [`Holder::Backend`]), to look up in `pg_stat_activity`.
    pub oldest_backend_pid: Option<i32>,
    /// How many transaction ids ago the oldest replication slot's
    /// `catalog_xmin` was: it holds back only the system catalogs, not the
    /// queue table, so it is apart from [`Horizon::held`].
    pub slot_catalog_xids: i64,
    /// Sessions of the database whose transaction this role may not see
    /// (it lacks `pg_read_all_stats`): they may hold the horizon unseen.
    pub hidden_sessions: i64,
    /// The queue table's row versions, `None` before it has statistics.
    pub queue_table: Option<TableVacuum>,
    /// Seconds since the shard's lease floor (before it no running job's
    /// lease ends; worker upkeep moves it every few seconds), by the
    /// shard's clock; `None` before the first. It stays a few seconds
    /// while workers run, and grows while a transaction that took an id
    /// stays open on the server, while a job's lease is expired and not
    /// recovered (its key held, say), or while no worker runs upkeep:
    /// reads of the running jobs then walk what ran since.
    pub lease_floor_age_s: Option<f64>,
}

impl Horizon {
    /// How `holder` holds the horizon back.
    pub fn held_by(&self, holder: Holder) -> Option<&HeldBack> {
        self.held.iter().find(|h| h.holder == holder)
    }

    /// The oldest transaction holding the horizon, in seconds, of the
    /// holders that have a start time.
    pub fn oldest_seconds(&self) -> f64 {
        self.held
            .iter()
            .filter_map(|h| h.seconds)
            .fold(0.0, f64::max)
    }
}

/// Reads what holds `shard`'s horizon back, in one statement of a
/// read-only transaction limited to [`READ_STATEMENT_TIMEOUT`] on the server
/// (and to the shard's deadline here).
///
/// # Errors
///
/// [`ShardError`] when the shard fails or passes a deadline.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn read(shard: &Shard) -> Result<Horizon, ShardError> {
    let row = super::exec::read_one_within(
        shard,
        READ_STATEMENT_TIMEOUT,
        sql::HORIZON_READ,
        &[(&QUEUE_TABLE, Type::TEXT)],
    )
    .await?;
    let held = |holder, seconds, xids| HeldBack {
        holder,
        seconds,
        xids: row.get(xids),
    };
    let queue_table = row
        .get::<_, Option<i64>>("dead_rows")
        .map(|dead_rows| TableVacuum {
            dead_rows,
            live_rows: row.get("live_rows"),
            last_autovacuum_s: row.get("autovacuum_s"),
        });
    Ok(Horizon {
        held: vec![
            held(Holder::Backend, Some(row.get("backend_s")), "backend_xids"),
            held(Holder::Standby, None, "standby_xids"),
            held(Holder::ReplicationSlot, None, "slot_xids"),
            held(
                Holder::Prepared,
                Some(row.get("prepared_s")),
                "prepared_xids",
            ),
        ],
        oldest_backend_pid: row.get("backend_pid"),
        slot_catalog_xids: row.get("slot_catalog_xids"),
        hidden_sessions: row.get("hidden"),
        queue_table,
        lease_floor_age_s: lease_floor_age(shard).await,
    })
}

/// The lease floor's age, read apart from the horizon (a shardq table, not
/// the server's views): `None` before the first floor, and when the read
/// fails (a shard before schema 51, a role that may not read the table),
/// which leaves the horizon's own figures alone.
async fn lease_floor_age(shard: &Shard) -> Option<f64> {
    let read =
        super::exec::read_one_within(shard, READ_STATEMENT_TIMEOUT, sql::LEASE_FLOOR_AGE, &[])
            .await;
    match read {
        Ok(row) => row.get("lease_floor_s"),
        Err(error) => {
            tracing::debug!(shard = %shard.name, %error, "lease floor age not read");
            None
        }
    }
}
