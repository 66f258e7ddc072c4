//! The wakes that children owe parents on other shards, as Prometheus
//! gauges, per source and destination shard: a relay on each child's shard
//! delivers them (`worker::wake_relay`), so a count or an age that keeps
//! growing names a destination that does not take them (down, frozen) or
//! a fleet that runs no worker. Read per scrape by the exporter (`shardq
//! metrics`); docs/operations.md says what to alert on.

use super::encoding::family;
use crate::shards::ShardSet;
use crate::store::children_elsewhere::{self, OwedToShard};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::time::Duration;

/// What one shard answered in one scrape.
#[derive(Debug, Clone)]
pub struct ShardOwed {
    /// The children's shard's name.
    pub shard: String,
    /// What its children owe, by destination shard's name, or `None` when
    /// it failed or did not answer within the deadline.
    pub owed: Option<Vec<(String, OwedToShard)>>,
}

/// Reads every shard at once, each within `deadline`: a shard that fails
/// or does not answer in time has no gauges that scrape; it never delays
/// the others.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn read_all(shards: &ShardSet, deadline: Duration) -> Vec<ShardOwed> {
    let one = |index: usize| async move {
        let read = children_elsewhere::owed_summary(shards, index);
        let owed = match tokio::time::timeout(deadline, read).await {
            Ok(Ok(owed)) => Some(
                owed.into_iter()
                    .map(|o| (shards.get(o.to).name.clone(), o))
                    .collect(),
            ),
            Ok(Err(err)) => {
                let error = crate::error_chain::error_chain(&err);
                tracing::warn!(shard = %shards.get(index).name, %error, "cross-shard wakes scrape failed");
                None
            }
            Err(_) => None,
        };
        ShardOwed {
            shard: shards.get(index).name.clone(),
            owed,
        }
    };
    futures_util::future::join_all((0..shards.len()).map(one)).await
}

/// A collector over one scrape's answers ([`read_all`]).
#[derive(Debug)]
pub struct Owed {
    answers: Vec<ShardOwed>,
}

impl Owed {
    /// The gauges of `answers`.
    pub fn new(answers: Vec<ShardOwed>) -> Owed {
        Owed { answers }
    }

    /// (from, to, owed) of the shards that answered.
    fn owed(&self) -> impl Iterator<Item = (&str, &str, &OwedToShard)> {
        self.answers.iter().flat_map(|a| {
            a.owed
                .iter()
                .flatten()
                .map(move |(to, o)| (a.shard.as_str(), to.as_str(), o))
        })
    }
}

impl Collector for Owed {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        family(
            e,
            "shardq_cross_shard_wakes_pending",
            "Wakes that finished child workflows on shard `from` owe their parents on shard `to`, \
             not delivered yet (the relay of one worker delivers them within a second, another within seconds if it stops)",
            MetricType::Gauge,
            self.owed()
                .map(|(from, to, o)| ([("from", from), ("to", to)], ConstGauge::new(o.pending))),
        )?;
        family(
            e,
            "shardq_cross_shard_wake_oldest_seconds",
            "Seconds since the child behind the oldest undelivered wake from shard `from` to shard \
             `to` finished (the children's shard's clock)",
            MetricType::Gauge,
            self.owed().map(|(from, to, o)| {
                ([("from", from), ("to", to)], ConstGauge::new(o.oldest_s))
            }),
        )
    }
}
