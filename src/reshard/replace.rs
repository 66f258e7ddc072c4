//! Replacing a shard's server: the new list names another server at some
//! place. No key moves then; the new server must already be a physical
//! copy of the old one (a streaming replica promoted once the old one
//! stopped taking writes, or a base backup of the stopped server), which
//! carries the old shard's jobs, id sequences and map. This checks that it
//! is: migrated as that place of the list, at the map the other shards
//! record. An empty database, another place's copy or a copy taken before
//! the last move is refused (its jobs would be lost or doubled).

use super::run::{check_versions, moves_unreleased, ReshardError};
use crate::shard_map::EpochRecord;
use crate::shards::{Shard, ShardSet};
use crate::store;

/// How the procedure goes, for the errors.
const PROCEDURE: &str = "to replace a server, make the new one a physical copy of the old \
     (a streaming replica promoted once the old one stops taking writes, or a base backup \
     of the stopped server) and list its URL in place of the old one \
     (docs/operations.md, 'Replacing a server')";

/// Checks that each shard of `shards` at the places `replaced` is a copy of
/// the shard it replaces; the others are the current list's shards.
///
/// # Errors
///
/// [`ReshardError::Lists`] naming the shard and what it records instead;
/// [`ReshardError::Map`] when a move is unfinished or a shard's schema is
/// not this binary's; [`ReshardError::Shard`] when a shard fails.
pub async fn check_replacements(shards: &ShardSet, replaced: &[usize]) -> Result<(), ReshardError> {
    let count = shards.len();
    let mut reference: Option<EpochRecord> = None;
    for shard in shards.all().iter().filter(|s| !replaced.contains(&s.index)) {
        check_versions(std::slice::from_ref(shard)).await?;
        let last = store::reshard::history(shard).await?.pop();
        if last.as_ref().map(|e| e.epoch) > reference.as_ref().map(|e| e.epoch) {
            reference = last;
        }
    }
    for &index in replaced {
        check_copy(&shards.all()[index], count, reference.as_ref()).await?;
    }
    let Some(reference) = reference else {
        return Ok(());
    };
    let mut histories = Vec::new();
    for shard in shards.all() {
        histories.push(store::reshard::history(shard).await?);
    }
    if !moves_unreleased(shards, &histories, &reference).is_empty() {
        return Err(ReshardError::Map(format!(
            "the move to epoch {} is not finished: run `shardq reshard` with its list to \
             finish it, then replace the server",
            reference.epoch
        )));
    }
    Ok(())
}

/// Whether `shard` records itself as place `shard.index` of `count`, at
/// the last epoch of `reference` (the other shards' map; `None` when the
/// list has no other shard).
async fn check_copy(
    shard: &Shard,
    count: usize,
    reference: Option<&EpochRecord>,
) -> Result<(), ReshardError> {
    let name = &shard.name;
    let not_a_copy = |what: String| {
        ReshardError::Lists(format!(
            "shard `{name}` (place {} of the new list, counting from 0) is not a copy of the \
             shard it replaces: {what}; {PROCEDURE}",
            shard.index
        ))
    };
    let Some((recorded_count, recorded_index)) = store::schema::shard_map(shard).await? else {
        return Err(not_a_copy(
            "it records no shard map (an empty database?)".into(),
        ));
    };
    if usize::try_from(recorded_index).ok() != Some(shard.index)
        || usize::try_from(recorded_count).ok() != Some(count)
    {
        return Err(not_a_copy(format!(
            "it records that it is shard {recorded_index} of {recorded_count}"
        )));
    }
    check_versions(std::slice::from_ref(shard)).await?;
    let last = store::reshard::history(shard).await?.pop();
    if let (Some(want), Some(got)) = (reference, last.as_ref()) {
        if (got.epoch, &got.ranges) != (want.epoch, &want.ranges) {
            return Err(not_a_copy(format!(
                "it records map epoch {}, the other shards epoch {} (a copy taken before the \
                 last move, or another fleet's database)",
                got.epoch, want.epoch
            )));
        }
    }
    Ok(())
}
