//! Completions and failures over the last hour, fleet-wide and per queue:
//! the dashboard asks every shard every `trend_interval` what finished
//! since its last answer (`Client::finished_since`, a range of the finished
//! index, ending 5 s back so completions still committing are not passed
//! over; a first answer covers the 10 s before it) and keeps the samples
//! in memory, so the history starts when the dashboard does. A shard that
//! does not answer is asked again from where it left off, so its jobs land
//! in the next sample instead of being lost, up to [`read_span`] back:
//! after a longer gap the read skips to its last span, so the shard answers
//! within the deadline at once, and the sample marks the rest as not read
//! rather than counting hours-old jobs as a current rate.

use crate::claim_trends::ClaimTrends;
use shardq::client::FinishedSince;
use shardq::Client;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The shortest span one read covers: at a shard's highest completion rate
/// (about 64,000 jobs/s on the benchmark machine) about 2 M rows, well
/// within the 2 s deadline at 0.3 µs a row.
const READ_SPAN_MIN: Duration = Duration::from_secs(30);

/// Sampling intervals one read covers at least: a shard that missed two
/// samples has their jobs in the next, and a read one late tick long is
/// never cut short.
const READ_SPAN_INTERVALS: u32 = 3;

/// The longest span one read covers, sampling every `interval`.
pub(crate) fn read_span(interval: Duration) -> Duration {
    (interval * READ_SPAN_INTERVALS).max(READ_SPAN_MIN)
}

/// One sample: what finished over `span`, by queue (done, failed).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    pub span: Duration,
    pub by_queue: BTreeMap<String, (i64, i64)>,
    /// Shards that did not answer this time.
    pub unanswered: usize,
    /// Shards that answered after a gap longer than one read covers: what
    /// finished on them before the read's start is unknown, not counted.
    pub unread: usize,
}

impl Sample {
    /// (done, failed) of `queue`, or of every queue when `None`.
    pub fn of(&self, queue: Option<&str>) -> (i64, i64) {
        match queue {
            Some(q) => self.by_queue.get(q).copied().unwrap_or_default(),
            None => self
                .by_queue
                .values()
                .fold((0, 0), |(d, f), (dq, fq)| (d + dq, f + fq)),
        }
    }
}

/// The samples of the last `window`, oldest first; each shard's claims
/// over the same samples.
pub(crate) struct Trends {
    pub interval: Duration,
    keep: usize,
    samples: Mutex<VecDeque<Sample>>,
    pub claims: ClaimTrends,
}

impl Trends {
    pub fn new(interval: Duration, window: Duration) -> Trends {
        let keep = (window.as_secs_f64() / interval.as_secs_f64().max(1e-3)).ceil() as usize;
        Trends {
            interval,
            keep: keep.max(1),
            samples: Mutex::new(VecDeque::new()),
            claims: ClaimTrends::new(keep),
        }
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .expect("trends")
            .iter()
            .cloned()
            .collect()
    }

    /// (done, failed) per second of `queue` over the samples of the last
    /// `span`; `None` before the first sample.
    pub fn rates(&self, queue: &str, span: Duration) -> Option<(f64, f64)> {
        let samples = self.samples.lock().expect("trends");
        let (mut secs, mut done, mut failed) = (0.0, 0, 0);
        for s in samples.iter().rev() {
            if secs >= span.as_secs_f64() {
                break;
            }
            let (d, f) = s.of(Some(queue));
            secs += s.span.as_secs_f64();
            done += d;
            failed += f;
        }
        (secs > 0.0).then(|| (done as f64 / secs, failed as f64 / secs))
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().expect("trends");
        samples.push_back(sample);
        while samples.len() > self.keep {
            samples.pop_front();
        }
    }

    /// Samples every `interval` until `stop`.
    pub async fn run(&self, client: Client, deadline: Duration, stop: CancellationToken) {
        let mut since = vec![None; client.shards().len()];
        let span = read_span(self.interval);
        let mut last = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (answers, workers) = tokio::join!(
                client.finished_since(&since, span, deadline),
                client.live_workers(deadline)
            );
            let now = tokio::time::Instant::now();
            let sample = fold(&mut since, answers, now - last);
            last = now;
            self.push(sample);
            self.claims.push(workers);
        }
    }
}

/// One sample from the shards' answers; each answering shard's `since`
/// moves to its answer's end (a silent shard's stays, to be read later),
/// and one whose answer starts past its `since` is counted as unread.
fn fold(
    since: &mut [Option<chrono::DateTime<chrono::Utc>>],
    answers: Vec<Option<FinishedSince>>,
    span: Duration,
) -> Sample {
    let mut sample = Sample {
        span,
        ..Sample::default()
    };
    for (from, answer) in since.iter_mut().zip(answers) {
        match answer {
            Some(a) => {
                // Started past `since`: the gap before was skipped. (A
                // first answer covers the 10 s before it.)
                if from.is_some_and(|f| a.from > f) {
                    sample.unread += 1;
                }
                for (queue, done, failed) in a.by_queue {
                    let e = sample.by_queue.entry(queue).or_default();
                    e.0 += done;
                    e.1 += failed;
                }
                *from = Some(a.at);
            }
            None => sample.unanswered += 1,
        }
    }
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(from: i64, at: i64, rows: &[(&str, i64, i64)]) -> Option<FinishedSince> {
        Some(FinishedSince {
            from: chrono::DateTime::from_timestamp(from, 0).unwrap(),
            at: chrono::DateTime::from_timestamp(at, 0).unwrap(),
            by_queue: rows
                .iter()
                .map(|(q, d, f)| (q.to_string(), *d, *f))
                .collect(),
        })
    }

    #[test]
    fn a_sample_sums_the_shards_and_a_silent_shard_is_read_from_where_it_left_off() {
        let mut since = vec![None, None];
        let span = Duration::from_secs(10);
        // First answers cover the 10 s before them.
        let first = fold(
            &mut since,
            vec![answer(90, 100, &[("a", 9, 1)]), answer(90, 100, &[])],
            span,
        );
        assert_eq!(first.of(None), (9, 1));
        let second = fold(
            &mut since,
            vec![
                answer(100, 110, &[("a", 3, 1)]),
                answer(100, 110, &[("a", 2, 0), ("b", 5, 5)]),
            ],
            span,
        );
        assert_eq!((second.of(Some("a")), second.of(None)), ((5, 1), (10, 6)));
        let silent = fold(&mut since, vec![answer(110, 120, &[]), None], span);
        assert_eq!(
            (silent.unanswered, since[1]),
            (1, chrono::DateTime::from_timestamp(110, 0))
        );
    }

    #[test]
    fn a_shard_back_after_a_long_gap_counts_its_last_span_only_and_says_so() {
        let at = |secs| chrono::DateTime::from_timestamp(secs, 0);
        let span = Duration::from_secs(10);
        let mut since = vec![at(100), at(100)];
        // Shard 1 was away an hour: its read skipped to its last 30 s.
        let back = fold(
            &mut since,
            vec![
                answer(100, 110, &[("a", 1, 0)]),
                answer(3_680, 3_710, &[("a", 30, 0)]),
            ],
            span,
        );
        assert_eq!(
            (back.of(None), back.unread, since[1]),
            ((31, 0), 1, at(3_710))
        );
        // Its next read goes on from there: nothing skipped, nothing twice.
        let next = fold(
            &mut since,
            vec![answer(110, 120, &[]), answer(3_710, 3_720, &[("a", 10, 0)])],
            span,
        );
        assert_eq!((next.of(None), next.unread), ((10, 0), 0));
    }

    #[test]
    fn a_read_covers_three_intervals_and_never_less_than_30_s() {
        assert_eq!(
            (
                read_span(Duration::from_secs(10)),
                read_span(Duration::from_millis(100)),
                read_span(Duration::from_secs(60))
            ),
            (
                Duration::from_secs(30),
                Duration::from_secs(30),
                Duration::from_secs(180)
            )
        );
    }

    #[test]
    fn only_the_window_is_kept() {
        let trends = Trends::new(Duration::from_secs(10), Duration::from_secs(30));
        for i in 0..5 {
            trends.push(Sample {
                unanswered: i,
                ..Sample::default()
            });
        }
        let kept: Vec<usize> = trends.samples().iter().map(|s| s.unanswered).collect();
        assert_eq!(kept, [2, 3, 4]);
    }
}
