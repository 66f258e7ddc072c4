//! What holds each shard's xmin horizon back, as Prometheus gauges: while a
//! long transaction (a report, `pg_dump`, a session idle in transaction, a
//! replication slot, a standby's feedback, a forgotten prepared
//! transaction) holds it, vacuum removes no dead row version and they pile
//! up in the queue table. Read per scrape by the exporter (`shardq
//! metrics`) beside the backlog; docs/operations.md says what to alert on.

use super::encoding::family;
use crate::shards::{Shard, ShardSet};
use crate::store::horizon::{self, Horizon, QUEUE_TABLE};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::time::Duration;

/// What one shard answered in one scrape.
#[derive(Debug, Clone)]
pub struct ShardHorizon {
    /// Shard name.
    pub shard: String,
    /// What holds its horizon, or why that is unknown (an error or the
    /// deadline).
    pub horizon: Result<Horizon, String>,
}

/// Reads every shard's horizon at once, each within `deadline`: a shard
/// that fails or does not answer in time has no horizon gauges that scrape
/// (`shardq_xmin_horizon_up` 0); it never delays the others.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn read_all(shards: &ShardSet, deadline: Duration) -> Vec<ShardHorizon> {
    futures_util::future::join_all(shards.all().iter().map(|s| read_one(s, deadline))).await
}

async fn read_one(shard: &Shard, deadline: Duration) -> ShardHorizon {
    let horizon = match tokio::time::timeout(deadline, horizon::read(shard)).await {
        Ok(Ok(horizon)) => Ok(horizon),
        Ok(Err(err)) => Err(crate::error_chain::error_chain(&err)),
        Err(_) => Err(format!(
            "no answer within the scrape deadline of {} ms",
            deadline.as_millis()
        )),
    };
    if let Err(error) = &horizon {
        tracing::warn!(shard = %shard.name, %error, "xmin horizon scrape failed");
    }
    ShardHorizon {
        shard: shard.name.clone(),
        horizon,
    }
}

/// A collector over one scrape's answers ([`read_all`]).
#[derive(Debug)]
pub struct Horizons {
    answers: Vec<ShardHorizon>,
}

impl Horizons {
    /// The gauges of `answers`.
    pub fn new(answers: Vec<ShardHorizon>) -> Horizons {
        Horizons { answers }
    }

    /// The shards that answered, with their horizon.
    fn answered(&self) -> impl Iterator<Item = (&str, &Horizon)> {
        self.answers
            .iter()
            .filter_map(|a| Some((a.shard.as_str(), a.horizon.as_ref().ok()?)))
    }
}

impl Collector for Horizons {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        family(
            e,
            "shardq_xmin_horizon_up",
            "1 when the shard answered this scrape's read of its xmin horizon in time, else 0",
            MetricType::Gauge,
            self.answers.iter().map(|a| {
                let up = i64::from(a.horizon.is_ok());
                ([("shard", a.shard.as_str())], ConstGauge::new(up))
            }),
        )?;
        family(
            e,
            "shardq_oldest_xmin_age_seconds",
            "Seconds since the oldest transaction holding the shard's xmin horizon began, by \
             holder (backend: a session of the shard's database, this exporter's excluded; \
             prepared: a prepared transaction); 0 when none. Vacuum removes no dead row \
             version newer than it",
            MetricType::Gauge,
            self.answered().flat_map(|(shard, h)| {
                h.held.iter().filter_map(move |held| {
                    let labels = [("shard", shard), ("holder", held.holder.as_str())];
                    Some((labels, ConstGauge::new(held.seconds?)))
                })
            }),
        )?;
        family(
            e,
            "shardq_xmin_horizon_age_xids",
            "How many transaction ids ago the oldest xmin holding the shard's horizon was, by \
             holder (backend, standby: hot_standby_feedback through a walsender, \
             replication_slot: a slot's xmin, prepared); 0 when none",
            MetricType::Gauge,
            self.answered().flat_map(|(shard, h)| {
                h.held.iter().map(move |held| {
                    let labels = [("shard", shard), ("holder", held.holder.as_str())];
                    (labels, ConstGauge::new(held.xids))
                })
            }),
        )?;
        family(
            e,
            "shardq_replication_slot_catalog_xmin_age_xids",
            "How many transaction ids ago the oldest replication slot's catalog_xmin was: it \
             holds back vacuum of the system catalogs only, not of the queue table",
            MetricType::Gauge,
            self.answered()
                .map(|(shard, h)| ([("shard", shard)], ConstGauge::new(h.slot_catalog_xids))),
        )?;
        family(
            e,
            "shardq_lease_floor_age_seconds",
            "Seconds since the shard's lease floor, by its clock: no running job's lease ends \
             before it, and reads of the running jobs start there. A few seconds while workers \
             run; it grows while a transaction that took an id stays open on the server, while \
             an expired lease is not recovered, or while no worker runs upkeep. Absent before \
             the first floor",
            MetricType::Gauge,
            self.answered().filter_map(|(shard, h)| {
                Some(([("shard", shard)], ConstGauge::new(h.lease_floor_age_s?)))
            }),
        )?;
        family(
            e,
            "shardq_xmin_horizon_hidden_sessions",
            "Sessions of the shard's database whose transaction the exporter's role may not \
             see (grant it pg_read_all_stats): they may hold the horizon unseen",
            MetricType::Gauge,
            self.answered()
                .map(|(shard, h)| ([("shard", shard)], ConstGauge::new(h.hidden_sessions))),
        )?;
        // The table's statistics: absent until the collector has some.
        let tables = || {
            self.answered()
                .filter_map(|(shard, h)| Some((shard, h.queue_table?)))
        };
        family(
            e,
            "shardq_queue_table_dead_rows",
            "Dead row versions in the queue table not yet removed by vacuum (n_dead_tup: the \
             statistics collector's estimate, updated a while after each write)",
            MetricType::Gauge,
            tables().map(|(shard, t)| {
                let labels = [("shard", shard), ("table", QUEUE_TABLE)];
                (labels, ConstGauge::new(t.dead_rows))
            }),
        )?;
        family(
            e,
            "shardq_queue_table_live_rows",
            "Live rows in the queue table (n_live_tup, an estimate)",
            MetricType::Gauge,
            tables().map(|(shard, t)| {
                let labels = [("shard", shard), ("table", QUEUE_TABLE)];
                (labels, ConstGauge::new(t.live_rows))
            }),
        )?;
        family(
            e,
            "shardq_queue_table_last_autovacuum_age_seconds",
            "Seconds since autovacuum last finished on the queue table; absent when it never has",
            MetricType::Gauge,
            tables().filter_map(|(shard, t)| {
                let labels = [("shard", shard), ("table", QUEUE_TABLE)];
                Some((labels, ConstGauge::new(t.last_autovacuum_s?)))
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::horizon::{HeldBack, Holder, TableVacuum};
    use prometheus_client::registry::Registry;

    fn encode(answers: Vec<ShardHorizon>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Horizons::new(answers)));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn each_holder_is_a_series_and_a_shard_that_failed_has_none() {
        let held = Holder::ALL
            .iter()
            .map(|&holder| HeldBack {
                holder,
                seconds: (holder == Holder::Backend).then_some(42.5),
                xids: if holder == Holder::ReplicationSlot {
                    7
                } else {
                    0
                },
            })
            .collect();
        let horizon = Horizon {
            held,
            oldest_backend_pid: Some(99),
            slot_catalog_xids: 3,
            hidden_sessions: 1,
            queue_table: Some(TableVacuum {
                dead_rows: 1000,
                live_rows: 10,
                last_autovacuum_s: None,
            }),
            lease_floor_age_s: Some(2.5),
        };
        let no_floor = Horizon {
            lease_floor_age_s: None,
            ..horizon.clone()
        };
        let text = encode(vec![
            ShardHorizon {
                shard: "s0".into(),
                horizon: Ok(horizon),
            },
            ShardHorizon {
                shard: "s2".into(),
                horizon: Ok(no_floor),
            },
            ShardHorizon {
                shard: "s1".into(),
                horizon: Err("down".into()),
            },
        ]);
        for line in [
            "shardq_xmin_horizon_up{shard=\"s0\"} 1\n",
            "shardq_xmin_horizon_up{shard=\"s1\"} 0\n",
            "shardq_oldest_xmin_age_seconds{shard=\"s0\",holder=\"backend\"} 42.5\n",
            "shardq_xmin_horizon_age_xids{shard=\"s0\",holder=\"replication_slot\"} 7\n",
            "shardq_replication_slot_catalog_xmin_age_xids{shard=\"s0\"} 3\n",
            "shardq_xmin_horizon_hidden_sessions{shard=\"s0\"} 1\n",
            "shardq_queue_table_dead_rows{shard=\"s0\",table=\"workflow_status\"} 1000\n",
            "shardq_lease_floor_age_seconds{shard=\"s0\"} 2.5\n",
            "shardq_xmin_horizon_up{shard=\"s2\"} 1\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(
            !text.contains("shardq_oldest_xmin_age_seconds{shard=\"s0\",holder=\"standby\"}"),
            "a holder without a start time has no age in seconds:\n{text}"
        );
        assert!(!text.contains("shardq_oldest_xmin_age_seconds{shard=\"s1\""));
        assert!(!text.contains("shardq_queue_table_last_autovacuum_age_seconds{"));
        assert!(
            !text.contains("shardq_lease_floor_age_seconds{shard=\"s2\"}"),
            "a shard without a floor yet has no floor age:\n{text}"
        );
    }
}
