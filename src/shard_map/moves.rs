//! The moves recorded with an epoch (`shardq_map_moves`): the ranges that
//! `shardq reshard` moves to make it.

use super::map::KeyRange;

/// One range move as recorded with its epoch (`shardq_map_moves`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveRow {
    /// First shard key of the range.
    pub first_key: i32,
    /// One past its last shard key.
    pub end_key: i32,
    /// The shard it leaves.
    pub from_index: usize,
    /// The shard it goes to.
    pub to_index: usize,
    /// `closed`, `holding` or `released` (as the new shard records it).
    pub state: String,
}

/// An epoch of the map with its ranges and moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochRecord {
    /// The epoch.
    pub epoch: i32,
    /// Shards in its list.
    pub shard_count: i32,
    /// Its ranges, by first key.
    pub ranges: Vec<KeyRange>,
    /// The moves that made it.
    pub moves: Vec<MoveRow>,
}
