//! Copying a range's unclaimed jobs from the old shard to the new one.
//!
//! Per chunk of whole shard keys (a key's jobs move together, so no claim
//! on the old shard takes a later job of a key whose earlier one left):
//! mark them `held` on the old shard (no worker claims them there any
//! more), write them on the new shard with their steps, messages, events and ids, then remove
//! them from the old shard. Stopped between any two of these, the next run
//! finds them held on the old shard and copies them again (the new shard's
//! earlier copy is replaced), so nothing is lost or written twice.
//!
//! Writers between the statements, without the lock of the one before:
//! a worker completing or retrying a running job of the range (it stays
//! running, or turns `scheduled` and is copied by a later pass); a cancel
//! (it marks a held job's request, and the removal leaves a job whose
//! request changed since it was read, for the next pass); recovery of an
//! expired lease (running → queued: copied by a later pass; a
//! deduplicated one keeps its id taken on the new shard by the stand-in
//! read after the marks, which sees it in some unfinished state). A send
//! to a held job is refused (`Client::send` says to send again after the
//! move), so the messages read with a job are all it has when it is
//! removed. Enqueues
//! of the range are refused on the old shard from the new epoch on.

use crate::shards::{Shard, ShardError};
use crate::store::reshard as store;
use serde_json::Value;
use std::collections::HashMap;

/// Rows per chunk. A key with more is one chunk: marked in one statement,
/// then copied and removed in pieces of this many rows (by id), so no
/// statement but the mark grows with a key's size.
const CHUNK_ROWS: i64 = 2_000;

/// What one pass copied.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Copied {
    /// Jobs written on the new shard and removed from the old.
    pub moved: u64,
    /// Jobs the new shard refused (their deduplication id is taken there
    /// by another job): left held on the old shard.
    pub refused: u64,
}

/// Copies the unclaimed jobs of `range` from `from` to `to`: all of them,
/// or (`dedup_only`) those of shard keys with a deduplicated job or a
/// debounced job's pending run, plus
/// stand-ins of the range's deduplicated jobs left on the old shard.
pub(super) async fn copy_range(
    from: &Shard,
    to: &Shard,
    range: (i32, i32),
    dedup_only: bool,
) -> Result<Copied, ShardError> {
    let keys = store::keys_to_move(from, range, dedup_only).await?;
    let mut copied = Copied::default();
    for chunk in chunks(&keys) {
        let done = copy_chunk(from, to, chunk).await?;
        copied.moved += done.moved;
        copied.refused += done.refused;
    }
    // After the marks, in one read: every deduplicated job still holding
    // its id on the old shard (running; or unclaimed and not marked: its key
    // has a running job, or it failed, was released or recovered since the
    // keys were listed) gets a stand-in, so no enqueue on the new shard takes
    // its id before the job is copied over the stand-in.
    let stand_ins = store::read_stand_ins(from, range).await?;
    if stand_ins.as_array().is_some_and(|a| !a.is_empty()) {
        store::write_copies(to, &store::HeldJobs::empty(), &stand_ins).await?;
    }
    Ok(copied)
}

/// Groups (shard key, jobs) into ranges of whole keys of about
/// [`CHUNK_ROWS`] jobs.
fn chunks(keys: &[(i32, i64)]) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let mut current: Option<(i32, i32, i64)> = None;
    for &(key, n) in keys {
        current = match current {
            Some((first, _, rows)) if rows + n <= CHUNK_ROWS => Some((first, key + 1, rows + n)),
            Some((first, end, _)) => {
                out.push((first, end));
                Some((key, key + 1, n))
            }
            None => Some((key, key + 1, n)),
        };
    }
    out.extend(current.map(|(first, end, _)| (first, end)));
    out
}

async fn copy_chunk(from: &Shard, to: &Shard, chunk: (i32, i32)) -> Result<Copied, ShardError> {
    store::mark_held(from, chunk).await?;
    let mut copied = Copied::default();
    let mut after = 0;
    loop {
        let held = store::read_held(from, chunk, after, CHUNK_ROWS).await?;
        let Some(piece) = held.jobs.as_array().filter(|a| !a.is_empty()) else {
            return Ok(copied);
        };
        after = piece
            .iter()
            .filter_map(|j| j["id"].as_i64())
            .max()
            .unwrap_or(after);
        let done = copy_piece(from, to, chunk, &held).await?;
        copied.moved += done.moved;
        copied.refused += done.refused;
    }
}

/// Writes one piece of a chunk's held jobs on the new shard and removes
/// them from the old one.
async fn copy_piece(
    from: &Shard,
    to: &Shard,
    chunk: (i32, i32),
    held: &store::HeldJobs,
) -> Result<Copied, ShardError> {
    let jobs = &held.jobs;
    let read = jobs.as_array().map_or(0, Vec::len);
    let empty = Value::Array(Vec::new());
    let written = store::write_copies(to, held, &empty).await?;
    let cancel_of: HashMap<(i64, i64), bool> = jobs
        .as_array()
        .into_iter()
        .flatten()
        .map(|j| {
            let id = (
                j["id"].as_i64().unwrap_or(-1),
                j["shard_key"].as_i64().unwrap_or(-1),
            );
            (id, j["cancel_requested"].as_bool().unwrap_or(false))
        })
        .collect();
    let copied: Vec<(i64, i32, bool)> = written
        .iter()
        .map(|&(id, key)| {
            let cancel = cancel_of.get(&(id, key.into())).copied().unwrap_or(false);
            (id, key, cancel)
        })
        .collect();
    let moved = store::drop_copied(from, chunk, &copied).await?;
    let refused: Vec<i64> = cancel_of
        .keys()
        .filter(|(id, key)| {
            !written
                .iter()
                .any(|&(w, k)| w == *id && i64::from(k) == *key)
        })
        .map(|&(id, _)| id)
        .collect();
    if !refused.is_empty() {
        // A refused job exists only here (the write that refused it
        // replaced any earlier copy), so a cancel of it is final here.
        let cancelled = store::cancel_refused(from, chunk, &refused).await?;
        tracing::warn!(
            from = %from.name, to = %to.name, first_key = chunk.0, end_key = chunk.1,
            refused = refused.len(), cancelled, ids = ?refused,
            "jobs not copied: the new shard holds another job with their deduplication id; \
             they stay held on the old shard (cancel these, `shardq job cancel`, to let the \
             move finish)"
        );
    }
    Ok(Copied {
        moved,
        refused: (read - written.len()) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_keys_whole_and_about_the_size() {
        assert_eq!(chunks(&[]), Vec::<(i32, i32)>::new());
        assert_eq!(
            chunks(&[(3, 1_500), (7, 400), (9, 200), (12, 5_000), (13, 1)]),
            vec![(3, 8), (9, 10), (12, 13), (13, 14)]
        );
    }
}
