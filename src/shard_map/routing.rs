//! The map one process routes by, replaced when a newer epoch is loaded.

use super::map::ShardMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// The map a process routes by, shared by every clone of its [`ShardSet`](crate::shards::ShardSet):
/// the formula's epoch 1 until the shards' map replaces it ([`crate::ShardSet::load_map`]).
#[derive(Debug)]
pub struct RoutingMap {
    current: RwLock<Arc<ShardMap>>,
    loaded: AtomicBool,
}

impl RoutingMap {
    /// The formula's map for `shard_count` shards, not loaded yet.
    pub fn formula(shard_count: usize) -> RoutingMap {
        RoutingMap {
            current: RwLock::new(Arc::new(ShardMap::from_formula(shard_count))),
            loaded: AtomicBool::new(false),
        }
    }

    /// The map routed by now.
    pub fn get(&self) -> Arc<ShardMap> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether a map was loaded from the shards.
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Routes by `map` from now on, unless a newer epoch is held already
    /// (two reloads racing).
    pub(crate) fn set(&self, map: ShardMap) -> Arc<ShardMap> {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if !self.loaded() || map.epoch() >= current.epoch() {
            *current = Arc::new(map);
        }
        self.loaded.store(true, Ordering::Release);
        Arc::clone(&current)
    }
}
