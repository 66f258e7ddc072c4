//! The probe of a suspect shard: detached from the producers, one at a time.

use super::producers::Producers;
use super::rotation::jitter;
use super::shard_health::PROBE_INTERVAL;
use crate::store::jobs;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// The one probe of suspect shard `shard`: every [`PROBE_INTERVAL`], one
/// trivial statement with a deadline of its own, until an answer comes
/// within the shard's budget (or shutdown).
pub(crate) async fn probe(p: Arc<Producers>, shard: usize, shutdown: CancellationToken) {
    let mut rng = StdRng::from_entropy();
    let target = p.run.shards.get(shard);
    loop {
        let pause = jitter(&mut rng, PROBE_INTERVAL.min, PROBE_INTERVAL.max);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        let started = Instant::now();
        let answer = tokio::time::timeout(p.run.health.probe_deadline(), jobs::probe(target)).await;
        let took = matches!(answer, Ok(Ok(()))).then(|| started.elapsed());
        if p.run.health.probed(shard, took) {
            tracing::info!(
                shard = %target.name,
                answered_ms = took.unwrap_or_default().as_millis() as u64,
                "shard answers again; producers use it"
            );
            return;
        }
    }
}
