//! What an operator's view over every shard reads: an overview per shard
//! and queue, lists of jobs by state across shards (keyset-paged), one job
//! with its steps. Every shard is asked at once, each under its own
//! deadline, so one shard that hangs costs the view that shard only.

use super::error::ClientError;
use super::handle::Client;
use crate::job::JobId;
use crate::shards::{Shard, ShardError};
use crate::store::backlog::StateCounts;
use crate::store::browse::{
    self, FinishedSince, JobFilter, JobSummary, ListPage, ListState, Position, StepInfo,
};
use crate::store::jobs::{self, JobInfo};
use crate::store::queues;
use crate::store::workers::{self, WorkerRow};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

/// What [`Client::overview`] reads, and how long it waits.
#[derive(Debug, Clone)]
pub struct OverviewOptions {
    /// How long one shard may take to answer; past it, the shard is reported
    /// unreachable and the others are shown.
    pub deadline: Duration,
    /// Width of one bar of the completions chart.
    pub bucket: Duration,
    /// How far back the completions chart goes.
    pub window: Duration,
    /// A worker whose last heartbeat is older than this is not live.
    pub worker_ttl: Duration,
    /// Dead, failed and cancelled jobs are counted up to this many (at
    /// least 1) per queue, state and shard; past it the count is a floor
    /// ([`QueueOverview::at_least`]), so the read costs the queues times
    /// the cap however many such jobs retention keeps.
    pub failed_count_cap: i64,
}

impl Default for OverviewOptions {
    fn default() -> Self {
        OverviewOptions {
            deadline: Duration::from_secs(2),
            // 30 bars of 10 s: five minutes, fine enough to see a stall.
            bucket: Duration::from_secs(10),
            window: Duration::from_secs(300),
            worker_ttl: crate::heartbeat::HEARTBEAT_TTL,
            // Counting 10,000 index entries takes a few milliseconds.
            failed_count_cap: 10_000,
        }
    }
}

/// One queue on one shard.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct QueueOverview {
    /// Queue name.
    pub queue: String,
    /// Jobs by list state (`ready`, `scheduled`, `retrying`, `running`,
    /// `waiting`, `dead`, `cancelled`, `failed`); absent states are 0.
    pub counts: BTreeMap<String, i64>,
    /// The states whose count stopped at the cap
    /// ([`OverviewOptions::failed_count_cap`]): there are more than shown.
    pub at_least: BTreeSet<String>,
    /// How long the longest-waiting ready job has been due.
    pub oldest_ready: Option<Duration>,
    /// Jobs finished per bucket, oldest bucket first, the last one the
    /// current (partial) bucket.
    pub completions: Vec<i64>,
    /// Whether the queue is paused on this shard.
    pub paused: bool,
}

impl QueueOverview {
    /// The count of `state` (0 when absent).
    pub fn count(&self, state: ListState) -> i64 {
        self.counts.get(state.as_str()).copied().unwrap_or(0)
    }
}

/// One shard in the overview.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardOverview {
    /// Shard name.
    pub shard: String,
    /// host:port/dbname.
    pub target: String,
    /// Why it did not answer (then the rest is empty).
    pub error: Option<String>,
    /// Whether its `waiting`, `scheduled`, `retrying` and `parked` counts
    /// are missing: their read ran past its share of the deadline (a long
    /// transaction holding the horizon, or millions of such jobs), and
    /// only the ready and running jobs were counted.
    pub bounded: bool,
    /// Its queues, by name.
    pub queues: Vec<QueueOverview>,
    /// The live workers' rows on this shard.
    pub workers: Vec<WorkerRow>,
}

impl ShardOverview {
    /// Whether the counts of `state` are this shard's: false when it did
    /// not answer, and, when its read was [`ShardOverview::bounded`], for
    /// the states that read leaves out (`waiting`, `scheduled`,
    /// `retrying`, `parked`).
    pub fn counted(&self, state: ListState) -> bool {
        let left_out = state
            .backlog_state()
            .is_some_and(StateCounts::left_out_when_bounded);
        self.error.is_none() && !(self.bounded && left_out)
    }

    /// Share of claim attempts on this shard that found every dequeue slot
    /// taken, over the live workers' counters (since each started); `None`
    /// before any attempt.
    pub fn lock_miss_rate(&self) -> Option<f64> {
        let (mut busy, mut attempts) = (0u64, 0u64);
        for w in &self.workers {
            busy += w.counters.busy;
            attempts += w.counters.attempts();
        }
        (attempts > 0).then(|| busy as f64 / attempts as f64)
    }

    /// The mean time of one claim statement on this shard, over the live
    /// workers' claims since they started; `None` before any claim.
    pub fn mean_claim_time(&self) -> Option<Duration> {
        let (mut us, mut attempts) = (0u64, 0u64);
        for w in &self.workers {
            us += w.counters.claim_us;
            attempts += w.counters.attempts();
        }
        (attempts > 0).then(|| Duration::from_micros(us / attempts))
    }
}

/// Where each shard's list continues: the position of the last row shown
/// from it (none: from its start).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PageCursor {
    /// By shard index.
    pub after: Vec<Option<Position>>,
}

/// A page of jobs to list.
#[derive(Debug, Clone)]
pub struct JobQuery {
    /// The state.
    pub state: ListState,
    /// Filters.
    pub filter: JobFilter,
    /// Only this shard (by index).
    pub shard: Option<usize>,
    /// Where the previous page ended.
    pub cursor: PageCursor,
    /// Jobs per page.
    pub limit: usize,
    /// How long one shard may take.
    pub deadline: Duration,
}

/// One page of a job list over the shards.
#[derive(Debug, Clone)]
pub struct JobList {
    /// The jobs, with the index of their shard, in the list's order.
    pub jobs: Vec<(usize, JobSummary)>,
    /// Where the next page starts, when there may be one.
    pub next: Option<PageCursor>,
    /// Shards that did not answer: name and why.
    pub unreachable: Vec<(String, String)>,
}

/// A job and where it lives.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobDetail {
    /// The shard holding it.
    pub shard: String,
    /// The job.
    pub info: JobInfo,
    /// Its recorded steps.
    pub steps: Vec<StepInfo>,
}

/// `work` on `shard` within `deadline`; a miss is the shard's
/// [`ShardError::Timeout`].
pub(super) async fn within<T>(
    shard: &Shard,
    deadline: Duration,
    work: impl Future<Output = Result<T, ShardError>>,
) -> Result<T, ShardError> {
    tokio::time::timeout(deadline, work)
        .await
        .unwrap_or_else(|_| {
            Err(ShardError::Timeout {
                shard: shard.name.clone(),
                after: deadline,
            })
        })
}

/// What went wrong on a shard, for an operator: a missed view deadline is
/// named as that (not as the statement timeout the shard error speaks of).
fn describe(err: &ShardError, deadline: Duration) -> String {
    match err {
        ShardError::Timeout { shard, after } if *after == deadline => {
            format!("shard `{shard}`: no answer within {after:?} (the view's deadline per shard)")
        }
        other => crate::error_chain::error_chain(other),
    }
}

impl Client {
    /// Per shard: job counts per queue and state, the oldest ready job's
    /// age, recent completions, live workers. A shard that fails or misses
    /// `options.deadline` is reported in its own entry.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is reported in its own entry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn overview(&self, options: &OverviewOptions) -> Vec<ShardOverview> {
        let asks = self.shards().all().iter().map(|shard| async move {
            let read = within(shard, options.deadline, shard_overview(shard, options)).await;
            let (queues, workers, bounded, error) = match read {
                Ok((q, w, bounded)) => (q, w, bounded, None),
                Err(e) => (
                    Vec::new(),
                    Vec::new(),
                    false,
                    Some(describe(&e, options.deadline)),
                ),
            };
            ShardOverview {
                shard: shard.name.clone(),
                target: shard.target().to_string(),
                error,
                bounded,
                queues,
                workers,
            }
        });
        futures_util::future::join_all(asks).await
    }

    /// What finished on each shard since `since[i]` (the `at` of its last
    /// answer; `None`: the last 10 s), by queue, in shard order; `None` for
    /// a shard that did not answer within `deadline`. A dashboard that
    /// calls it every few seconds has each span counted once. Each read
    /// covers at most the last `span` before its end (5 s before the
    /// shard's now): after a longer gap its `from` is later than
    /// `since[i]` and what finished in between is not read, so a shard
    /// that was away for long answers again within the deadline, at once;
    /// a read past its deadline is given up on the server too.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is `None`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn finished_since(
        &self,
        since: &[Option<chrono::DateTime<chrono::Utc>>],
        span: Duration,
        deadline: Duration,
    ) -> Vec<Option<FinishedSince>> {
        let asks = self.shards().all().iter().enumerate().map(|(i, shard)| {
            let from = since.get(i).copied().flatten();
            async move {
                within(
                    shard,
                    deadline,
                    browse::finished_since(shard, from, span, deadline),
                )
                .await
                .ok()
            }
        });
        futures_util::future::join_all(asks).await
    }

    /// One page of jobs in `query.state` over the shards (or one shard),
    /// continuing where `query.cursor` says. Each shard is read in its own
    /// list order from its own position, and the shards' rows are merged
    /// taking only the head of each: so each shard's rows come as a prefix
    /// of its order, and page after page shows each row once, without gaps.
    ///
    /// # Errors
    ///
    /// None: shards that fail are listed in [`JobList::unreachable`] (their
    /// position is kept, so the next page asks them again).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn list_jobs(&self, query: &JobQuery) -> JobList {
        let shards = self.shards().all();
        let limit = query.limit.max(1);
        let reads = shards
            .iter()
            .filter(|s| query.shard.is_none_or(|only| only == s.index))
            .map(|shard| async move {
                let after = query.cursor.after.get(shard.index).and_then(Option::as_ref);
                let page = ListPage {
                    state: query.state,
                    filter: &query.filter,
                    after,
                    limit: limit as i64,
                };
                (
                    shard,
                    within(shard, query.deadline, browse::list(shard, &page)).await,
                )
            });
        let mut heads = Vec::new();
        let mut unreachable = Vec::new();
        for (shard, read) in futures_util::future::join_all(reads).await {
            match read {
                Ok(rows) => heads.push((shard.index, rows.len() == limit, rows.into_iter())),
                Err(e) => unreachable.push((shard.name.clone(), describe(&e, query.deadline))),
            }
        }
        let mut after = query.cursor.after.clone();
        after.resize(shards.len(), None);
        let mut peeked: Vec<_> = heads
            .into_iter()
            .map(|(index, full, rows)| (index, full, rows.peekable()))
            .collect();
        let mut jobs = Vec::with_capacity(limit);
        while jobs.len() < limit {
            let newest_first = query.state.newest_first();
            let next = peeked
                .iter_mut()
                .filter_map(|(index, _, rows)| {
                    rows.peek().map(|row| (*index, row.position.clone()))
                })
                .min_by(|(ia, a), (ib, b)| {
                    let order = if newest_first { b.cmp(a) } else { a.cmp(b) };
                    order.then(ia.cmp(ib))
                });
            let Some((index, _)) = next else { break };
            let (_, _, rows) = peeked
                .iter_mut()
                .find(|(i, _, _)| *i == index)
                .expect("the shard just peeked");
            let row = rows.next().expect("a peeked row");
            after[index] = Some(row.position.clone());
            jobs.push((index, row));
        }
        // More may follow where a shard has rows left, or gave a full page.
        let more = peeked
            .iter_mut()
            .any(|(_, full, rows)| rows.peek().is_some() || *full);
        JobList {
            jobs,
            next: more.then_some(PageCursor { after }),
            unreachable,
        }
    }

    /// Job `id`, the shard that holds it and its recorded steps; `None`
    /// when no shard has it.
    ///
    /// # Errors
    ///
    /// When its shard fails (or, for a job its shard does not have, another
    /// shard fails).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn job_detail(&self, id: JobId) -> Result<Option<JobDetail>, ClientError> {
        let Some((shard, info)) = self.find(id, |shard| jobs::get(shard, id)).await? else {
            return Ok(None);
        };
        let steps = browse::steps_of(shard, id).await?;
        Ok(Some(JobDetail {
            shard: shard.name.clone(),
            info,
            steps,
        }))
    }
}

/// Everything the overview shows of one shard, and whether its counts of
/// unfinished jobs were bounded.
async fn shard_overview(
    shard: &Shard,
    options: &OverviewOptions,
) -> Result<(Vec<QueueOverview>, Vec<WorkerRow>, bool), ShardError> {
    let mut queues: BTreeMap<String, QueueOverview> = BTreeMap::new();
    fn entry(queues: &mut BTreeMap<String, QueueOverview>, queue: String) -> &mut QueueOverview {
        queues
            .entry(queue.clone())
            .or_insert_with(|| QueueOverview {
                queue,
                ..QueueOverview::default()
            })
    }
    // Half the deadline: the overview's other reads need the rest.
    let (unfinished, bounded) = browse::unfinished_counts(shard, options.deadline / 2).await?;
    for (queue, state, n) in unfinished {
        *entry(&mut queues, queue).counts.entry(state).or_default() += n;
    }
    for failed in browse::failed_counts(shard, options.failed_count_cap).await? {
        let q = entry(&mut queues, failed.queue);
        *q.counts.entry(failed.state.clone()).or_default() += failed.count;
        if failed.more {
            q.at_least.insert(failed.state);
        }
    }
    let buckets = (options.window.as_secs() / options.bucket.as_secs().max(1)).max(1) as usize;
    for (queue, ago, n) in browse::completions_recent(shard, options.bucket, options.window).await?
    {
        let q = entry(&mut queues, queue);
        q.completions.resize(buckets, 0);
        if let Ok(ago) = usize::try_from(ago) {
            if ago < buckets {
                q.completions[buckets - 1 - ago] += n;
            }
        }
    }
    // A paused queue with no job here still shows, so it can be resumed.
    for pause in queues::paused(shard).await? {
        entry(&mut queues, pause.queue).paused = true;
    }
    for q in queues.values_mut() {
        q.completions.resize(buckets, 0);
        if q.count(ListState::Ready) > 0 {
            q.oldest_ready = browse::oldest_ready(shard, &q.queue).await?;
        }
    }
    let workers = workers::live(shard, options.worker_ttl).await?;
    Ok((queues.into_values().collect(), workers, bounded))
}
