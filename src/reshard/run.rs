//! The command's steps, each safe to run again: record the new epoch (the
//! new shards first), open each range (copy its deduplication ids under the
//! move lock), copy and drain, release.

use super::copy::copy_range;
use super::plan::plan;
use crate::shard_map::{EpochRecord, MoveRow, ShardMap};
use crate::shards::{ShardError, ShardSet};
use crate::store::reshard::{self as store, EpochWrite};
use crate::store::schedules;
use std::time::{Duration, Instant};

/// Ids a shard may give between the reading of the sequences and its
/// epoch write (far more than any shard gives in that time): the new shards'
/// ids start this far above every old shard's last id.
const ID_GAP: i64 = 1 << 40;

/// Pause between drain passes, and before trying a failed step again.
const PASS_PAUSE: Duration = Duration::from_millis(200);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(5);

/// Expired leases returned to the queue per old shard and drain pass.
const RECOVER_PER_PASS: i64 = 1_000;

/// The steps, in order; [`Options::stop_after`] stops the command after one
/// (to show that a run stopped there finishes when run again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// The new epoch is recorded on every shard.
    Recorded,
    /// Every range is open: enqueues of it are written held on its new shard.
    Opened,
    /// One pass copied jobs of every range still moving.
    Copied,
    /// Every range is released.
    Released,
}

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Plan and report only.
    pub dry_run: bool,
    /// Stop after this step (a test of resuming).
    pub stop_after: Option<Step>,
    /// Give up when a drain makes no progress for this long (`None`: wait).
    pub patience: Option<Duration>,
}

/// What the command tells as it goes.
#[derive(Debug, Clone)]
pub enum Progress {
    /// The plan: the epoch it records and the moves.
    Planned {
        /// The epoch the moves make.
        epoch: i32,
        /// Ranges that move.
        moves: Vec<MoveRow>,
        /// Whether this run resumes a move a stopped run began.
        resumed: bool,
    },
    /// A step finished.
    Done(Step),
    /// A drain pass: jobs moved so far, unfinished jobs left on the old
    /// shards, ranges released of all.
    Pass {
        /// Jobs copied and removed from their old shard so far.
        moved: u64,
        /// Unfinished jobs of moving ranges still on their old shard.
        left: i64,
        /// Ranges released.
        released: usize,
        /// Ranges in the plan.
        ranges: usize,
        /// Time left at the pace so far, when it can be told.
        eta: Option<Duration>,
    },
    /// A step failed and is tried again.
    Retrying {
        /// What failed.
        error: String,
    },
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The epoch of the new map.
    pub epoch: i32,
    /// Ranges moved.
    pub ranges: usize,
    /// Jobs copied to their new shard.
    pub moved: u64,
    /// Whether the move is complete (false for a dry run or a stop).
    pub complete: bool,
}

/// Why the command could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReshardError {
    /// A shard failed, and the step cannot go on without it.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The lists do not relate as a reshard needs.
    #[error("{0}")]
    Lists(String),
    /// The shards' maps are not one map.
    #[error("{0}")]
    Map(String),
    /// A drain made no progress for [`Options::patience`].
    #[error("the move made no progress for {0:?}: {1} unfinished jobs of moving ranges stay on their old shards (a frozen shard? a job that never finishes?)")]
    Stalled(Duration, i64),
}

/// Moves the shard map of `shards` to `new_count` shards. `shards` is the
/// longer of the two lists (the old one when shrinking, the new one when
/// growing); its first `old_count` shards are the current list. Reports
/// each step to `report`.
///
/// # Errors
///
/// [`ReshardError`]; the move stays recorded, and running the command
/// again goes on from where it stopped.
pub async fn reshard(
    shards: &ShardSet,
    old_count: usize,
    new_count: usize,
    options: &Options,
    mut report: impl FnMut(Progress),
) -> Result<Summary, ReshardError> {
    if let Some(shard) = shards.all().iter().find(|s| s.behind_pooler()) {
        return Err(ReshardError::Lists(format!(
            "shard `{}` is reached through a transaction pooler; resharding needs sessions \
             (a move lock, multi-statement transactions): give the command direct URLs",
            shard.name
        )));
    }
    // A dry run plans before the shards new to the list are migrated.
    let migrated = if options.dry_run {
        old_count
    } else {
        shards.len()
    };
    check_versions(&shards.all()[..migrated.min(shards.len())]).await?;
    let histories = read_histories(shards, old_count).await?;
    // The newest epoch any shard records, a shard new to the list too: a
    // run that stopped while recording wrote the shards ranges move to
    // first, and a run with another list must not record a different map
    // under the same epoch.
    // On a tie the current shards' record wins.
    let reference = histories
        .iter()
        .enumerate()
        .max_by_key(|(i, h)| (h.last().map_or(0, |e| e.epoch), *i < old_count))
        .map(|(_, h)| h.clone())
        .unwrap_or_default();
    let Some(current) = reference.last().cloned() else {
        return Err(ReshardError::Map(
            "the current shards record no shard map: run `shardq migrate` first".into(),
        ));
    };
    let unfinished =
        !current.moves.is_empty() && !moves_unreleased(shards, &histories, &current).is_empty();
    let (record, history, resumed) = if unfinished {
        if usize::try_from(current.shard_count).ok() != Some(new_count) {
            return Err(ReshardError::Lists(format!(
                "a move to a list of {} shards (epoch {}) is not finished; run the command with \
                 that list to finish it first",
                current.shard_count, current.epoch
            )));
        }
        refuse_other_targets(shards, &histories, &current)?;
        let before = reference[..reference.len() - 1].to_vec();
        (current, before, true)
    } else {
        ShardMap::new(
            current.epoch,
            old_count.max(new_count),
            current.ranges.clone(),
        )
        .map_err(|e| ReshardError::Map(e.to_string()))?;
        let planned = plan(&current.ranges, new_count);
        if planned.moves.is_empty() && usize::try_from(current.shard_count).ok() == Some(new_count)
        {
            return Ok(Summary {
                epoch: current.epoch,
                ranges: 0,
                moved: 0,
                complete: true,
            });
        }
        let record = planned.record(current.epoch + 1, new_count);
        (record, reference.clone(), false)
    };
    report(Progress::Planned {
        epoch: record.epoch,
        moves: record.moves.clone(),
        resumed,
    });
    let mut summary = Summary {
        epoch: record.epoch,
        ranges: record.moves.len(),
        moved: 0,
        complete: false,
    };
    if options.dry_run {
        return Ok(summary);
    }
    let stop = |step: Step| options.stop_after == Some(step);

    retrying(&mut report, options.patience, || {
        record_everywhere(shards, old_count, new_count, &record, &history, &histories)
    })
    .await?;
    report(Progress::Done(Step::Recorded));
    if stop(Step::Recorded) {
        return Ok(summary);
    }
    summary.moved += retrying(&mut report, options.patience, || {
        open_ranges(shards, &record)
    })
    .await?;
    report(Progress::Done(Step::Opened));
    if stop(Step::Opened) {
        return Ok(summary);
    }
    drain(shards, &record, options, &mut summary, &mut report).await?;
    summary.complete = true;
    report(Progress::Done(Step::Released));
    Ok(summary)
}

/// Refuses shards whose schema is not this binary's: a step a shard cannot
/// run (a statement of a later migration) would fail the same way on every
/// retry.
pub(super) async fn check_versions(shards: &[crate::shards::Shard]) -> Result<(), ReshardError> {
    let needed = crate::migrate::latest_version();
    for shard in shards {
        let found = crate::store::schema::current_version(shard).await?;
        if found != Some(needed) {
            let found = found.map_or_else(|| "none".to_string(), |v| v.to_string());
            return Err(ReshardError::Map(format!(
                "shard `{}` is at schema version {found}, this binary needs {needed}: run \
                 `shardq migrate` with the current list first (shards new to the list are \
                 migrated by `shardq reshard`)",
                shard.name
            )));
        }
    }
    Ok(())
}

/// Every shard's map history; a shard new to the list (index from
/// `old_count` on) may have none yet.
async fn read_histories(
    shards: &ShardSet,
    old_count: usize,
) -> Result<Vec<Vec<EpochRecord>>, ReshardError> {
    let mut out = Vec::new();
    for shard in shards.all() {
        let history = store::history(shard).await?;
        if shard.index < old_count && history.is_empty() {
            return Err(ReshardError::Map(format!(
                "shard `{}` records no shard map: run `shardq migrate` with the current list",
                shard.name
            )));
        }
        out.push(history);
    }
    Ok(out)
}

/// Refuses to resume `record` with a list whose shard at a target's index
/// is not the one the move began with. The shards ranges move to record an
/// epoch first, so once a shard that is not a target records it, every
/// target must, with the same ranges (a target that does not is another
/// server; before that, nothing has moved and any server may take it).
fn refuse_other_targets(
    shards: &ShardSet,
    histories: &[Vec<EpochRecord>],
    record: &EpochRecord,
) -> Result<(), ReshardError> {
    let targets: Vec<usize> = record.moves.iter().map(|m| m.to_index).collect();
    let records_it = |i: usize| {
        histories[i]
            .iter()
            .any(|e| e.epoch == record.epoch && e.ranges == record.ranges)
    };
    let begun = (0..shards.len()).any(|i| !targets.contains(&i) && records_it(i));
    match targets
        .iter()
        .find(|&&t| t < shards.len() && !records_it(t))
    {
        Some(&t) if begun => Err(ReshardError::Lists(format!(
            "shard `{}` does not record epoch {} that the other shards do: it is not the \
             shard the unfinished move to it began with; finish the move with the list it \
             began with",
            shards.get(t).name,
            record.epoch
        ))),
        _ => Ok(()),
    }
}

/// The moves of `record` not yet released on their new shard.
pub(super) fn moves_unreleased<'r>(
    shards: &ShardSet,
    histories: &[Vec<EpochRecord>],
    record: &'r EpochRecord,
) -> Vec<&'r MoveRow> {
    record
        .moves
        .iter()
        .filter(|m| {
            let on_target = histories
                .get(m.to_index)
                .and_then(|h| h.iter().find(|e| e.epoch == record.epoch))
                .and_then(|e| e.moves.iter().find(|x| x.first_key == m.first_key));
            m.to_index >= shards.len() || on_target.is_none_or(|x| x.state != "released")
        })
        .collect()
}

/// Runs `step` until it succeeds, reporting each failure; a permanent one
/// (bad data, a missing function) is returned, and so is the last one
/// once `patience` has passed since the first.
async fn retrying<T, F, Fut>(
    report: &mut impl FnMut(Progress),
    patience: Option<Duration>,
    mut step: F,
) -> Result<T, ReshardError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ReshardError>>,
{
    let mut pause = PASS_PAUSE;
    let mut failing_since = None;
    loop {
        match step().await {
            Ok(done) => return Ok(done),
            Err(ReshardError::Shard(e))
                if !e.is_permanent()
                    && patience.is_none_or(|p| {
                        failing_since.get_or_insert_with(Instant::now).elapsed() < p
                    }) =>
            {
                report(Progress::Retrying {
                    error: crate::error_chain::error_chain(&e),
                });
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_PAUSE_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Records `record` on every shard: the shards ranges move to first (their
/// hold trigger on, their ids raised above every old shard's), then the
/// others. A shard new to the list takes the current shards' history.
async fn record_everywhere(
    shards: &ShardSet,
    old_count: usize,
    new_count: usize,
    record: &EpochRecord,
    history: &[EpochRecord],
    histories: &[Vec<EpochRecord>],
) -> Result<(), ReshardError> {
    let mut ids_from = 0;
    for shard in shards.all().iter().take(old_count) {
        ids_from = ids_from.max(store::last_id(shard).await?);
    }
    let ids_from = ids_from.saturating_add(ID_GAP);
    let targets: Vec<usize> = record.moves.iter().map(|m| m.to_index).collect();
    let mut order: Vec<usize> = (0..shards.len()).collect();
    order.sort_by_key(|i| !targets.contains(i));
    for i in order {
        let shard = shards.get(i);
        // A shard new to the list that does not record this very map (none,
        // or another list's from a run that stopped) takes it afresh.
        let joining = i >= old_count
            && !histories[i].iter().any(|e| {
                e.epoch == record.epoch
                    && e.shard_count == record.shard_count
                    && e.ranges == record.ranges
            });
        if joining && store::has_jobs(shard).await? {
            return Err(ReshardError::Lists(format!(
                "shard `{}` is new to the list but holds jobs; a shard joins empty",
                shard.name
            )));
        }
        store::record_epoch(
            shard,
            &EpochWrite {
                record,
                history: joining.then_some(history),
                moving_in: targets.contains(&i),
                ids_from,
                in_list: i < new_count,
            },
        )
        .await?;
    }
    Ok(())
}

/// Opens every `closed` range: under the new shard's move lock (its
/// enqueues of the range wait), copies the jobs of keys with a
/// deduplication id or a debounced job's pending run (and stand-ins of
/// running deduplicated jobs) and the state of
/// the schedules whose key is in the range, then lets enqueues of the range
/// be written held (and its schedules tick there).
/// Returns the jobs copied.
async fn open_ranges(shards: &ShardSet, record: &EpochRecord) -> Result<u64, ReshardError> {
    let states = target_states(shards, record).await?;
    let mut moved = 0;
    for (m, state) in record.moves.iter().zip(states) {
        if state != "closed" {
            continue;
        }
        let to = shards.get(m.to_index);
        let lock = store::hold_move_lock(to).await?;
        let range = (m.first_key, m.end_key);
        let from = shards.get(m.from_index);
        moved += copy_range(from, to, range, true).await?.moved;
        // The old shard ticks none of them any more (its epoch is
        // recorded); the new one none yet (the range is closed).
        schedules::copy_range(from, to, range).await?;
        if !store::set_move_state(to, record.epoch, m.first_key, "holding").await? {
            return Err(ReshardError::Map(format!(
                "shard `{}` does not record the move of keys {}..{} at epoch {}",
                to.name, m.first_key, m.end_key, record.epoch
            )));
        }
        store::release_move_lock(to, lock).await?;
    }
    Ok(moved)
}

/// Each move's state on its new shard.
async fn target_states(
    shards: &ShardSet,
    record: &EpochRecord,
) -> Result<Vec<String>, ReshardError> {
    let mut out = Vec::new();
    for m in &record.moves {
        let history = store::history(shards.get(m.to_index)).await?;
        let state = history
            .iter()
            .find(|e| e.epoch == record.epoch)
            .and_then(|e| e.moves.iter().find(|x| x.first_key == m.first_key))
            .map_or_else(|| "closed".to_string(), |x| x.state.clone());
        out.push(state);
    }
    Ok(out)
}

/// Returns to the queue the jobs whose lease expired on the old shards of
/// unreleased moves: until a range is released the move is responsible
/// for it, and a shard that leaves the list has no worker left to recover
/// a job whose worker died there (no process starts with the old list
/// once the epoch is recorded); the recovered job is copied by this pass.
/// Gated like every recovery: skipped while another process recovers.
async fn recover_leaving_leases(
    shards: &ShardSet,
    record: &EpochRecord,
    states: &[String],
) -> Result<(), ReshardError> {
    let mut from: Vec<usize> = record
        .moves
        .iter()
        .zip(states)
        .filter(|(_, state)| state.as_str() != "released")
        .map(|(m, _)| m.from_index)
        .collect();
    from.sort_unstable();
    from.dedup();
    for index in from {
        crate::store::upkeep::recover_expired(shards.get(index), RECOVER_PER_PASS).await?;
    }
    Ok(())
}

/// Copies each unreleased range until its old shard holds no unfinished
/// job of it, then releases it; passes until every range is released.
async fn drain(
    shards: &ShardSet,
    record: &EpochRecord,
    options: &Options,
    summary: &mut Summary,
    report: &mut impl FnMut(Progress),
) -> Result<(), ReshardError> {
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let mut last_left = i64::MAX;
    loop {
        let pass = async {
            let states = target_states(shards, record).await?;
            recover_leaving_leases(shards, record, &states).await?;
            let mut left_total = 0;
            let mut released = 0;
            let mut moved = 0;
            let mut drained = Vec::new();
            for (m, state) in record.moves.iter().zip(states) {
                if state == "released" {
                    released += 1;
                    continue;
                }
                let from = shards.get(m.from_index);
                let range = (m.first_key, m.end_key);
                let to = shards.get(m.to_index);
                moved += copy_range(from, to, range, false).await?.moved;
                match store::left(from, range).await? {
                    0 => drained.push((to, range)),
                    left => left_total += left,
                }
            }
            if options.stop_after != Some(Step::Copied) {
                for (to, range) in drained {
                    store::release(to, record.epoch, range).await?;
                    released += 1;
                }
            }
            Ok::<_, ReshardError>((moved, left_total, released))
        };
        let (moved, left, released) = match pass.await {
            Ok(done) => done,
            Err(ReshardError::Shard(e))
                if !e.is_permanent()
                    && options.patience.is_none_or(|p| last_progress.elapsed() < p) =>
            {
                report(Progress::Retrying {
                    error: crate::error_chain::error_chain(&e),
                });
                tokio::time::sleep(PASS_PAUSE).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        summary.moved += moved;
        let rate = summary.moved as f64 / started.elapsed().as_secs_f64().max(0.001);
        report(Progress::Pass {
            moved: summary.moved,
            left,
            released,
            ranges: record.moves.len(),
            eta: (rate > 0.0 && left > 0).then(|| Duration::from_secs_f64(left as f64 / rate)),
        });
        if options.stop_after == Some(Step::Copied) {
            return Ok(());
        }
        if released == record.moves.len() {
            return Ok(());
        }
        if moved > 0 || left < last_left {
            last_progress = Instant::now();
        }
        last_left = left;
        if let Some(patience) = options.patience {
            if last_progress.elapsed() > patience {
                return Err(ReshardError::Stalled(patience, left));
            }
        }
        tokio::time::sleep(PASS_PAUSE).await;
    }
}
