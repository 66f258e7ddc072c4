//! The fleet's backlog as Prometheus metrics, read from every shard per
//! scrape by one exporter (`shardq metrics`), not by every worker: queue
//! depth by state, the oldest ready job's age, and whether each shard
//! answered; with [`scrape_with_check`], the invariants of `shardq check`,
//! the queue limits and what holds each shard's xmin horizon too.

use super::family;
use crate::client::check::{CheckOptions, CheckReport};
use crate::client::Client;
use crate::shards::{Shard, ShardSet};
pub use crate::store::backlog::QueueBacklog;
use crate::store::backlog::{self, StateCounts};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The unfinished states exposed for every queue, zero when none: a series
/// that vanished when its queue drained would read as stale, not as 0.
pub const STATES: [&str; 6] = StateCounts::STATES;

/// What one shard answered in one scrape.
#[derive(Debug, Clone)]
pub struct ShardBacklog {
    /// Shard name.
    pub shard: String,
    /// Its backlog, or why it is missing (an error or the deadline).
    pub backlog: Result<Vec<QueueBacklog>, String>,
    /// Whether only its ready and running jobs were counted: the full
    /// read ran past its share of the deadline
    /// (`store::backlog::read_within`).
    pub bounded: bool,
    /// How long the read took (until the deadline when it passed).
    pub took: Duration,
}

/// Reads every shard's backlog at once, each within `deadline`: a shard
/// that fails or does not answer in time is reported down; it never delays
/// the others or fails the scrape.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn read_all(shards: &ShardSet, deadline: Duration) -> Vec<ShardBacklog> {
    futures_util::future::join_all(shards.all().iter().map(|s| read_one(s, deadline))).await
}

async fn read_one(shard: &Shard, deadline: Duration) -> ShardBacklog {
    let started = Instant::now();
    let mut bounded = false;
    let read = backlog::read_within(shard, None, deadline);
    let backlog = match tokio::time::timeout(deadline, read).await {
        Ok(Ok(read)) => {
            bounded = read.bounded;
            Ok(read.queues)
        }
        Ok(Err(err)) => Err(crate::error_chain::error_chain(&err)),
        Err(_) => Err(format!(
            "no answer within the scrape deadline of {} ms",
            deadline.as_millis()
        )),
    };
    if let Err(error) = &backlog {
        tracing::warn!(shard = %shard.name, %error, "backlog scrape failed; reporting the shard down");
    }
    if bounded {
        tracing::warn!(shard = %shard.name, "backlog scrape bounded: only ready and running jobs counted (its full read ran past half the deadline: a long transaction holding the horizon, or millions of waiting or scheduled jobs)");
    }
    ShardBacklog {
        shard: shard.name.clone(),
        backlog,
        bounded,
        took: started.elapsed(),
    }
}

/// Reads every shard (see [`read_all`]) and returns the Prometheus text.
/// `queues` are always exposed, with zeros when a shard has none of their
/// jobs; other queues appear while they have unfinished jobs.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn scrape(shards: &ShardSet, queues: &[String], deadline: Duration) -> String {
    encode(&read_all(shards, deadline).await, queues)
}

/// [`scrape`], and the invariants of `shardq check` ([`super::invariants`])
/// read at the same time under `check`'s options (its deadline too), the
/// queue limits ([`super::limits`]), what holds each shard's xmin horizon
/// ([`super::horizon`]), the wakes owed across shards ([`super::relay`])
/// and the cancel cascades owed ([`super::cascades`]), within the same
/// deadline: what `shardq metrics` serves.
///
/// # Cancel safety
///
/// Cancel safe (reads only).
pub async fn scrape_with_check(client: &Client, queues: &[String], check: &CheckOptions) -> String {
    let (answers, report, limits, horizons, owed, cascades) = tokio::join!(
        read_all(client.shards(), check.deadline),
        client.check(check),
        client.queue_limits_within(Some(check.deadline)),
        super::horizon::read_all(client.shards(), check.deadline),
        super::relay::read_all(client.shards(), check.deadline),
        super::cascades::read_all(client.shards(), check.deadline)
    );
    let limits = limits.unwrap_or_default();
    let shards = Shards {
        horizons,
        owed,
        cascades,
    };
    encode_all(&answers, queues, Some(report), limits, shards)
}

/// The Prometheus text of one scrape's answers.
pub fn encode(answers: &[ShardBacklog], queues: &[String]) -> String {
    encode_with_check(answers, queues, None)
}

/// [`encode`], with the gauges of a [`CheckReport`] when one is given.
pub fn encode_with_check(
    answers: &[ShardBacklog],
    queues: &[String],
    check: Option<CheckReport>,
) -> String {
    encode_all(answers, queues, check, Vec::new(), Shards::default())
}

/// What the exporter reads of each shard beside its backlog.
#[derive(Debug, Default)]
struct Shards {
    horizons: Vec<super::horizon::ShardHorizon>,
    owed: Vec<super::relay::ShardOwed>,
    cascades: Vec<super::cascades::ShardCascades>,
}

/// [`encode_with_check`], with the gauges of the queue limits, of the
/// shards' xmin horizons, of the wakes owed across shards and of the
/// cancel cascades owed.
fn encode_all(
    answers: &[ShardBacklog],
    queues: &[String],
    check: Option<CheckReport>,
    limits: Vec<crate::client::limits::QueueLimit>,
    shards: Shards,
) -> String {
    let mut registry = Registry::default();
    if !limits.is_empty() {
        registry.register_collector(Box::new(super::limits::LimitsCollector::new(limits)));
    }
    if !shards.horizons.is_empty() {
        registry.register_collector(Box::new(super::horizon::Horizons::new(shards.horizons)));
    }
    if !shards.owed.is_empty() {
        registry.register_collector(Box::new(super::relay::Owed::new(shards.owed)));
    }
    if !shards.cascades.is_empty() {
        registry.register_collector(Box::new(super::cascades::Cascades::new(shards.cascades)));
    }
    registry.register_collector(Box::new(Exposition {
        shards: answers.iter().map(|a| ShardView::new(a, queues)).collect(),
    }));
    if let Some(report) = check {
        registry.register_collector(Box::new(super::invariants::Invariants::new(report)));
    }
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

/// One shard's answer, by queue, states filled in.
#[derive(Debug)]
struct ShardView {
    shard: String,
    up: bool,
    bounded: bool,
    took: Duration,
    /// Queue → (count per state of [`STATES`], oldest ready age in s).
    queues: BTreeMap<String, ([i64; STATES.len()], f64)>,
}

impl ShardView {
    fn new(answer: &ShardBacklog, known: &[String]) -> Self {
        let mut queues = BTreeMap::new();
        if let Ok(rows) = &answer.backlog {
            for queue in known {
                queues.insert(queue.clone(), ([0; STATES.len()], 0.0));
            }
            for row in rows {
                let entry = queues
                    .entry(row.queue.clone())
                    .or_insert(([0; STATES.len()], 0.0));
                for (n, add) in entry.0.iter_mut().zip(row.depth.counts()) {
                    *n += add;
                }
                if let Some(age) = row.oldest_ready_s {
                    entry.1 = age.max(0.0);
                }
            }
        }
        ShardView {
            shard: answer.shard.clone(),
            up: answer.backlog.is_ok(),
            bounded: answer.bounded,
            took: answer.took,
            queues,
        }
    }
}

#[derive(Debug)]
struct Exposition {
    shards: Vec<ShardView>,
}

impl Collector for Exposition {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        family(
            e,
            "shardq_shard_up",
            "1 when the shard answered this scrape within its deadline, else 0",
            MetricType::Gauge,
            self.shards.iter().map(|s| {
                (
                    [("shard", s.shard.as_str())],
                    ConstGauge::new(i64::from(s.up)),
                )
            }),
        )?;
        family(
            e,
            "shardq_shard_backlog_bounded",
            "1 when only the shard's queued and running jobs were counted this scrape: the full read ran past half its deadline (a long transaction holding the horizon, say); absent while the shard is down",
            MetricType::Gauge,
            self.shards.iter().filter(|s| s.up).map(|s| {
                (
                    [("shard", s.shard.as_str())],
                    ConstGauge::new(i64::from(s.bounded)),
                )
            }),
        )?;
        family(
            e,
            "shardq_shard_scrape_duration_seconds",
            "How long reading the shard's backlog took",
            MetricType::Gauge,
            self.shards.iter().map(|s| {
                (
                    [("shard", s.shard.as_str())],
                    ConstGauge::new(s.took.as_secs_f64()),
                )
            }),
        )?;
        family(
            e,
            "shardq_queue_jobs",
            "Unfinished jobs by queue and state (queued = ready to claim); absent while the shard is down, and only queued and running while its read is bounded",
            MetricType::Gauge,
            self.shards.iter().flat_map(|s| {
                s.queues.iter().flat_map(move |(queue, (counts, _))| {
                    let counted = move |state: &&str| !s.bounded || !StateCounts::left_out_when_bounded(state);
                    STATES.iter().zip(counts).filter(move |(state, _)| counted(state)).map(move |(state, n)| {
                        (
                            [
                                ("shard", s.shard.as_str()),
                                ("queue", queue.as_str()),
                                ("state", *state),
                            ],
                            ConstGauge::new(*n),
                        )
                    })
                })
            }),
        )?;
        family(
            e,
            "shardq_queue_oldest_ready_age_seconds",
            "Seconds since the first ready job of the queue's longest-waiting priority and kind became due; 0 when none is ready",
            MetricType::Gauge,
            self.shards.iter().flat_map(|s| {
                s.queues.iter().map(move |(queue, (_, age))| {
                    (
                        [("shard", s.shard.as_str()), ("queue", queue.as_str())],
                        ConstGauge::new(*age),
                    )
                })
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(shard: &str, bounded: bool) -> ShardBacklog {
        let depth = StateCounts {
            queued: 4,
            waiting: 2,
            running: 1,
            ..StateCounts::default()
        };
        ShardBacklog {
            shard: shard.into(),
            backlog: Ok(vec![QueueBacklog {
                queue: "q".into(),
                depth,
                oldest_ready_s: Some(3.0),
            }]),
            bounded,
            took: Duration::from_millis(5),
        }
    }

    /// A bounded read exports its queued and running counts and says it is
    /// bounded; its other states are absent (not 0), while a full read's
    /// are all there.
    #[test]
    fn a_bounded_read_exports_only_what_it_counted() {
        let text = encode(&[answer("full", false), answer("held", true)], &[]);
        let has = |line: &str| text.lines().any(|l| l == line);
        assert!(
            has(r#"shardq_shard_backlog_bounded{shard="full"} 0"#),
            "{text}"
        );
        assert!(
            has(r#"shardq_shard_backlog_bounded{shard="held"} 1"#),
            "{text}"
        );
        assert!(has(r#"shardq_shard_up{shard="held"} 1"#), "{text}");
        for (state, n) in [("queued", 4), ("running", 1)] {
            for shard in ["full", "held"] {
                let line = format!(
                    r#"shardq_queue_jobs{{shard="{shard}",queue="q",state="{state}"}} {n}"#
                );
                assert!(has(&line), "{line} in {text}");
            }
        }
        assert!(has(
            r#"shardq_queue_jobs{shard="full",queue="q",state="waiting"} 2"#
        ));
        assert!(has(
            r#"shardq_queue_jobs{shard="full",queue="q",state="delayed"} 0"#
        ));
        for state in ["waiting", "retrying", "delayed", "parked"] {
            let series = format!(r#"shardq_queue_jobs{{shard="held",queue="q",state="{state}"}}"#);
            assert!(!text.contains(&series), "{series} in {text}");
        }
    }
}
