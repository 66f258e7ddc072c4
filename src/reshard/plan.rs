//! Planning a reshard: from the ranges of the current map to ranges over a
//! new number of shards, moving as few keys as it can.
//!
//! Each shard of the new list gets an equal share of the 65,536 shard keys
//! (the first `65536 % n` one more). A shard that holds more than its share
//! keeps its lowest keys and gives up the rest; a shard leaving the list
//! gives up everything; the keys given up go, in key order, to the shards
//! holding less than their share. No other key moves.

use crate::router::SHARD_KEY_SPACE;
use crate::shard_map::{EpochRecord, KeyRange, MoveRow};

/// A range of shard keys that changes shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeMove {
    /// First shard key.
    pub first_key: i32,
    /// One past the last.
    pub end_key: i32,
    /// The shard it leaves.
    pub from_index: usize,
    /// The shard it goes to.
    pub to_index: usize,
}

/// The ranges of the new map and the moves that get there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The new map's ranges, by first key, adjacent ranges of one shard
    /// joined.
    pub ranges: Vec<KeyRange>,
    /// The ranges that change shard, by first key.
    pub moves: Vec<RangeMove>,
}

impl Plan {
    /// The map epoch `epoch` over `shard_count` shards this plan makes,
    /// every move `closed` (as the command records it first).
    pub fn record(&self, epoch: i32, shard_count: usize) -> EpochRecord {
        EpochRecord {
            epoch,
            shard_count: i32::try_from(shard_count).unwrap_or(i32::MAX),
            ranges: self.ranges.clone(),
            moves: self
                .moves
                .iter()
                .map(|m| MoveRow {
                    first_key: m.first_key,
                    end_key: m.end_key,
                    from_index: m.from_index,
                    to_index: m.to_index,
                    state: "closed".into(),
                })
                .collect(),
        }
    }
}

/// The keys each of `shard_count` shards should hold.
fn shares(shard_count: usize) -> Vec<i64> {
    let n = shard_count as i64;
    let space = i64::from(SHARD_KEY_SPACE);
    (0..n)
        .map(|i| space / n + i64::from(i < space % n))
        .collect()
}

/// Plans the move from `current` (a map's ranges, any order) to a list of
/// `shard_count` shards. Indices below `shard_count` are the same shards in
/// both lists; the current map's shards at or above it leave.
///
/// # Panics
///
/// When `shard_count` is 0.
pub fn plan(current: &[KeyRange], shard_count: usize) -> Plan {
    assert!(shard_count > 0, "a list has at least one shard");
    let share = shares(shard_count);
    let mut ranges: Vec<KeyRange> = current.to_vec();
    ranges.sort_by_key(|r| r.first_key);
    let mut held = vec![0i64; shard_count];
    let mut kept = Vec::new();
    let mut given_up = Vec::new();
    for r in ranges {
        let len = i64::from(r.end_key - r.first_key);
        let room = if r.shard_index < shard_count {
            (share[r.shard_index] - held[r.shard_index]).max(0)
        } else {
            0
        };
        let keep = room.min(len);
        if keep > 0 {
            held[r.shard_index] += keep;
            kept.push(KeyRange {
                end_key: r.first_key + keep as i32,
                ..r
            });
        }
        if keep < len {
            given_up.push(KeyRange {
                first_key: r.first_key + keep as i32,
                ..r
            });
        }
    }
    let mut moves = Vec::new();
    let mut pieces = given_up.into_iter();
    let mut piece = pieces.next();
    for to in 0..shard_count {
        while held[to] < share[to] {
            let Some(p) = piece.as_mut() else { break };
            let take = (share[to] - held[to]).min(i64::from(p.end_key - p.first_key));
            let end = p.first_key + take as i32;
            moves.push(RangeMove {
                first_key: p.first_key,
                end_key: end,
                from_index: p.shard_index,
                to_index: to,
            });
            kept.push(KeyRange {
                first_key: p.first_key,
                end_key: end,
                shard_index: to,
            });
            held[to] += take;
            p.first_key = end;
            if p.first_key == p.end_key {
                piece = pieces.next();
            }
        }
    }
    moves.sort_by_key(|m| m.first_key);
    Plan {
        ranges: joined(kept),
        moves: joined_moves(moves),
    }
}

/// `ranges` by first key, adjacent ranges of one shard as one.
fn joined(mut ranges: Vec<KeyRange>) -> Vec<KeyRange> {
    ranges.sort_by_key(|r| r.first_key);
    let mut out: Vec<KeyRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.end_key == r.first_key && last.shard_index == r.shard_index => {
                last.end_key = r.end_key;
            }
            _ => out.push(r),
        }
    }
    out
}

/// `moves` (by first key), adjacent moves between the same shards as one.
fn joined_moves(moves: Vec<RangeMove>) -> Vec<RangeMove> {
    let mut out: Vec<RangeMove> = Vec::with_capacity(moves.len());
    for m in moves {
        match out.last_mut() {
            Some(last)
                if last.end_key == m.first_key
                    && last.from_index == m.from_index
                    && last.to_index == m.to_index =>
            {
                last.end_key = m.end_key;
            }
            _ => out.push(m),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard_map::ShardMap;

    fn owner(ranges: &[KeyRange], key: i32) -> usize {
        ranges
            .iter()
            .find(|r| r.first_key <= key && key < r.end_key)
            .expect("tiled")
            .shard_index
    }

    /// Every key is mapped once, each shard holds its share, and a key
    /// changes shard exactly when a move names it.
    fn check(from: &[KeyRange], count: usize) -> Plan {
        let plan = plan(from, count);
        ShardMap::new(2, count, plan.ranges.clone()).expect("the new ranges tile the keys");
        let share = shares(count);
        for (i, want) in share.iter().enumerate() {
            let got: i64 = plan
                .ranges
                .iter()
                .filter(|r| r.shard_index == i)
                .map(|r| i64::from(r.end_key - r.first_key))
                .sum();
            assert_eq!(got, *want, "shard {i} holds its share");
        }
        for key in 0..SHARD_KEY_SPACE as i32 {
            let (before, after) = (owner(from, key), owner(&plan.ranges, key));
            let moved = plan
                .moves
                .iter()
                .find(|m| m.first_key <= key && key < m.end_key);
            match moved {
                Some(m) => {
                    assert_eq!((m.from_index, m.to_index), (before, after), "key {key}");
                    assert_ne!(before, after, "key {key} moves to where it is");
                }
                None => assert_eq!(before, after, "key {key} changed shard with no move"),
            }
        }
        plan
    }

    #[test]
    fn two_to_four_moves_half_of_each_shard_and_nothing_else() {
        let plan = check(ShardMap::from_formula(2).ranges(), 4);
        let moved: i32 = plan.moves.iter().map(|m| m.end_key - m.first_key).sum();
        assert_eq!(moved, 32_768, "half the keys move, no more");
        assert!(plan.moves.iter().all(|m| m.to_index >= 2));
    }

    #[test]
    fn four_to_three_moves_only_the_leaving_shards_keys() {
        let plan = check(ShardMap::from_formula(4).ranges(), 3);
        assert!(plan.moves.iter().all(|m| m.from_index == 3));
        let moved: i32 = plan.moves.iter().map(|m| m.end_key - m.first_key).sum();
        assert_eq!(moved, 16_384);
    }

    #[test]
    fn the_same_count_moves_nothing_and_uneven_maps_even_out() {
        assert!(check(ShardMap::from_formula(3).ranges(), 3)
            .moves
            .is_empty());
        let grown = check(ShardMap::from_formula(2).ranges(), 3);
        let again = check(&grown.ranges, 5);
        check(&again.ranges, 1);
    }
}
