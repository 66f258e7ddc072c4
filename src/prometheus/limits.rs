//! The fleet-wide queue limits (`shardq limit`) as Prometheus gauges, per
//! limited queue: the concurrency and the permits the workers hold now,
//! the rate in starts per second, and the limits each of its groups has. Jobs waiting on a limit are the queue's
//! ready ones (`shardq_queue_jobs{state="queued"}`).

use super::encoding::family;
use crate::client::limits::{QueueLimit, StartRate};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

fn per_second(rate: StartRate) -> f64 {
    f64::from(rate.count) / rate.per.as_secs_f64().max(1e-3)
}

/// A collector over one read of the limits ([`crate::Client::queue_limits`]).
#[derive(Debug)]
pub struct LimitsCollector {
    limits: Vec<QueueLimit>,
}

impl LimitsCollector {
    /// The gauges of `limits`.
    pub fn new(limits: Vec<QueueLimit>) -> LimitsCollector {
        LimitsCollector { limits }
    }
}

impl Collector for LimitsCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        family(
            e,
            "shardq_queue_limit_concurrency",
            "A queue's fleet-wide concurrency limit (`shardq limit`)",
            MetricType::Gauge,
            self.limits.iter().filter_map(|l| {
                let n = l.limits.concurrency?;
                Some(([("queue", l.queue.as_str())], ConstGauge::new(i64::from(n))))
            }),
        )?;
        family(
            e,
            "shardq_queue_limit_permits_in_use",
            "Permits of a concurrency-limited queue the workers hold now (claimed jobs, \
             and room for their next claims); absent while the limits' home shard does not answer",
            MetricType::Gauge,
            self.limits.iter().filter_map(|l| {
                l.limits.concurrency?;
                let n = l.in_use?;
                Some(([("queue", l.queue.as_str())], ConstGauge::new(n)))
            }),
        )?;
        family(
            e,
            "shardq_queue_limit_rate_per_second",
            "A queue's fleet-wide rate limit, in starts per second",
            MetricType::Gauge,
            self.limits.iter().filter_map(|l| {
                let per_s = per_second(l.limits.rate?);
                Some(([("queue", l.queue.as_str())], ConstGauge::new(per_s)))
            }),
        )?;
        family(
            e,
            "shardq_queue_limit_group_concurrency",
            "The concurrency limit each group of a queue has (`limit set --group-concurrency`)",
            MetricType::Gauge,
            self.limits.iter().filter_map(|l| {
                let n = l.limits.group_concurrency?;
                Some(([("queue", l.queue.as_str())], ConstGauge::new(i64::from(n))))
            }),
        )?;
        family(
            e,
            "shardq_queue_limit_group_rate_per_second",
            "The rate limit each group of a queue has, in starts per second",
            MetricType::Gauge,
            self.limits.iter().filter_map(|l| {
                let per_s = per_second(l.limits.group_rate?);
                Some(([("queue", l.queue.as_str())], ConstGauge::new(per_s)))
            }),
        )
    }
}
