//! The map itself: ranges of shard keys at an epoch, and their checks.

use crate::router::SHARD_KEY_SPACE;

/// One range of shard keys, `first_key..end_key`, held by one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRange {
    /// First key of the range (inclusive).
    pub first_key: i32,
    /// End of the range (exclusive).
    pub end_key: i32,
    /// The shard holding it: an index into the configured shard list.
    pub shard_index: usize,
}

/// A whole map at one epoch: ranges sorted by first key, tiling
/// `0..SHARD_KEY_SPACE` with no gap or overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    epoch: i32,
    shard_count: usize,
    ranges: Vec<KeyRange>,
}

/// Why a set of ranges is not a map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The ranges leave keys unmapped or map some twice.
    #[error(
        "epoch {epoch}: the ranges do not tile the shard keys 0..{SHARD_KEY_SPACE}: {problem}"
    )]
    NotTiled {
        /// The epoch.
        epoch: i32,
        /// The first gap or overlap found.
        problem: String,
    },
    /// A range names a shard outside the list.
    #[error("epoch {epoch}: range {first_key}..{end_key} names shard {shard_index}, but the map has {shard_count} shards")]
    NoSuchShard {
        /// The epoch.
        epoch: i32,
        /// The range's first key.
        first_key: i32,
        /// The range's end.
        end_key: i32,
        /// The shard it names.
        shard_index: usize,
        /// Shards in the map.
        shard_count: usize,
    },
}

impl ShardMap {
    /// A map of `ranges` (in any order) over `shard_count` shards at
    /// `epoch`.
    ///
    /// # Errors
    ///
    /// [`MapError`] when the ranges do not tile the key space exactly or
    /// name a shard outside `0..shard_count`.
    pub fn new(
        epoch: i32,
        shard_count: usize,
        mut ranges: Vec<KeyRange>,
    ) -> Result<ShardMap, MapError> {
        ranges.sort_by_key(|r| r.first_key);
        let mut next = 0;
        for r in &ranges {
            let not_tiled = |problem: String| MapError::NotTiled { epoch, problem };
            if r.first_key != next {
                return Err(not_tiled(format!(
                    "range {}..{} follows keys up to {next}",
                    r.first_key, r.end_key
                )));
            }
            if r.end_key <= r.first_key {
                return Err(not_tiled(format!(
                    "range {}..{} is empty",
                    r.first_key, r.end_key
                )));
            }
            if r.shard_index >= shard_count {
                return Err(MapError::NoSuchShard {
                    epoch,
                    first_key: r.first_key,
                    end_key: r.end_key,
                    shard_index: r.shard_index,
                    shard_count,
                });
            }
            next = r.end_key;
        }
        if next != SHARD_KEY_SPACE as i32 {
            return Err(MapError::NotTiled {
                epoch,
                problem: format!("the keys from {next} on have no shard"),
            });
        }
        Ok(ShardMap {
            epoch,
            shard_count,
            ranges,
        })
    }

    /// Epoch 1 of a list of `shard_count` shards: the ranges of the formula
    /// `shard_key * shard_count / 65536`, shard i holding
    /// `ceil(i * 65536 / n) .. ceil((i + 1) * 65536 / n)`. `shard_count` is
    /// at least 1 and at most the key space (a validated config's).
    pub fn from_formula(shard_count: usize) -> ShardMap {
        let n = shard_count.clamp(1, SHARD_KEY_SPACE as usize) as u64;
        let bound = |i: u64| (i * u64::from(SHARD_KEY_SPACE)).div_ceil(n) as i32;
        let ranges = (0..n)
            .map(|i| KeyRange {
                first_key: bound(i),
                end_key: bound(i + 1),
                shard_index: i as usize,
            })
            .collect();
        ShardMap {
            epoch: 1,
            shard_count: n as usize,
            ranges,
        }
    }

    /// The map's epoch.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// The number of shards the map spreads the keys over.
    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    /// The ranges, by first key.
    pub fn ranges(&self) -> &[KeyRange] {
        &self.ranges
    }

    /// The index of the shard holding `shard_key` (in `0..SHARD_KEY_SPACE`).
    pub fn shard_for(&self, shard_key: i32) -> usize {
        debug_assert!((0..SHARD_KEY_SPACE as i32).contains(&shard_key));
        // The last range starting at or before the key: ranges tile, so it
        // holds the key.
        let at = self
            .ranges
            .partition_point(|r| r.first_key <= shard_key)
            .saturating_sub(1);
        self.ranges[at].shard_index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::shard_index;

    #[test]
    fn the_formula_map_routes_every_key_as_the_formula() {
        for n in 1..=7 {
            let map = ShardMap::from_formula(n);
            assert_eq!(map.epoch(), 1);
            assert_eq!(ShardMap::new(1, n, map.ranges().to_vec()), Ok(map.clone()));
            for k in 0..SHARD_KEY_SPACE as i32 {
                assert_eq!(map.shard_for(k), shard_index(k, n), "n={n} k={k}");
            }
        }
    }

    #[test]
    fn ranges_that_do_not_tile_are_refused() {
        let range = |first_key, end_key, shard_index| KeyRange {
            first_key,
            end_key,
            shard_index,
        };
        let gap = vec![range(0, 100, 0), range(101, 65536, 1)];
        assert!(matches!(
            ShardMap::new(2, 2, gap),
            Err(MapError::NotTiled { .. })
        ));
        let overlap = vec![range(0, 100, 0), range(99, 65536, 1)];
        assert!(matches!(
            ShardMap::new(2, 2, overlap),
            Err(MapError::NotTiled { .. })
        ));
        let short = vec![range(0, 65535, 0)];
        assert!(matches!(
            ShardMap::new(2, 1, short),
            Err(MapError::NotTiled { .. })
        ));
        assert!(matches!(
            ShardMap::new(2, 1, Vec::new()),
            Err(MapError::NotTiled { .. })
        ));
        let outside = vec![range(0, 65536, 1)];
        assert!(matches!(
            ShardMap::new(2, 1, outside),
            Err(MapError::NoSuchShard { .. })
        ));
        // Given out of order, a split map is sorted and routes by range.
        let split = vec![range(30000, 65536, 0), range(0, 30000, 1)];
        let map = ShardMap::new(2, 2, split).expect("a map");
        assert_eq!((map.shard_for(0), map.shard_for(29999)), (1, 1));
        assert_eq!((map.shard_for(30000), map.shard_for(65535)), (0, 0));
    }
}
