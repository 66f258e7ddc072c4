//! The exposition of one worker's counters, gauges and latency histograms.

use super::encoding::family;
use crate::telemetry::histogram::LatencyHistogram;
use crate::telemetry::{OutcomeCounters, ShardCounters, Stats, TargetCounters};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// A worker's metrics in Prometheus form, read live from its counters (get
/// it with [`crate::Worker::metrics`] before running the worker). Cheap to
/// clone; every scrape reads the counters anew.
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    stats: Arc<Stats>,
    /// Shard names, by shard index.
    shards: Arc<[String]>,
}

impl WorkerMetrics {
    pub(crate) fn new(stats: Arc<Stats>, shards: Vec<String>) -> Self {
        WorkerMetrics {
            stats,
            shards: shards.into(),
        }
    }

    /// The metrics as Prometheus text (serve it with [`super::CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// Adds these metrics to `registry`, for an embedder that exposes its
    /// own metrics from one registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// Every (shard, queue) label pair with its counters, shard-major.
    fn targets(&self) -> impl Iterator<Item = ([(&str, &str); 2], &TargetCounters)> {
        let queues = &self.stats.queues;
        self.stats.targets.iter().enumerate().map(move |(i, t)| {
            let shard = self.shards[i / queues.len()].as_str();
            let queue = queues[i % queues.len()].as_str();
            ([("shard", shard), ("queue", queue)], t)
        })
    }

    fn per_target(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        counter: fn(&TargetCounters) -> &AtomicU64,
    ) -> Result<(), std::fmt::Error> {
        let samples = self
            .targets()
            .map(|(labels, t)| (labels, ConstCounter::new(counter(t).load(Relaxed))));
        family(encoder, name, help, MetricType::Counter, samples)
    }

    fn per_target_histogram(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        histogram: fn(&TargetCounters) -> &LatencyHistogram,
    ) -> Result<(), std::fmt::Error> {
        let samples = self.targets().map(|(labels, t)| (labels, histogram(t)));
        family(encoder, name, help, MetricType::Histogram, samples)
    }

    fn per_shard<'s, M: prometheus_client::encoding::EncodeMetric + 's>(
        &'s self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        metric_type: MetricType,
        sample: impl Fn(&'s ShardCounters) -> M,
    ) -> Result<(), std::fmt::Error> {
        let samples = self
            .stats
            .shards
            .iter()
            .zip(self.shards.iter())
            .map(|(counters, shard)| ([("shard", shard.as_str())], sample(counters)));
        family(encoder, name, help, metric_type, samples)
    }
}

/// Picks one counter of a shard's outcomes.
type OutcomeCounter = fn(&OutcomeCounters) -> &AtomicU64;

/// Outcome label values and their counters, in the order they are exposed.
const OUTCOMES: [(&str, OutcomeCounter); 6] = [
    ("succeeded", |o| &o.succeeded),
    ("retrying", |o| &o.retrying),
    ("dead", |o| &o.dead),
    ("cancelled", |o| &o.cancelled),
    ("released", |o| &o.released),
    ("fenced", |o| &o.fenced),
];

fn gauge(value: &AtomicI64) -> ConstGauge<i64> {
    ConstGauge::new(value.load(Relaxed))
}

impl Collector for WorkerMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        self.per_target(
            e,
            "shardq_worker_claims",
            "Claim statements that returned jobs",
            |t| &t.claims,
        )?;
        self.per_target(e, "shardq_worker_claimed_jobs", "Jobs claimed", |t| {
            &t.claimed
        })?;
        self.per_target(
            e,
            "shardq_worker_claim_busy",
            "Claims answered busy: every dequeue slot was taken (lock misses)",
            |t| &t.busy,
        )?;
        self.per_target(
            e,
            "shardq_worker_claim_empty",
            "Claims that found no ready job",
            |t| &t.empty,
        )?;
        self.per_target(
            e,
            "shardq_worker_claim_errors",
            "Claims that failed (shard unreachable, statement error or deadline)",
            |t| &t.errors,
        )?;
        let slots = self
            .targets()
            .map(|(labels, t)| (labels, ConstGauge::new(t.slots.load(Relaxed) as i64)));
        family(
            e,
            "shardq_worker_dequeue_slots",
            "K: dequeue slots this process's claims try on the shard for the queue now (adaptive; 0 before the first claim or ungated)",
            MetricType::Gauge,
            slots,
        )?;
        let outcomes =
            self.stats
                .shards
                .iter()
                .zip(self.shards.iter())
                .flat_map(|(counters, shard)| {
                    OUTCOMES.iter().map(move |(outcome, counter)| {
                        let labels = [("shard", shard.as_str()), ("outcome", *outcome)];
                        (
                            labels,
                            ConstCounter::new(counter(&counters.outcomes).load(Relaxed)),
                        )
                    })
                });
        family(
            e,
            "shardq_worker_outcomes",
            "Job outcomes written by this worker, each completion once",
            MetricType::Counter,
            outcomes,
        )?;
        self.per_shard(
            e,
            "shardq_worker_recovered_jobs",
            "Expired leases (of any worker) that this process's maintenance recovered",
            MetricType::Counter,
            |s| ConstCounter::new(s.outcomes.recovered.load(Relaxed)),
        )?;
        self.per_shard(
            e,
            "shardq_worker_abandoned_handlers",
            "Handlers abandoned after worker.handler_timeout_ms (their attempts also count as retrying or dead)",
            MetricType::Counter,
            |s| ConstCounter::new(s.outcomes.abandoned.load(Relaxed)),
        )?;
        self.per_shard(
            e,
            "shardq_worker_completion_statements",
            "Statements that wrote completions",
            MetricType::Counter,
            |s| ConstCounter::new(s.outcomes.statements.load(Relaxed)),
        )?;
        let metrics = &self.stats;
        for (name, help, value) in [
            (
                "shardq_worker_buffered_jobs",
                "Jobs claimed by this process and not yet started",
                &metrics.buffered,
            ),
            (
                "shardq_worker_running_jobs",
                "Handlers running now",
                &metrics.running,
            ),
        ] {
            let metric = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            prometheus_client::encoding::EncodeMetric::encode(&gauge(value), metric)?;
        }
        let unwritten = self.stats.unwritten.load(Relaxed) as i64;
        let metric = e.encode_descriptor(
            "shardq_worker_unwritten_outcomes",
            "Outcomes at the completer not yet written (at most twice worker.buffer_jobs)",
            None,
            MetricType::Gauge,
        )?;
        prometheus_client::encoding::EncodeMetric::encode(&ConstGauge::new(unwritten), metric)?;
        self.per_target_histogram(
            e,
            "shardq_worker_pickup_latency_seconds",
            "Enqueue (the shard's created_at) to handler start",
            |t| &t.pickup,
        )?;
        self.per_target_histogram(
            e,
            "shardq_worker_claim_duration_seconds",
            "One claim statement, busy and empty answers included",
            |t| &t.claim_duration,
        )?;
        self.per_shard(
            e,
            "shardq_worker_completion_lag_seconds",
            "Handler end to its outcome written",
            MetricType::Histogram,
            |s| &s.completion_lag,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::jobs::{Claim, Written};
    use std::time::Duration;

    fn metrics() -> WorkerMetrics {
        let stats = Arc::new(Stats::for_queues(2, vec!["a".into(), "b".into()]));
        WorkerMetrics::new(stats, vec!["s0".into(), "s1".into()])
    }

    #[test]
    fn claims_are_exposed_by_shard_and_queue() {
        let m = metrics();
        // Target 3 is shard 1, queue b.
        m.stats
            .record_claim(1, 3, &Ok(Claim::Busy), Duration::from_millis(2));
        m.stats
            .record_claim(0, 0, &Ok(Claim::Empty), Duration::from_millis(2));
        let text = m.encode();
        assert!(text.contains("shardq_worker_claim_busy_total{shard=\"s1\",queue=\"b\"} 1\n"));
        assert!(text.contains("shardq_worker_claim_busy_total{shard=\"s0\",queue=\"a\"} 0\n"));
        assert!(text.contains("shardq_worker_claim_empty_total{shard=\"s0\",queue=\"a\"} 1\n"));
        assert!(text.contains(
            "shardq_worker_claim_duration_seconds_bucket{shard=\"s1\",queue=\"b\",le=\"0.0025\"} 1\n"
        ));
        assert!(text.contains(
            "shardq_worker_claim_duration_seconds_bucket{shard=\"s1\",queue=\"b\",le=\"0.001\"} 0\n"
        ));
        assert!(text.contains("# TYPE shardq_worker_claim_duration_seconds histogram\n"));
    }

    #[test]
    fn outcomes_are_exposed_by_shard_each_once() {
        let m = metrics();
        let written = Written {
            succeeded: 5,
            dead: 2,
            fenced: 1,
            ..Written::default()
        };
        m.stats.record_written(1, &written, []);
        m.stats.record_recovered(0, 4);
        let text = m.encode();
        for line in [
            "shardq_worker_outcomes_total{shard=\"s1\",outcome=\"succeeded\"} 5\n",
            "shardq_worker_outcomes_total{shard=\"s1\",outcome=\"dead\"} 2\n",
            "shardq_worker_outcomes_total{shard=\"s1\",outcome=\"fenced\"} 1\n",
            "shardq_worker_outcomes_total{shard=\"s0\",outcome=\"succeeded\"} 0\n",
            "shardq_worker_recovered_jobs_total{shard=\"s0\"} 4\n",
            "shardq_worker_completion_statements_total{shard=\"s1\"} 1\n",
            "shardq_worker_running_jobs 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }
}
