//! `Client::check`: every shard's invariants, read from one snapshot per
//! shard, all shards at once, each under its own deadline.

use super::handle::Client;
use crate::config::Config;
use crate::migrate::{self, MigrateError};
use crate::shards::Shard;
use crate::store::check::{self, CheckParams, Example, Finding, Invariant};
use std::time::{Duration, Instant};

/// Added to twice the maintenance interval to make the default staleness
/// threshold: one pass may be skipped (jittered, or its shard briefly slow)
/// and one batch of 5,000 recovered or promoted per pass takes a few passes
/// to work off a crashed worker's buffer, without that reading as broken.
pub const STALE_MARGIN: Duration = Duration::from_secs(10);

/// Keyed unfinished index entries read for stranded keys by default:
/// about 200 ms of one server's CPU at the bound (measured with 58,000
/// keys, 44,000 of them stranded), far less below it.
pub const DEFAULT_KEY_ENTRIES: u32 = 100_000;

/// Rows read per window for job states by default: 2,000 per window is
/// about 25 ms per check with 5,000 running rows.
pub const DEFAULT_STATE_ROWS: u32 = 2_000;

/// Expired leases and overdue scheduled jobs counted at most: the count of
/// a stalled promotion can be the whole delayed backlog.
pub const DEFAULT_COUNT_UP_TO: u32 = 100_000;

/// Examples kept per invariant and shard.
pub const DEFAULT_EXAMPLES: u32 = 5;

/// Unreceived messages, and scheduled rows due within a child's re-check,
/// read by default for lost wake-ups: each a bounded index walk of a few
/// ms per thousand.
pub const DEFAULT_WAIT_ENTRIES: u32 = 10_000;

/// How long after a child finishes, or a workflow is cancelled, its parent
/// must be woken or its children cancelled by default: a wake left to the
/// promotion settles within a maintenance interval, and a client's cancel
/// cascade within seconds.
pub const DEFAULT_CHILD_GRACE: Duration = Duration::from_secs(60);

/// Longest wait for one shard by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// How [`Client::check`] reads and judges.
#[derive(Debug, Clone, Copy)]
pub struct CheckOptions {
    /// A running job whose lease expired, or a scheduled job due, longer
    /// ago than this breaks [`Invariant::LeaseNotRecovered`] or
    /// [`Invariant::DueNotPromoted`]. Default: 2 × the maintenance interval
    /// + [`STALE_MARGIN`].
    pub stale_after: Duration,
    /// Longest wait for one shard (its answer is then "did not answer";
    /// the other shards are not held).
    pub deadline: Duration,
    /// Keyed unfinished index entries read for stranded keys.
    pub key_entries: u32,
    /// Rows read per window for job states (each unfinished state, the
    /// latest finished, the newest jobs; every running row besides).
    pub state_rows: u32,
    /// Expired leases and overdue jobs counted at most.
    pub count_up_to: u32,
    /// Examples kept per invariant and shard.
    pub examples: u32,
    /// Unreceived messages read for [`Invariant::LostMessageWake`], and
    /// scheduled rows read for [`Invariant::LostChildWake`].
    pub wait_entries: u32,
    /// A child finished, or a workflow cancelled, longer ago than this
    /// without its parent woken ([`Invariant::LostChildWake`]) or its
    /// children cancelled ([`Invariant::CancelledChildrenLeft`]), and a
    /// cancel cascade owed longer ([`Invariant::CascadeOwed`]), is a
    /// violation.
    pub child_grace: Duration,
    /// The fleet's retention of finished jobs: a child created longer ago
    /// may have lost its finished parent to retention, so
    /// [`Invariant::ParentMissing`] does not judge it. Default: the
    /// config's `retention.finished_after_ms`.
    pub retention: Duration,
}

impl CheckOptions {
    /// The defaults, the threshold from `config`'s
    /// `worker.maintenance_interval_ms`.
    pub fn from_config(config: &Config) -> CheckOptions {
        CheckOptions {
            stale_after: config.worker.maintenance_interval * 2 + STALE_MARGIN,
            retention: config.retention.finished_after,
            ..CheckOptions::default()
        }
    }

    fn params(&self) -> CheckParams {
        CheckParams {
            stale_after: self.stale_after,
            key_entries: self.key_entries,
            state_rows: self.state_rows,
            count_up_to: self.count_up_to,
            examples: self.examples,
            wait_entries: self.wait_entries,
            child_recheck: crate::store::children::CHILD_RECHECK,
            child_grace: self.child_grace,
            retention: self.retention,
            deadline: self.deadline,
        }
    }
}

impl Default for CheckOptions {
    /// The threshold for the default maintenance interval (1 s): 12 s; the
    /// default retention (24 h).
    fn default() -> CheckOptions {
        CheckOptions {
            stale_after: Duration::from_secs(1) * 2 + STALE_MARGIN,
            deadline: DEFAULT_DEADLINE,
            key_entries: DEFAULT_KEY_ENTRIES,
            state_rows: DEFAULT_STATE_ROWS,
            count_up_to: DEFAULT_COUNT_UP_TO,
            examples: DEFAULT_EXAMPLES,
            wait_entries: DEFAULT_WAIT_ENTRIES,
            child_grace: DEFAULT_CHILD_GRACE,
            retention: DEFAULT_RETENTION,
        }
    }
}

/// The retention of finished jobs a check assumes without a config (the
/// config's default, `retention.finished_after_ms`).
const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// What one shard answered.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardCheck {
    /// Shard name.
    pub shard: String,
    /// One finding per invariant judged, in [`Invariant::ALL`] order; empty
    /// when the shard did not answer. When its schema is not this
    /// binary's, only [`Invariant::ShardMap`] (the job checks assume it).
    pub findings: Vec<Finding>,
    /// Why the shard did not answer (an error or the deadline).
    pub error: Option<String>,
    /// How long it took.
    pub took_ms: u64,
}

impl ShardCheck {
    /// Instances found on this shard, all invariants together.
    pub fn violations(&self) -> u64 {
        self.findings.iter().map(|f| f.broken).sum()
    }

    /// This shard's finding for `invariant`, if it was judged.
    pub fn finding(&self, invariant: Invariant) -> Option<&Finding> {
        self.findings.iter().find(|f| f.invariant == invariant)
    }
}

/// Every shard's answer to one [`Client::check`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    /// The staleness threshold used, in ms.
    pub stale_after_ms: u64,
    /// One entry per configured shard, in list order.
    pub shards: Vec<ShardCheck>,
}

impl CheckReport {
    /// Instances found, all shards and invariants together: 0 when every
    /// invariant holds on every shard that answered.
    pub fn violations(&self) -> u64 {
        self.shards.iter().map(ShardCheck::violations).sum()
    }

    /// Instances of `invariant` found, all shards together.
    pub fn broken(&self, invariant: Invariant) -> u64 {
        self.shards
            .iter()
            .filter_map(|s| s.finding(invariant))
            .map(|f| f.broken)
            .sum()
    }

    /// The invariants broken somewhere, in report order.
    pub fn broken_invariants(&self) -> Vec<Invariant> {
        Invariant::ALL
            .into_iter()
            .filter(|i| self.broken(*i) > 0)
            .collect()
    }

    /// The shards that did not answer.
    pub fn unanswered(&self) -> Vec<&ShardCheck> {
        self.shards.iter().filter(|s| s.error.is_some()).collect()
    }
}

impl Client {
    /// Checks every invariant on every shard ([`Invariant`]): the shard's
    /// schema and shard map as `shardq migrate` and a worker's start check
    /// judge them, then one `REPEATABLE READ READ ONLY` snapshot of its
    /// jobs. All shards at once, each within
    /// `options.deadline`: a shard that fails or does not answer in time is
    /// reported in its entry and never holds the others. Every read is
    /// bounded (see [`CheckOptions`]); nothing is locked or written.
    ///
    /// # Errors
    ///
    /// None: a shard that fails is reported in its own entry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn check(&self, options: &CheckOptions) -> CheckReport {
        let count = self.shards.len();
        let asks = self
            .shards
            .all()
            .iter()
            .map(|shard| check_shard(shard, count, options));
        CheckReport {
            stale_after_ms: u64::try_from(options.stale_after.as_millis()).unwrap_or(u64::MAX),
            shards: futures_util::future::join_all(asks).await,
        }
    }
}

/// One shard's answer, within the deadline.
async fn check_shard(shard: &Shard, count: usize, options: &CheckOptions) -> ShardCheck {
    let started = Instant::now();
    let answer = tokio::time::timeout(options.deadline, judge(shard, count, options)).await;
    let (findings, error) = match answer {
        Ok(Ok(findings)) => (findings, None),
        Ok(Err(error)) => (Vec::new(), Some(error)),
        Err(_) => (
            Vec::new(),
            Some(format!(
                "shard `{}`: no answer within the check deadline of {} ms",
                shard.name,
                options.deadline.as_millis()
            )),
        ),
    };
    if let Some(error) = &error {
        tracing::warn!(shard = %shard.name, %error, "check: the shard did not answer");
    }
    ShardCheck {
        shard: shard.name.clone(),
        findings,
        error,
        took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}

/// The shard-map finding, then (when the schema is this binary's) the job
/// findings. Err: the shard did not answer.
async fn judge(
    shard: &Shard,
    count: usize,
    options: &CheckOptions,
) -> Result<Vec<Finding>, String> {
    let (map, schema_current) = match migrate::run::check_shard(shard, count).await {
        Ok(()) => (shard_map_finding(None), true),
        Err(MigrateError::Shard(e)) => return Err(crate::error_chain::error_chain(&e)),
        Err(
            e @ (MigrateError::ShardMap { .. }
            | MigrateError::ShardMapMissing { .. }
            | MigrateError::MapNotTiled { .. }),
        ) => (
            shard_map_finding(Some(crate::error_chain::error_chain(&e))),
            true,
        ),
        Err(e) => (
            shard_map_finding(Some(crate::error_chain::error_chain(&e))),
            false,
        ),
    };
    let mut findings = if schema_current {
        check::read(shard, &options.params())
            .await
            .map_err(|e| crate::error_chain::error_chain(&e))?
    } else {
        Vec::new()
    };
    findings.push(map);
    Ok(findings)
}

fn shard_map_finding(problem: Option<String>) -> Finding {
    Finding {
        invariant: Invariant::ShardMap,
        broken: u64::from(problem.is_some()),
        capped: false,
        scanned: 1,
        examples: problem
            .map(|detail| Example {
                job: None,
                queue: None,
                ordering_key: None,
                detail,
            })
            .into_iter()
            .collect(),
    }
}
