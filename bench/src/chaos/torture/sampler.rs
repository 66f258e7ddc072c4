//! The invariant sampler: `shardq check` every second during the run. Each
//! sample reads every shard; a sample that fails (a frozen shard misses its
//! deadline) is counted apart, never as a violation. Any violation in any
//! sample fails the run.

use serde::Serialize;
use shardq::Client;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the invariants are sampled.
const EVERY: Duration = Duration::from_secs(1);

/// Deadline of one sample over every shard.
const SAMPLE_DEADLINE: Duration = Duration::from_secs(5);

/// What the samples found.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Samples {
    /// Samples that read every shard.
    pub taken: u64,
    /// Samples that failed or missed their deadline.
    pub failed: u64,
    /// Violations over all samples (one broken invariant seen in two samples counts twice).
    pub violations: u64,
    /// Violations per invariant.
    pub by_invariant: BTreeMap<String, u64>,
    /// The first samples with a violation: when, and what.
    pub first: Vec<String>,
    /// The first failure of a sample.
    pub first_error: Option<String>,
}

/// Evidence kept: the first this-many samples with a violation.
const EVIDENCE: usize = 5;

/// Samples `client`'s invariants every second from `started` until `stop`.
pub async fn run(client: Client, started: Instant, stop: CancellationToken) -> Samples {
    let mut samples = Samples::default();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return samples,
            _ = tick.tick() => {}
        }
        let at_s = started.elapsed().as_secs_f64();
        match tokio::time::timeout(SAMPLE_DEADLINE, probe(&client)).await {
            Ok(Ok(broken)) => {
                samples.taken += 1;
                let found: u64 = broken.iter().map(|(_, n)| n).sum();
                if found == 0 {
                    continue;
                }
                samples.violations += found;
                for (name, n) in &broken {
                    *samples.by_invariant.entry(name.clone()).or_default() += n;
                }
                tracing::error!(at_s = format!("{at_s:.1}"), ?broken, "invariant violated");
                if samples.first.len() < EVIDENCE {
                    samples.first.push(format!("at {at_s:.1} s: {broken:?}"));
                }
            }
            Ok(Err(err)) => {
                samples.failed += 1;
                samples
                    .first_error
                    .get_or_insert_with(|| format!("at {at_s:.1} s: {err:#}"));
            }
            Err(_) => {
                samples.failed += 1;
                samples.first_error.get_or_insert_with(|| {
                    format!("at {at_s:.1} s: no answer within {SAMPLE_DEADLINE:?}")
                });
            }
        }
    }
}

/// One sample: each broken invariant with how many rows break it.
///
/// Interim, until `Client::check()` lands: the invariants that need no
/// library support, read in one statement (one snapshot) per shard.
async fn probe(client: &Client) -> anyhow::Result<Vec<(String, u64)>> {
    let mut broken = BTreeMap::<String, u64>::new();
    for shard in client.shards().all() {
        let db = shard.client().await?;
        let row = db
            .query_one(super::super::sql::INTERIM_INVARIANTS, &[])
            .await
            .map_err(|e| shard.query_error(e))?;
        for (index, name) in super::super::sql::INTERIM_INVARIANT_NAMES
            .iter()
            .enumerate()
        {
            let n: i64 = row.get(index);
            if n > 0 {
                *broken.entry((*name).to_string()).or_default() += n as u64;
            }
        }
    }
    Ok(broken.into_iter().collect())
}
