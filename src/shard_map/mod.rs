//! The versioned shard map: which shard holds each shard key, by explicit
//! ranges, at an epoch.
//!
//! Every shard records the map (`shardq_map_epochs`, `shardq_map_ranges`,
//! migration 17); the highest epoch is the current one. Epoch 1 is the
//! formula of [`crate::router::shard_index`] written out as ranges, so an
//! upgraded fleet routes every key where it did before. A later epoch may
//! split and move ranges; a shard refuses a write routed by an older epoch
//! (SQLSTATE SQ004) and the caller reloads the map.

mod map;
mod moves;
mod routing;

pub use map::{KeyRange, MapError, ShardMap};
pub use moves::{EpochRecord, MoveRow};
pub use routing::RoutingMap;
