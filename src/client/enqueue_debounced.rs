//! Enqueueing debounced jobs (`NewJob::debounce`): a shard's debounced jobs
//! of one call in one statement per chunk, the last of a batch's jobs with
//! one (queue, key) standing for them all.

use super::enqueue_once::with_retries;
use super::error::ClientError;
use super::handle::Client;
use super::pending::Reserved;
use crate::job::JobId;
use crate::shards::Shard;
use crate::store::jobs::{self, NewRow};
use std::collections::HashMap;

/// Debounced jobs per statement: bounds its size, as plain inserts are.
const DEBOUNCED_CHUNK: usize = 5_000;

impl Client {
    /// Writes the debounced jobs of one shard's part (in input order).
    /// Jobs of the call with the same queue and debounce key are one burst
    /// whose last job is written (one statement cannot join a row twice,
    /// and the last would win anyway); each of them gets the id of the run
    /// it joined. Returns (input position, id) of each.
    ///
    /// A retry (`again`, or a try after a failure) writes the same jobs:
    /// safe as `jobs::insert_debounced` says.
    pub(super) async fn write_debounced(
        &self,
        shard: &Shard,
        part: &[&Reserved],
        epoch: i32,
        again: bool,
    ) -> Result<Vec<(usize, JobId)>, ClientError> {
        let mut last: HashMap<(&str, &str), usize> = HashMap::new();
        for (at, r) in part.iter().enumerate() {
            last.insert(burst(r), at);
        }
        let written: Vec<&Reserved> = part
            .iter()
            .enumerate()
            .filter(|(at, r)| last[&burst(r)] == *at)
            .map(|(_, r)| *r)
            .collect();
        let mut runs: HashMap<(&str, &str), JobId> = HashMap::new();
        for chunk in written.chunks(DEBOUNCED_CHUNK) {
            let rows: Vec<NewRow> = chunk
                .iter()
                .map(|r| self.row(r.shard_key, &r.job))
                .collect();
            let ids: Vec<i64> = chunk.iter().map(|r| r.id).collect();
            let run_ids = with_retries("debounced enqueue", again, |_| {
                jobs::insert_debounced(shard, &rows, &ids, Some(epoch))
            })
            .await?;
            runs.extend(chunk.iter().map(|r| burst(r)).zip(run_ids));
        }
        Ok(part.iter().map(|r| (r.index, runs[&burst(r)])).collect())
    }
}

/// The burst a debounced job belongs to: its queue and debounce key.
fn burst(r: &Reserved) -> (&str, &str) {
    let key = r.job.debounce.as_ref().map_or("", |d| d.key.as_str());
    (r.job.queue.as_str(), key)
}
