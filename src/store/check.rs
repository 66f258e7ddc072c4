//! The invariants `shardq check` verifies on one shard, read from one
//! snapshot ([`sql::CHECK_STRANDED_KEYS`] and the statements beside it,
//! and [`sql::CHECK_LOST_MESSAGE_WAKE`] and those beside it for workflows
//! that wait, say what each reads and what it costs).

use super::sql::{self, Param};
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use std::time::{Duration, Instant};
use tokio_postgres::types::Type;
use tokio_postgres::{IsolationLevel, Row};

/// A property every shard must have at every moment; `check` reports each
/// one that does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Invariant {
    /// A (queue, ordering key) with `waiting` jobs has a queued, running or
    /// scheduled job (else nothing ever queues its waiting jobs).
    StrandedKey,
    /// The running jobs of one (queue, ordering key) come from one claim
    /// (one owner, one claim time).
    KeyRunningTwice,
    /// No running job's lease expired longer ago than the threshold
    /// (else lease recovery is not happening).
    LeaseNotRecovered,
    /// No scheduled job was due longer ago than the threshold (else
    /// promotion of due jobs is not happening).
    DueNotPromoted,
    /// Each job's owner, lease, fence, attempts and times agree with its
    /// status (the check's statement lists the legal combinations).
    JobState,
    /// No parked workflow waits in a recv on a topic that holds a message
    /// sent before its wake time (else the send did not wake it).
    LostMessageWake,
    /// No parked parent waits on a child that finished longer ago than
    /// the grace (else the child's completion did not wake it).
    LostChildWake,
    /// No child's wake owed to a parent on another shard is older than
    /// the grace (else the relay does not deliver it).
    WakeNotRelayed,
    /// Every unfinished child whose parent must be on its shard has its
    /// parent there (a move or retention may take it elsewhere: those
    /// children are not judged).
    ParentMissing,
    /// No workflow cancelled longer ago than the grace has unfinished
    /// children left uncancelled (but those started to be abandoned).
    CancelledChildrenLeft,
    /// No cancel cascade is owed longer than the grace (else neither the
    /// canceller nor the workers' pass got it to every child, on any
    /// shard).
    CascadeOwed,
    /// The shard is at this binary's schema version and records the place
    /// in the shard map that the configured list gives it.
    ShardMap,
}

impl Invariant {
    /// Every invariant, in report order.
    pub const ALL: [Invariant; 12] = [
        Invariant::StrandedKey,
        Invariant::KeyRunningTwice,
        Invariant::LeaseNotRecovered,
        Invariant::DueNotPromoted,
        Invariant::JobState,
        Invariant::LostMessageWake,
        Invariant::LostChildWake,
        Invariant::WakeNotRelayed,
        Invariant::ParentMissing,
        Invariant::CancelledChildrenLeft,
        Invariant::CascadeOwed,
        Invariant::ShardMap,
    ];

    /// The name in reports and in the `invariant` label of
    /// `shardq_invariant_violations`.
    pub fn as_str(self) -> &'static str {
        match self {
            Invariant::StrandedKey => "stranded_key",
            Invariant::KeyRunningTwice => "key_running_twice",
            Invariant::LeaseNotRecovered => "lease_not_recovered",
            Invariant::DueNotPromoted => "due_not_promoted",
            Invariant::JobState => "job_state",
            Invariant::LostMessageWake => "lost_message_wake",
            Invariant::LostChildWake => "lost_child_wake",
            Invariant::WakeNotRelayed => "wake_not_relayed",
            Invariant::ParentMissing => "parent_missing",
            Invariant::CancelledChildrenLeft => "cancelled_children_left",
            Invariant::CascadeOwed => "cascade_owed",
            Invariant::ShardMap => "shard_map",
        }
    }

    /// What holding it means, in one line.
    pub fn describe(self) -> &'static str {
        match self {
            Invariant::StrandedKey => {
                "every key with waiting jobs has a queued, running or scheduled job"
            }
            Invariant::KeyRunningTwice => "the running jobs of a key come from one claim",
            Invariant::LeaseNotRecovered => "expired leases are recovered in time",
            Invariant::DueNotPromoted => "due scheduled jobs are made ready in time",
            Invariant::JobState => "owner, lease, fence, attempts and times agree with status",
            Invariant::LostMessageWake => {
                "a message to a workflow parked in a recv of its topic wakes it"
            }
            Invariant::LostChildWake => "a child's final status wakes its parked parent in time",
            Invariant::WakeNotRelayed => {
                "a child's wake reaches its parent on another shard in time"
            }
            Invariant::ParentMissing => "an unfinished child's parent is on its shard",
            Invariant::CancelledChildrenLeft => {
                "a cancel reaches the children of the cancelled workflow in time"
            }
            Invariant::CascadeOwed => "a cancel cascade owed reaches every child in time",
            Invariant::ShardMap => "schema version and shard map match this binary and the list",
        }
    }
}

impl std::fmt::Display for Invariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One broken instance of an invariant.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Example {
    /// The job that shows it (none for [`Invariant::ShardMap`]).
    #[serde(serialize_with = "job_id_text")]
    pub job: Option<JobId>,
    /// Its queue.
    pub queue: Option<String>,
    /// Its ordering key.
    pub ordering_key: Option<String>,
    /// What is wrong.
    pub detail: String,
}

fn job_id_text<S: serde::Serializer>(job: &Option<JobId>, s: S) -> Result<S::Ok, S::Error> {
    match job {
        Some(id) => s.serialize_str(&id.to_string()),
        None => s.serialize_none(),
    }
}

/// What one shard said about one invariant.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Finding {
    /// Which.
    pub invariant: Invariant,
    /// Instances found: keys for the key invariants, jobs otherwise; 0 when
    /// it holds.
    pub broken: u64,
    /// The read stopped at its bound (see `CheckOptions`): there may be more
    /// than `broken`, and rows past the bound were not judged.
    pub capped: bool,
    /// Rows or index entries read.
    pub scanned: u64,
    /// A few instances.
    pub examples: Vec<Example>,
}

/// How much a check reads on one shard, and its threshold.
#[derive(Debug, Clone, Copy)]
pub struct CheckParams {
    /// A lease expired, or a scheduled job due, longer ago than this is a
    /// violation.
    pub stale_after: Duration,
    /// Keyed unfinished index entries read for stranded keys.
    pub key_entries: u32,
    /// Rows read per window for job states (each unfinished state, the
    /// latest finished, the newest jobs; every running row besides).
    pub state_rows: u32,
    /// Expired leases and overdue jobs counted at most.
    pub count_up_to: u32,
    /// Examples kept per invariant.
    pub examples: u32,
    /// Unreceived messages read for lost message wake-ups, and scheduled
    /// rows read for lost child wake-ups.
    pub wait_entries: u32,
    /// A parent parked on a child's result looks again by itself this long
    /// after it parked (its `run_at` is at most this far ahead).
    pub child_recheck: Duration,
    /// A child finished, or a workflow cancelled, longer ago than this
    /// without its parent woken, or its children cancelled, is a
    /// violation.
    pub child_grace: Duration,
    /// Finished jobs are deleted this long after they finish: a child
    /// created longer ago may have lost its parent to retention.
    pub retention: Duration,
    /// The server's statement deadline for the check's transaction.
    pub deadline: Duration,
}

/// Reads one snapshot of `shard` and judges every job invariant on it
/// (all but [`Invariant::ShardMap`]): one finding per invariant, in
/// [`Invariant::ALL`] order, zero ones included.
///
/// One `REPEATABLE READ READ ONLY` transaction: every statement reads the
/// snapshot the first one took, so writers that commit between them
/// (claims, completions, recovery, promotion, enqueues) are not seen by any
/// of them, and the findings agree with each other and with `now()`. It
/// takes no lock and blocks no writer.
///
/// # Errors
///
/// [`ShardError`] when the shard fails or passes its deadline.
///
/// # Cancel safety
///
/// Cancel safe: a read-only transaction; dropped, its connection is closed.
pub async fn read(shard: &Shard, p: &CheckParams) -> Result<Vec<Finding>, ShardError> {
    let started = Instant::now();
    shard
        .within(async {
            let mut client = shard.lend().await?;
            let findings = read_on(&mut client, p, started).await;
            client.settle();
            findings.map_err(|e| shard.query_error(e))
        })
        .await
}

/// [`read`] on a lent connection, for a check that began at `started`.
async fn read_on(
    client: &mut deadpool_postgres::Client,
    p: &CheckParams,
    started: Instant,
) -> Result<Vec<Finding>, tokio_postgres::Error> {
    let deadline_ms = p.deadline.as_millis().max(1).to_string();
    let stale_ms = i64::try_from(p.stale_after.as_millis()).unwrap_or(i64::MAX);
    let (keys, rows) = (i64::from(p.key_entries), i64::from(p.state_rows));
    let (up_to, shown) = (i64::from(p.count_up_to), i64::from(p.examples));
    let wait_entries = i64::from(p.wait_entries);
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let (recheck_ms, grace_ms) = (ms(p.child_recheck), ms(p.child_grace));
    let retention_ms = ms(p.retention);
    let mut tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    tx.query_typed(sql::CHECK_SETTINGS, &[(&deadline_ms, Type::TEXT)])
        .await?;
    let asks: [(Invariant, &str, Vec<Param>); 11] = [
        (
            Invariant::StrandedKey,
            sql::CHECK_STRANDED_KEYS,
            vec![(&keys, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            Invariant::KeyRunningTwice,
            sql::CHECK_KEY_RUNNING_TWICE,
            vec![(&shown, Type::INT8)],
        ),
        (
            Invariant::LeaseNotRecovered,
            sql::CHECK_LEASE_NOT_RECOVERED,
            vec![
                (&stale_ms, Type::INT8),
                (&up_to, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
        (
            Invariant::DueNotPromoted,
            sql::CHECK_DUE_NOT_PROMOTED,
            vec![
                (&stale_ms, Type::INT8),
                (&up_to, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
        (
            Invariant::JobState,
            sql::CHECK_JOB_STATE,
            vec![(&rows, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            Invariant::LostMessageWake,
            sql::CHECK_LOST_MESSAGE_WAKE,
            vec![(&wait_entries, Type::INT8), (&shown, Type::INT8)],
        ),
        (
            Invariant::LostChildWake,
            sql::CHECK_LOST_CHILD_WAKE,
            vec![
                (&wait_entries, Type::INT8),
                (&recheck_ms, Type::INT8),
                (&grace_ms, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
        (
            Invariant::WakeNotRelayed,
            sql::CHECK_WAKE_NOT_RELAYED,
            vec![
                (&wait_entries, Type::INT8),
                (&grace_ms, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
        (
            Invariant::ParentMissing,
            sql::CHECK_PARENT_MISSING,
            vec![
                (&rows, Type::INT8),
                (&retention_ms, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
        (
            Invariant::CancelledChildrenLeft,
            sql::CHECK_CANCELLED_CHILDREN_LEFT,
            vec![
                (&rows, Type::INT8),
                (&grace_ms, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
        (
            Invariant::CascadeOwed,
            sql::CHECK_CASCADE_OWED,
            vec![
                (&rows, Type::INT8),
                (&grace_ms, Type::INT8),
                (&shown, Type::INT8),
            ],
        ),
    ];
    let mut findings = Vec::with_capacity(asks.len());
    for (invariant, statement, params) in &asks {
        if *invariant == Invariant::JobState {
            let left = p.deadline.saturating_sub(started.elapsed());
            let (row, bounded) = super::check_job_state::read(&mut tx, params, left).await?;
            let found = finding(*invariant, &row);
            findings.push(Finding {
                capped: found.capped || bounded,
                ..found
            });
            continue;
        }
        let row = tx.query_typed_one(statement, params).await?;
        findings.push(finding(*invariant, &row));
    }
    tx.commit().await?;
    Ok(findings)
}

/// Decodes the one row every check statement returns.
fn finding(invariant: Invariant, row: &Row) -> Finding {
    let keys: Vec<i32> = row.get("ex_shard_key");
    let ids: Vec<i64> = row.get("ex_id");
    let queues: Vec<Option<String>> = row.get("ex_queue");
    let ordering_keys: Vec<Option<String>> = row.get("ex_key");
    let details: Vec<Option<String>> = row.get("ex_detail");
    let examples = keys
        .into_iter()
        .zip(ids)
        .zip(queues)
        .zip(ordering_keys)
        .zip(details)
        .map(
            |((((shard_key, id), queue), ordering_key), detail)| Example {
                job: Some(JobId { shard_key, id }),
                queue,
                ordering_key,
                detail: detail.unwrap_or_default(),
            },
        )
        .collect();
    let count = |name: &str| u64::try_from(row.get::<_, i64>(name)).unwrap_or(0);
    Finding {
        invariant,
        broken: count("broken"),
        capped: row.get("capped"),
        scanned: count("scanned"),
        examples,
    }
}
