//! The cancel cascades each shard owes, as Prometheus gauges: a cancel
//! records one, and its canceller or the workers' maintenance pass pays it
//! once the cascade reached every child, within seconds. A count or an age
//! that keeps growing names a child's shard that does not answer, a
//! reshard stopped midway, or a shard no worker runs against. Read per
//! scrape by the exporter (`shardq metrics`); `shardq check` reports one
//! past its grace (`cascade_owed`).

use super::encoding::family;
use crate::shards::ShardSet;
use crate::store::cascade_debts::{self, OwedSummary};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::time::Duration;

/// What one shard answered in one scrape: its name, and what it owes
/// (`None` when it failed or did not answer within the deadline).
pub type ShardCascades = (String, Option<OwedSummary>);

/// Reads every shard at once, each within `deadline`: a shard that fails
/// or does not answer in time has no gauges that scrape; it never delays
/// the others.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn read_all(shards: &ShardSet, deadline: Duration) -> Vec<ShardCascades> {
    let one = |index: usize| async move {
        let shard = shards.get(index);
        let owed = match tokio::time::timeout(deadline, cascade_debts::summary(shard)).await {
            Ok(Ok(owed)) => Some(owed),
            Ok(Err(err)) => {
                let error = crate::error_chain::error_chain(&err);
                tracing::warn!(shard = %shard.name, %error, "cancel cascades scrape failed");
                None
            }
            Err(_) => None,
        };
        (shard.name.clone(), owed)
    };
    futures_util::future::join_all((0..shards.len()).map(one)).await
}

/// A collector over one scrape's answers ([`read_all`]).
#[derive(Debug)]
pub struct Cascades {
    answers: Vec<ShardCascades>,
}

impl Cascades {
    /// The gauges of `answers`.
    pub fn new(answers: Vec<ShardCascades>) -> Cascades {
        Cascades { answers }
    }

    /// (shard, owed) of the shards that answered.
    fn owed(&self) -> impl Iterator<Item = (&str, &OwedSummary)> {
        self.answers
            .iter()
            .filter_map(|(shard, owed)| owed.as_ref().map(|o| (shard.as_str(), o)))
    }
}

impl Collector for Cascades {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        family(
            e,
            "shardq_cancel_cascades_owed",
            "Cancel cascades that workflows cancelled on `shard` owe their children, on any \
             shard, not yet run to their end (their canceller or the workers' pass pays each \
             within seconds)",
            MetricType::Gauge,
            self.owed()
                .map(|(shard, o)| ([("shard", shard)], ConstGauge::new(o.owed))),
        )?;
        family(
            e,
            "shardq_cancel_cascade_oldest_seconds",
            "Seconds since the oldest cancel cascade owed on `shard` was first owed (the \
             shard's clock; 0 when none)",
            MetricType::Gauge,
            self.owed()
                .map(|(shard, o)| ([("shard", shard)], ConstGauge::new(o.oldest_s))),
        )
    }
}
