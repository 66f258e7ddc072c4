//! Loading the shard map from the shards into the set's
//! [`RoutingMap`](crate::shard_map::RoutingMap).

use crate::shard_map::{MapError, ShardMap};
use crate::shards::{ShardError, ShardSet};
use crate::store::map::{self, RecordedMap};
use futures_util::future::join_all;
use std::sync::Arc;

/// Why the shard map could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum MapLoadError {
    /// A shard could not be read.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// A shard records no versioned map.
    #[error(
        "shard `{shard}` records no shard map epoch; run `shardq migrate` with the full shard list"
    )]
    Missing {
        /// Shard name.
        shard: String,
    },
    /// A shard's ranges are not a map.
    #[error("shard `{shard}`: its shard map is invalid")]
    Invalid {
        /// Shard name.
        shard: String,
        /// What is wrong.
        #[source]
        source: MapError,
    },
    /// Two shards record different ranges for the same epoch.
    #[error(
        "shards `{first}` and `{second}` record different ranges for map epoch {epoch}; \
         the shard list is inconsistent: compare their shardq_map_ranges"
    )]
    Disagree {
        /// The epoch.
        epoch: i32,
        /// One shard.
        first: String,
        /// The other.
        second: String,
    },
    /// The map spreads the keys over more shards than listed.
    #[error(
        "the shard map (epoch {epoch}, from shard `{shard}`) has {map_count} shards, the \
         configured list {configured}; configure the list the shards were migrated or \
         resharded to"
    )]
    CountMismatch {
        /// The epoch.
        epoch: i32,
        /// The shard it came from.
        shard: String,
        /// Shards in the map.
        map_count: usize,
        /// Shards configured.
        configured: usize,
    },
}

// The map's side of the shard set: kept here, beside the loading.
impl ShardSet {
    /// Reads the shard map from every shard and routes by its highest epoch
    /// from now on.
    ///
    /// # Errors
    ///
    /// [`MapLoadError`] when no shard answers or the shards' maps are
    /// missing, invalid or disagree.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    #[doc(hidden)]
    pub async fn load_map(&self) -> Result<Arc<ShardMap>, MapLoadError> {
        load(self).await
    }

    /// The loaded shard map, loading it first when this set has not yet.
    ///
    /// # Errors
    ///
    /// As [`ShardSet::load_map`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    #[doc(hidden)]
    pub async fn loaded_map(&self) -> Result<Arc<ShardMap>, MapLoadError> {
        if self.routing().loaded() {
            return Ok(self.routing().get());
        }
        self.load_map().await
    }
}

/// Reads the map of every shard of `shards`, in parallel, and routes
/// `shards` by the highest epoch found from now on. Returns that map.
///
/// A shard still at an older epoch is not an error (a new epoch is written
/// shard by shard), nor one that does not answer (the others' map is
/// taken); two shards with different ranges at the same epoch are.
///
/// # Errors
///
/// [`MapLoadError`]: no shard answered, a shard without a map, an invalid
/// map, shards that disagree, or a map over another number of shards.
///
/// # Cancel safety
///
/// Cancel safe (reads; the map is replaced only at the end).
pub(crate) async fn load(shards: &ShardSet) -> Result<Arc<ShardMap>, MapLoadError> {
    // A read whose reply was lost (a connection cut, a deadline) says
    // nothing about the map: try again, a few times, before the caller's
    // enqueue fails for it. Data errors and missing or disagreeing maps
    // repeat identically and are returned at once.
    let mut pause = LOAD_RETRY_PAUSE;
    for _ in 1..LOAD_TRIES {
        match load_once(shards).await {
            Err(MapLoadError::Shard(err)) if !err.is_permanent() => {
                tracing::debug!(error = %crate::error_chain::error_chain(&err), "shard map read failed; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            done => return done,
        }
    }
    load_once(shards).await
}

/// Tries of [`load`] when no shard answered, and the first pause between them.
const LOAD_TRIES: u32 = 4;
const LOAD_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// One read of every shard's map (see [`load`]).
async fn load_once(shards: &ShardSet) -> Result<Arc<ShardMap>, MapLoadError> {
    let reads = shards
        .all()
        .iter()
        .map(|shard| async move { (shard.name.clone(), map::current(shard).await) });
    let mut newest: Option<(String, RecordedMap)> = None;
    let mut unreachable = None;
    let mut missing = None;
    for (name, recorded) in join_all(reads).await {
        // A shard down must not stop enqueues to the others: the map of
        // those that answer is the map (each write is fenced by the shard
        // it goes to, so a newer epoch on the silent one is found there).
        let recorded = match recorded {
            Ok(recorded) => recorded,
            Err(err) => {
                tracing::warn!(shard = %name, error = %crate::error_chain::error_chain(&err),
                    "cannot read the shard map of this shard; loading it from the others");
                unreachable.get_or_insert(err);
                continue;
            }
        };
        // A shard with no map yet joins the list (`shardq reshard` records
        // it there); its writes are fenced, and refused until it has one.
        let Some(recorded) = recorded else {
            missing.get_or_insert(name);
            continue;
        };
        match &newest {
            Some((first, held)) if held.epoch == recorded.epoch && *held != recorded => {
                return Err(MapLoadError::Disagree {
                    epoch: recorded.epoch,
                    first: first.clone(),
                    second: name,
                });
            }
            Some((_, held)) if held.epoch >= recorded.epoch => {}
            _ => newest = Some((name, recorded)),
        }
    }
    let Some((shard, recorded)) = newest else {
        if let Some(shard) = missing {
            return Err(MapLoadError::Missing { shard });
        }
        return Err(MapLoadError::Shard(
            unreachable.expect("a validated config lists shards"),
        ));
    };
    let epoch = recorded.epoch;
    let map = ShardMap::new(epoch, recorded.shard_count, recorded.ranges).map_err(|source| {
        MapLoadError::Invalid {
            shard: shard.clone(),
            source,
        }
    })?;
    // A longer list is fine: after a reshard to fewer shards, a process
    // still configured with the old list routes only to the shards the map
    // names (and those it lists beyond them hold no range).
    if map.shard_count() > shards.len() {
        return Err(MapLoadError::CountMismatch {
            epoch,
            shard,
            map_count: map.shard_count(),
            configured: shards.len(),
        });
    }
    Ok(shards.routing().set(map))
}
