//! The overview's invariant line: the invariant check (`shardq check`) is
//! the costliest read behind the overview (at fifty shards most of its
//! time) and its answer changes slowly, so the dashboard runs it in the
//! background every `check_interval` and the page shows the latest verdict
//! and how old it is, instead of running it on every refresh.

use shardq::client::{CheckOptions, CheckReport};
use shardq::Client;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The latest check's report and when it ended; none before the first.
#[derive(Default)]
pub(crate) struct Verdict {
    latest: Mutex<Option<(CheckReport, Instant)>>,
}

impl Verdict {
    /// The latest report and its age.
    pub fn latest(&self) -> Option<(CheckReport, Duration)> {
        self.latest
            .lock()
            .expect("verdict")
            .as_ref()
            .map(|(report, at)| (report.clone(), at.elapsed()))
    }

    /// Checks every `interval` (the first at once) until `stop`.
    pub async fn run(
        &self,
        client: Client,
        options: CheckOptions,
        interval: Duration,
        stop: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let report = tokio::select! {
                _ = stop.cancelled() => return,
                report = client.check(&options) => report,
            };
            *self.latest.lock().expect("verdict") = Some((report, Instant::now()));
        }
    }
}
