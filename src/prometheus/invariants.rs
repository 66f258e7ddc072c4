//! The invariants `shardq check` verifies, as Prometheus gauges: one
//! series per invariant and shard (`shardq_invariant_violations`), 0 while
//! it holds, so an alert is `shardq_invariant_violations > 0`; and whether
//! each shard answered the check (`shardq_invariant_check_up`), since a
//! shard that did not answer has no violation series that scrape.

use super::encoding::family;
use crate::client::check::CheckReport;
use crate::store::check::Invariant;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// A collector over one [`CheckReport`]; register it next to the backlog
/// ([`super::backlog::encode_with_check`] does).
#[derive(Debug)]
pub struct Invariants {
    report: CheckReport,
}

impl Invariants {
    /// The gauges of `report`.
    pub fn new(report: CheckReport) -> Invariants {
        Invariants { report }
    }
}

impl Collector for Invariants {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        family(
            e,
            "shardq_invariant_check_up",
            "1 when the shard answered this scrape's invariant check within its deadline, else 0",
            MetricType::Gauge,
            self.report.shards.iter().map(|s| {
                (
                    [("shard", s.shard.as_str())],
                    ConstGauge::new(i64::from(s.error.is_none())),
                )
            }),
        )?;
        family(
            e,
            "shardq_invariant_violations",
            "Instances of a broken invariant found on the shard (keys or jobs, see `shardq check`); \
             0 while it holds; absent while the shard does not answer",
            MetricType::Gauge,
            self.report.shards.iter().flat_map(|s| {
                Invariant::ALL.into_iter().filter_map(move |invariant| {
                    let finding = s.finding(invariant)?;
                    let count = i64::try_from(finding.broken).unwrap_or(i64::MAX);
                    Some((
                        [
                            ("invariant", invariant.as_str()),
                            ("shard", s.shard.as_str()),
                        ],
                        ConstGauge::new(count),
                    ))
                })
            }),
        )
    }
}
