//! The invariant sampler: `Client::check` (what `shardq check` runs) every
//! second during the run. A shard that does not answer (a frozen one misses
//! its deadline) is counted apart, never as a violation. Staleness (a lease
//! not recovered, a due job not promoted) on a shard under a fault is what the
//! fault does, not a broken promise: it is counted as excused. Any other
//! violation in any sample fails the run.

use super::super::faults::Event;
use super::progress::disturbed;
use serde::Serialize;
use shardq::client::{CheckOptions, CheckReport, Invariant};
use shardq::Client;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the invariants are sampled.
const EVERY: Duration = Duration::from_secs(1);

/// Longest wait for one shard's answer: a frozen or silent shard costs a
/// sample at most this much.
const SHARD_DEADLINE: Duration = Duration::from_secs(2);

/// Evidence kept: the first this-many violations.
const EVIDENCE: usize = 5;

/// The invariants a fault on the shard breaks by itself for a while.
const STALENESS: [Invariant; 2] = [Invariant::LeaseNotRecovered, Invariant::DueNotPromoted];

/// One broken invariant on one shard in one sample.
#[derive(Debug, Clone, Serialize)]
pub struct Hit {
    /// Seconds since the fault phase began.
    pub at_s: f64,
    /// Shard index.
    pub shard: usize,
    /// Which invariant.
    pub invariant: &'static str,
    /// Instances found.
    pub broken: u64,
    /// An example, as the check wrote it.
    pub example: Option<String>,
}

/// What the samples found.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Samples {
    /// Samples taken (each reads every shard at once).
    pub taken: u64,
    /// Shard answers missing (an error or the deadline), over all samples.
    pub unanswered: u64,
    /// The first shard that did not answer, and why.
    pub first_unanswered: Option<String>,
    /// The staleness threshold the check judged by, in ms.
    pub stale_after_ms: u64,
    /// Every broken invariant seen, in sample order.
    pub hits: Vec<Hit>,
    /// Violations (instances summed over samples: one seen twice counts twice).
    pub violations: u64,
    /// Staleness on a shard under a fault (or just after one), not counted.
    pub excused: u64,
    /// Violations per invariant.
    pub by_invariant: BTreeMap<String, u64>,
    /// The first violations, described.
    pub first: Vec<String>,
}

/// Samples `client`'s invariants every second from `started` until `stop`;
/// `options` as a worker of `config` would be judged.
pub async fn run(
    client: Client,
    config: shardq::Config,
    started: Instant,
    stop: CancellationToken,
) -> Samples {
    let options = CheckOptions {
        deadline: SHARD_DEADLINE,
        ..CheckOptions::from_config(&config)
    };
    let mut samples = Samples {
        stale_after_ms: u64::try_from(options.stale_after.as_millis()).unwrap_or(u64::MAX),
        ..Samples::default()
    };
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return samples,
            _ = tick.tick() => {}
        }
        let at_s = started.elapsed().as_secs_f64();
        let report = client.check(&options).await;
        samples.record(at_s, &report);
    }
}

impl Samples {
    fn record(&mut self, at_s: f64, report: &CheckReport) {
        self.taken += 1;
        for (shard, answer) in report.shards.iter().enumerate() {
            if let Some(err) = &answer.error {
                self.unanswered += 1;
                self.first_unanswered
                    .get_or_insert_with(|| format!("at {at_s:.1} s {}: {err}", answer.shard));
            }
            for finding in answer.findings.iter().filter(|f| f.broken > 0) {
                let hit = Hit {
                    at_s,
                    shard,
                    invariant: finding.invariant.as_str(),
                    broken: finding.broken,
                    example: finding.examples.first().map(|e| format!("{e:?}")),
                };
                tracing::warn!(?hit, "invariant broken in a sample");
                self.hits.push(hit);
            }
        }
    }

    /// Judges the hits against the faults: staleness on a disturbed shard
    /// is excused, everything else is a violation.
    pub fn judge(&mut self, events: &[Event]) {
        for hit in &self.hits {
            let stale = STALENESS.iter().any(|i| i.as_str() == hit.invariant);
            if stale && disturbed(events, hit.shard, hit.at_s) {
                self.excused += hit.broken;
                continue;
            }
            self.violations += hit.broken;
            *self
                .by_invariant
                .entry(hit.invariant.to_string())
                .or_default() += hit.broken;
            if self.first.len() < EVIDENCE {
                self.first.push(format!(
                    "at {:.1} s shard {}: {} x{} ({})",
                    hit.at_s,
                    hit.shard,
                    hit.invariant,
                    hit.broken,
                    hit.example.as_deref().unwrap_or("no example")
                ));
            }
        }
    }
}
