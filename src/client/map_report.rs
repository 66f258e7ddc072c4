//! The shard map as `shardq shards show` prints it: the epoch, each range
//! and its shard, and the unfinished jobs of each range on each shard.

use super::error::ClientError;
use super::handle::Client;
use crate::store::map;
use futures_util::future::join_all;
use serde::Serialize;
use std::collections::BTreeMap;

/// The current shard map with the unfinished jobs of each range.
#[derive(Debug, Clone, Serialize)]
pub struct MapReport {
    /// The map's epoch.
    pub epoch: i32,
    /// Shards in the map.
    pub shard_count: usize,
    /// The ranges, by first key.
    pub ranges: Vec<RangeReport>,
    /// Shards whose jobs could not be counted, with the error.
    pub unreachable: Vec<ShardProblem>,
}

/// One range of the map.
#[derive(Debug, Clone, Serialize)]
pub struct RangeReport {
    /// First key (inclusive).
    pub first_key: i32,
    /// End key (exclusive).
    pub end_key: i32,
    /// The name of the shard holding the range.
    pub shard: String,
    /// Unfinished jobs (waiting, scheduled, queued, running) with keys in
    /// the range, by the shard they are on: only the range's own shard,
    /// unless rows were written by another map.
    pub unfinished: BTreeMap<String, i64>,
}

/// A shard that did not answer.
#[derive(Debug, Clone, Serialize)]
pub struct ShardProblem {
    /// Shard name.
    pub shard: String,
    /// The error chain.
    pub error: String,
}

impl Client {
    /// Loads the shard map from the shards and counts each range's
    /// unfinished jobs on every shard (one scan per shard, in parallel).
    ///
    /// # Errors
    ///
    /// [`ClientError::Map`] when the map cannot be loaded; a shard that
    /// fails the count is listed in [`MapReport::unreachable`] instead.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads only).
    #[doc(hidden)]
    pub async fn map_report(&self) -> Result<MapReport, ClientError> {
        let map = self.shards.load_map().await?;
        let mut ranges: Vec<RangeReport> = map
            .ranges()
            .iter()
            .map(|r| RangeReport {
                first_key: r.first_key,
                end_key: r.end_key,
                shard: self.shards.get(r.shard_index).name.clone(),
                unfinished: BTreeMap::new(),
            })
            .collect();
        let counts = join_all(self.shards.all().iter().map(map::unfinished_by_key)).await;
        let mut unreachable = Vec::new();
        for (shard, counted) in self.shards.all().iter().zip(counts) {
            let by_key = match counted {
                Ok(by_key) => by_key,
                Err(e) => {
                    unreachable.push(ShardProblem {
                        shard: shard.name.clone(),
                        error: crate::error_chain::error_chain(&e),
                    });
                    continue;
                }
            };
            for (key, n) in by_key {
                let at = ranges
                    .partition_point(|r| r.first_key <= key)
                    .saturating_sub(1);
                *ranges[at].unfinished.entry(shard.name.clone()).or_default() += n;
            }
        }
        Ok(MapReport {
            epoch: map.epoch(),
            shard_count: map.shard_count(),
            ranges,
            unreachable,
        })
    }
}
