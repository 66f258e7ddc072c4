//! Fleet-wide queue limits: written on every shard, enforced by permits
//! the workers lease from the first shard (see `worker::permits`).

use super::browse::within;
use super::error::ClientError;
use super::handle::Client;
use super::pause::check_name;
use crate::shards::{Shard, ShardError};
use crate::store::limits::{self, LimitRow, Rate};
use futures_util::future::join_all;
use std::time::Duration;

/// The most times a change is written on the other shards: each round
/// after the first follows a raise of its revision past those some shards
/// kept that the home never ordered (a writer's clock the first read
/// missed); a few rounds, so that a flapping shard cannot loop it.
const WRITE_ROUNDS: usize = 3;

/// A queue's fleet-wide limits; `None` lifts one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueLimits {
    /// Jobs of the queue running at once across the fleet (a claimed job
    /// counts from its claim until its outcome is written).
    pub concurrency: Option<u32>,
    /// Jobs of the queue started (claimed) per period across the fleet.
    pub rate: Option<StartRate>,
    /// Jobs of each group of the queue ([`crate::NewJob::group`]) running
    /// at once, each group on its own (counted on the group's shard).
    pub group_concurrency: Option<u32>,
    /// Jobs of each group of the queue started per period, each group on
    /// its own.
    pub group_rate: Option<StartRate>,
}

/// At most `count` jobs started per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StartRate {
    /// Starts per period.
    pub count: u32,
    /// The period (whole milliseconds, 1 ms to 24 days).
    pub per: Duration,
}

/// A queue's limits and their use now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueueLimit {
    /// Queue.
    pub queue: String,
    /// Its limits.
    pub limits: QueueLimits,
    /// Permits the workers hold now (on the first shard; `None` when it
    /// did not answer).
    pub in_use: Option<i64>,
    /// Processes holding permits now.
    pub holders: Option<i64>,
}

impl Client {
    /// Sets `queue`'s limits across every process and shard, replacing
    /// those it had (`QueueLimits::default()` lifts them all). Written on
    /// every shard; running workers follow within a second. Lowering a
    /// concurrency lets running jobs finish: new ones start once fewer than
    /// the new limit run.
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for an empty name, [`ClientError::BadLimit`]
    /// for a concurrency or rate of 0, or a period not within 1 ms and 24
    /// days; [`ClientError::NotEveryShard`] when some shard did not answer
    /// (the others have the change: run it again);
    /// [`ClientError::LimitSuperseded`] when a later change replaced this
    /// one on some shards before it reached them. Success means the change
    /// is written on every shard.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: each shard's change is one statement, and
    /// running it again is harmless.
    pub async fn set_queue_limits(&self, queue: &str, set: QueueLimits) -> Result<(), ClientError> {
        check_name(queue)?;
        let row = LimitRow {
            queue: queue.to_string(),
            concurrency: set
                .concurrency
                .map(|n| positive(queue, "a concurrency", n))
                .transpose()?,
            rate: set.rate.map(|r| stored_rate(queue, r)).transpose()?,
            group_concurrency: set
                .group_concurrency
                .map(|n| positive(queue, "a group concurrency", n))
                .transpose()?,
            group_rate: set.group_rate.map(|r| stored_rate(queue, r)).transpose()?,
            revision: 0,
        };
        self.write_limits(row).await
    }

    /// Writes `row` on every shard under a revision the home shard gives
    /// (above every revision any shard records for the queue, so an old
    /// writer's clock cannot outrank it), then on the others, each written
    /// only if newer there. A shard that keeps a newer revision had a later
    /// change written after this one's, or one the home never ordered (a
    /// writer's clock the first read missed): the first kind is an error,
    /// never a success; past the second the revision is raised and the
    /// write repeated there.
    async fn write_limits(&self, mut row: LimitRow) -> Result<(), ClientError> {
        let shards = self.shards.all();
        let Some(home) = shards.first() else {
            return Ok(());
        };
        let above = highest_revision(shards, &row.queue).await.saturating_add(1);
        row.revision = match limits::set_home(home, &row, above).await {
            Ok(revision) => revision,
            Err(e) => return self.every_shard("limit", &row.queue, vec![Err(e)]),
        };
        let mut results: Vec<Result<bool, ShardError>> = shards.iter().map(|_| Ok(true)).collect();
        let mut refused: Vec<usize> = (1..shards.len()).collect();
        for _ in 0..WRITE_ROUNDS {
            let written = join_all(refused.iter().map(|&i| limits::set(&shards[i], &row))).await;
            for (&i, result) in refused.iter().zip(written) {
                results[i] = result;
            }
            refused.retain(|&i| matches!(results[i], Ok(false)));
            if refused.is_empty() {
                break;
            }
            let kept: Vec<&Shard> = refused.iter().map(|&i| &shards[i]).collect();
            match outrank(home, &row, &kept).await {
                Some(revision) => row.revision = revision,
                None => break,
            }
        }
        self.every_shard("limit", &row.queue, results)?;
        if refused.is_empty() {
            Ok(())
        } else {
            Err(ClientError::LimitSuperseded {
                queue: row.queue,
                shards: refused.iter().map(|&i| shards[i].name.clone()).collect(),
            })
        }
    }

    /// Every limited queue, by name, with the permits in use.
    ///
    /// # Errors
    ///
    /// [`ClientError::Shard`] when no shard answers.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn queue_limits(&self) -> Result<Vec<QueueLimit>, ClientError> {
        self.queue_limits_within(None).await
    }

    /// [`Client::queue_limits`], each shard given at most `deadline` to
    /// answer: every shard records the limits, so the ones that answer in
    /// time tell them, and a frozen shard does not hold the others' answer
    /// (the dashboard's overview, the metrics' scrape).
    ///
    /// # Errors
    ///
    /// [`ClientError::Shard`] when no shard answers in time.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    pub async fn queue_limits_within(
        &self,
        deadline: Option<Duration>,
    ) -> Result<Vec<QueueLimit>, ClientError> {
        let shards = self.shards.all();
        let answers = join_all(shards.iter().map(|shard| async move {
            match deadline {
                Some(d) => within(shard, d, limits::read(shard)).await,
                None => limits::read(shard).await,
            }
        }))
        .await;
        // Per queue, the newest revision any shard records.
        let mut newest: Vec<LimitRow> = Vec::new();
        let mut last_error = None;
        let mut answered = false;
        for answer in answers {
            match answer {
                Ok(rows) => {
                    answered = true;
                    for row in rows {
                        match newest.iter_mut().find(|r| r.queue == row.queue) {
                            Some(r) if r.revision < row.revision => *r = row,
                            Some(_) => {}
                            None => newest.push(row),
                        }
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        if !answered {
            if let Some(e) = last_error {
                return Err(e.into());
            }
        }
        let in_use = match (shards.first(), deadline) {
            (Some(home), Some(d)) => within(home, d, limits::in_use(home)).await.ok(),
            (Some(home), None) => limits::in_use(home).await.ok(),
            (None, _) => None,
        };
        let mut out: Vec<QueueLimit> = newest
            .into_iter()
            .filter_map(|r| {
                let limits = QueueLimits {
                    concurrency: r.concurrency.and_then(|n| u32::try_from(n).ok()),
                    rate: r.rate.and_then(start_rate),
                    group_concurrency: r.group_concurrency.and_then(|n| u32::try_from(n).ok()),
                    group_rate: r.group_rate.and_then(start_rate),
                };
                if limits == QueueLimits::default() {
                    return None;
                }
                let used = in_use
                    .as_ref()
                    .map(|u| u.iter().find(|p| p.queue == r.queue));
                Some(QueueLimit {
                    in_use: used.map(|p| p.map_or(0, |p| p.permits)),
                    holders: used.map(|p| p.map_or(0, |p| p.holders)),
                    queue: r.queue,
                    limits,
                })
            })
            .collect();
        out.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(out)
    }
}

/// `n` as stored: 1 to `i32::MAX`.
fn positive(queue: &str, what: &str, n: u32) -> Result<i32, ClientError> {
    i32::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ClientError::BadLimit {
            queue: queue.to_string(),
            why: format!("{what} of {n}; give 1 to 2147483647"),
        })
}

fn start_rate(rate: Rate) -> Option<StartRate> {
    Some(StartRate {
        count: u32::try_from(rate.count).ok()?,
        per: Duration::from_millis(u64::try_from(rate.period_ms).ok()?),
    })
}

fn stored_rate(queue: &str, rate: StartRate) -> Result<Rate, ClientError> {
    let period_ms = u32::try_from(rate.per.as_millis()).unwrap_or(u32::MAX);
    Ok(Rate {
        count: positive(queue, "a rate", rate.count)?,
        period_ms: positive(queue, "a period (ms)", period_ms)?,
    })
}

/// The highest revision of `queue` the shards that answer record (0: none).
async fn highest_revision(shards: &[Shard], queue: &str) -> i64 {
    join_all(shards.iter().map(limits::read))
        .await
        .iter()
        .flat_map(|rows| rows.iter().flatten())
        .filter(|r| r.queue == queue)
        .map(|r| r.revision)
        .max()
        .unwrap_or(0)
}

/// When the home shard still records `row` (no later change went through
/// it), the newer revisions `kept` record were never ordered by the home
/// (a writer's clock the first read missed): moves the home's revision
/// above them and returns it. `None` when a later change replaced `row`
/// on the home, or a shard did not answer.
async fn outrank(home: &Shard, row: &LimitRow, kept: &[&Shard]) -> Option<i64> {
    let mut highest = row.revision;
    let revisions = join_all(kept.iter().map(|s| limits::revision(s, &row.queue))).await;
    for revision in revisions {
        highest = highest.max(revision.ok()??);
    }
    let to = highest.checked_add(1)?;
    limits::raise_home(home, &row.queue, row.revision, to)
        .await
        .ok()?
        .then_some(to)
}
