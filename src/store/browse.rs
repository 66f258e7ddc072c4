//! Reading many jobs for operators: lists by state (keyset-paged, each state
//! through its partial index), failed-job counts, recent completions, the
//! age of the oldest ready job, a job's steps.

use super::backlog;
use super::exec;
use super::sql::{self, Param};
use super::JobStatus;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::Row;

/// The states a job list can show; `Retrying`, `Scheduled` and `Parked`
/// split the `scheduled` status into jobs that failed before, delayed ones
/// and parked workflows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListState {
    /// `queued`: ready to be claimed.
    Ready,
    /// `waiting`: parked behind another job of its key.
    Waiting,
    /// `scheduled` that never ran: delayed.
    Scheduled,
    /// `scheduled` after a failed attempt.
    Retrying,
    /// `scheduled`: a workflow parked on a durable sleep or a wait.
    Parked,
    /// `running`.
    Running,
    /// `succeeded`.
    Succeeded,
    /// `dead`.
    Dead,
    /// `failed` (schema versions before 3).
    Failed,
    /// `cancelled`.
    Cancelled,
}

impl ListState {
    /// Every list, in lifecycle order.
    pub const ALL: [ListState; 10] = [
        ListState::Ready,
        ListState::Waiting,
        ListState::Scheduled,
        ListState::Retrying,
        ListState::Parked,
        ListState::Running,
        ListState::Succeeded,
        ListState::Dead,
        ListState::Failed,
        ListState::Cancelled,
    ];

    /// The name in URLs and counts (`ready`, `retrying`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ListState::Ready => "ready",
            ListState::Waiting => "waiting",
            ListState::Scheduled => "scheduled",
            ListState::Retrying => "retrying",
            ListState::Parked => "parked",
            ListState::Running => "running",
            ListState::Succeeded => "succeeded",
            ListState::Dead => "dead",
            ListState::Failed => "failed",
            ListState::Cancelled => "cancelled",
        }
    }

    /// Its name among the queue-depth counts ([`backlog::StateCounts::STATES`]:
    /// `ready` is `queued`, `scheduled` is `delayed`); `None` for a
    /// finished state, which those counts leave out.
    pub fn backlog_state(self) -> Option<&'static str> {
        match self {
            ListState::Ready => Some("queued"),
            ListState::Scheduled => Some("delayed"),
            ListState::Waiting | ListState::Retrying | ListState::Parked | ListState::Running => {
                Some(self.as_str())
            }
            ListState::Succeeded | ListState::Dead | ListState::Failed | ListState::Cancelled => {
                None
            }
        }
    }

    /// The list named `text`.
    pub fn parse(text: &str) -> Option<ListState> {
        ListState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether the list runs newest first (finished states) rather than in
    /// the order the queue will take them.
    pub fn newest_first(self) -> bool {
        matches!(
            self,
            ListState::Succeeded | ListState::Dead | ListState::Failed | ListState::Cancelled
        )
    }

    fn statement(self) -> &'static str {
        match self {
            ListState::Ready => sql::JOBS_READY,
            ListState::Waiting => sql::JOBS_WAITING,
            ListState::Scheduled | ListState::Retrying | ListState::Parked => sql::JOBS_SCHEDULED,
            ListState::Running => sql::JOBS_RUNNING,
            _ => sql::JOBS_FINISHED,
        }
    }

    /// The `$9` of the statement: the status (or sub-state) it reads.
    fn variant(self) -> &'static str {
        match self {
            ListState::Retrying => "retrying",
            ListState::Scheduled => "scheduled",
            ListState::Parked => "parked",
            ListState::Succeeded => JobStatus::Succeeded.as_str(),
            ListState::Dead => JobStatus::Dead.as_str(),
            ListState::Failed => JobStatus::Failed.as_str(),
            ListState::Cancelled => JobStatus::Cancelled.as_str(),
            _ => "",
        }
    }
}

/// Which jobs of a state to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this handler.
    pub handler: Option<String>,
    /// Only this ordering key.
    pub key: Option<String>,
}

/// Where a row stands in its list's order on its shard (ready: queue,
/// priority, id; waiting: queue, key, id; the others: a timestamp in µs
/// since the epoch, then id). Compare positions of the same list only; the
/// shard orders text by its collation, which `Ord` here need not match.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Position {
    /// Queue (ready, waiting), else empty.
    pub text: String,
    /// Ordering key (waiting), else empty.
    pub text2: String,
    /// Priority (ready), timestamp in µs (scheduled, running, finished), else 0.
    pub num: i64,
    /// Job id.
    pub id: i64,
}

/// One job in a list.
#[derive(Debug, Clone)]
pub struct JobSummary {
    /// The job.
    pub id: JobId,
    /// Queue.
    pub queue: String,
    /// Handler.
    pub handler: String,
    /// Ordering key.
    pub ordering_key: Option<String>,
    /// State.
    pub status: JobStatus,
    /// Attempts started.
    pub attempts: i32,
    /// Attempt limit.
    pub max_attempts: i32,
    /// The first 300 characters of its last error.
    pub error: Option<String>,
    /// Timestamps, as the database prints them.
    pub created_at: Option<String>,
    /// When it is (or was) due.
    pub run_at: Option<String>,
    /// When it finished.
    pub finished_at: Option<String>,
    /// Its place in the list, to continue after it.
    pub position: Position,
}

/// One page of one state's list on one shard.
#[derive(Debug, Clone)]
pub struct ListPage<'a> {
    /// The state.
    pub state: ListState,
    /// The filters.
    pub filter: &'a JobFilter,
    /// Continue after this row of the shard (the first page when `None`).
    pub after: Option<&'a Position>,
    /// Rows at most.
    pub limit: i64,
}

/// Up to `page.limit` jobs of one state on `shard`, in the list's order,
/// after `page.after`.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn list(shard: &Shard, page: &ListPage<'_>) -> Result<Vec<JobSummary>, ShardError> {
    let f = page.filter;
    let (text, text2, num, id) = match page.after {
        Some(p) => (Some(p.text.as_str()), p.text2.as_str(), p.num, p.id),
        None => (None, "", 0, 0),
    };
    let variant = page.state.variant();
    let params: [Param; 9] = [
        (&f.queue, Type::TEXT),
        (&f.handler, Type::TEXT),
        (&f.key, Type::TEXT),
        (&text, Type::TEXT),
        (&text2, Type::TEXT),
        (&num, Type::INT8),
        (&id, Type::INT8),
        (&page.limit, Type::INT8),
        (&variant, Type::TEXT),
    ];
    let rows = exec::query(shard, page.state.statement(), &params).await?;
    Ok(rows.iter().map(summary).collect())
}

fn summary(r: &Row) -> JobSummary {
    let id = JobId {
        shard_key: r.get("shard_key"),
        id: r.get("id"),
    };
    JobSummary {
        id,
        queue: r.get("queue"),
        handler: r.get("handler"),
        ordering_key: r.get("ordering_key"),
        status: JobStatus::from_column(r.get("status")),
        attempts: r.get("attempts"),
        max_attempts: r.get("max_attempts"),
        error: r.get("error"),
        created_at: r.get("created_at"),
        run_at: r.get("run_at"),
        finished_at: r.get("finished_at"),
        position: Position {
            text: r.get("pos_text"),
            text2: r.get("pos_text2"),
            num: r.get("pos_num"),
            id: id.id,
        },
    }
}

/// Dead, failed and cancelled jobs on `shard` by queue and state, each
/// counted up to `cap` ([`sql::FAILED_COUNTS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedCount {
    /// Queue.
    pub queue: String,
    /// `dead`, `failed` or `cancelled`.
    pub state: String,
    /// The jobs, at most the cap.
    pub count: i64,
    /// Whether there are more than the cap: `count` is then the cap.
    pub more: bool,
}

/// [`FailedCount`]s of `shard`, each counted up to `cap` jobs (at least
/// 1): the read costs the queues' pairs times the cap, however many such
/// jobs retention keeps.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn failed_counts(shard: &Shard, cap: i64) -> Result<Vec<FailedCount>, ShardError> {
    let cap = cap.max(1);
    // One more than the cap: whether there are more.
    let limit = cap.saturating_add(1);
    let rows = exec::query(shard, sql::FAILED_COUNTS, &[(&limit, Type::INT8)]).await?;
    Ok(rows
        .iter()
        .map(|r| {
            let n: i64 = r.get("count");
            FailedCount {
                queue: r.get("queue"),
                state: r.get("state"),
                count: n.min(cap),
                more: n > cap,
            }
        })
        .collect())
}

/// Jobs finished on `shard` in the last `window`, by queue and bucket of
/// `bucket` (index 0: the newest): `(queue, bucket index, count)`.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn completions_recent(
    shard: &Shard,
    bucket: Duration,
    window: Duration,
) -> Result<Vec<(String, i64, i64)>, ShardError> {
    let bucket_s = bucket.as_secs().max(1) as i64;
    let window_s = window.as_secs().max(1) as i64;
    let rows = exec::query(
        shard,
        sql::COMPLETIONS_RECENT,
        &[(&bucket_s, Type::INT8), (&window_s, Type::INT8)],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get("queue"), r.get("ago"), r.get("count")))
        .collect())
}

/// How long the longest-waiting ready job of `queue` on `shard` has been
/// due (`None` when none is ready).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn oldest_ready(shard: &Shard, queue: &str) -> Result<Option<Duration>, ShardError> {
    let row = exec::query_one(shard, sql::QUEUE_OLDEST_READY, &[(&queue, Type::TEXT)]).await?;
    let age: Option<f64> = row.get("age_s");
    Ok(age.map(|s| Duration::from_secs_f64(s.max(0.0))))
}

/// A recorded step of a workflow.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepInfo {
    /// Step name.
    pub name: String,
    /// Its output.
    pub output: Option<Value>,
    /// Its error, when it recorded one.
    pub error: Option<String>,
    /// When it was recorded, as the database prints it.
    pub created_at: String,
}

/// The recorded steps of job `id` on `shard`.
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn steps_of(shard: &Shard, id: JobId) -> Result<Vec<StepInfo>, ShardError> {
    let rows = exec::query(
        shard,
        sql::STEPS_OF_JOB,
        &[(&id.shard_key, Type::INT4), (&id.id, Type::INT8)],
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| StepInfo {
            name: r.get("step_name"),
            output: r.get("output"),
            error: r.get("error"),
            created_at: r.get("created_at"),
        })
        .collect())
}

/// Unfinished jobs on `shard` by queue and list state (`ready`, `waiting`,
/// `scheduled`, `retrying`, `parked`, `running`), from the queue-depth
/// read ([`backlog::read_within`] `deadline`): `(queue, state, count)`,
/// states with no job left out; and whether the read was bounded (its
/// waiting, scheduled, retrying and parked jobs not counted).
///
/// # Errors
///
/// [`ShardError`] when the shard fails.
///
/// # Cancel safety
///
/// Cancel safe (a read).
pub async fn unfinished_counts(
    shard: &Shard,
    deadline: Duration,
) -> Result<(Vec<(String, String, i64)>, bool), ShardError> {
    let mut out = Vec::new();
    let backlog = backlog::read_within(shard, None, deadline).await?;
    for q in backlog.queues {
        for state in ListState::ALL {
            let n = state.backlog_state().map_or(0, |s| q.depth.get(s));
            if n > 0 {
                out.push((q.queue.clone(), state.as_str().to_string(), n));
            }
        }
    }
    Ok((out, backlog.bounded))
}

/// What finished on one shard in a span of time, by queue.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSince {
    /// The start of the span: the `since` asked for, or later when that
    /// was more than the read's longest span ago (what finished between
    /// `since` and here was not read).
    pub from: chrono::DateTime<chrono::Utc>,
    /// The end of the span: the shard's clock at the read, 5 s back (the
    /// next read's start).
    pub at: chrono::DateTime<chrono::Utc>,
    /// Per queue: jobs finished, and of those the ones that ended dead or
    /// failed.
    pub by_queue: Vec<(String, i64, i64)>,
}

/// The jobs of `shard` that finished after `since` (`None`: 10 s before the
/// end) and up to 5 s ago, over at most the last `span` of that, by queue
/// ([`sql::FINISHED_SINCE`]); given up on the server after `deadline`.
///
/// # Errors
///
/// [`ShardError`] when the shard fails or passes its deadline.
///
/// # Cancel safety
///
/// Cancel safe: a read; dropped, its connection is closed and the server
/// gives the statement up at `deadline`.
pub async fn finished_since(
    shard: &Shard,
    since: Option<chrono::DateTime<chrono::Utc>>,
    span: Duration,
    deadline: Duration,
) -> Result<FinishedSince, ShardError> {
    let span_ms = i64::try_from(span.as_millis()).unwrap_or(i64::MAX);
    let row = super::exec::read_one_within(
        shard,
        deadline,
        sql::FINISHED_SINCE,
        &[(&since, Type::TIMESTAMPTZ), (&span_ms, Type::INT8)],
    )
    .await?;
    let queues: Vec<String> = row.get::<_, Option<_>>("queues").unwrap_or_default();
    let done: Vec<i64> = row.get::<_, Option<_>>("done").unwrap_or_default();
    let failed: Vec<i64> = row.get::<_, Option<_>>("failed").unwrap_or_default();
    let by_queue = queues
        .into_iter()
        .zip(done)
        .zip(failed)
        .map(|((q, d), f)| (q, d, f))
        .collect();
    let (from, at) = (row.get("from_at"), row.get("at"));
    Ok(FinishedSince { from, at, by_queue })
}
