//! Every advisory lock shardq takes, in one place.
//!
//! All but the migration lock are transaction-level (released at commit, so
//! they work through transaction-pooling proxies).
//!
//! - Dequeue slots of queue `q`: `(dequeue_class(q), slot)` for `slot` in
//!   `0..K`; the class is the low 32 bits of FNV-1a-64 of `"shardq:dequeue:" + q`.
//! - Per-shard upkeep: `(maintenance_class(), slot)` with the slots below, so
//!   one process at a time recovers, promotes or deletes on a shard.
//! - Ordering keys: one bigint lock per (queue, key), taken by the SQL
//!   functions `shardq_key_lock`, `shardq_lock_keys` and `shardq_claim`
//!   (`migrations/functions/`).
//!   The map's epochs: `(maintenance_class(), MAP_SLOT)`, shared by every
//!   enqueue, exclusive for a writer of a new epoch.
//! - Groups: one bigint lock per (queue, group), `shardq_key_lock` of the
//!   group's name after `chr(30)`, tried by claims under group limits.
//! - Ready floors: one bigint lock, `hashtext('shardq_ready_floors')`, tried
//!   by the claim that moves a shard's floors and rounds
//!   (`shardq_advance_ready_floors`); migration 47 waits for it, so no move
//!   commits between its copy of the floors and the old tables' drop.
//! - A queue's grouped rounds row: one bigint lock per queue,
//!   `hashtextextended('shardq_group_rounds' || chr(31) || queue, 8)`, tried
//!   by the claim that makes the row (`shardq_group_floor`).
//! - Migrations: [`MIGRATION`], one bigint key.

use crate::router::fnv1a64;

/// The advisory-lock class of queue `queue`'s dequeue slots.
pub fn dequeue_class(queue: &str) -> i32 {
    fnv1a64(format!("shardq:dequeue:{queue}").as_bytes()) as u32 as i32
}

/// The advisory-lock class of per-shard upkeep.
pub fn maintenance_class() -> i32 {
    fnv1a64(b"shardq:maintenance") as u32 as i32
}

/// Upkeep slot: recovery of expired leases.
pub const RECOVERY_SLOT: i32 = 0;
/// Upkeep slot: promotion of due scheduled jobs.
pub const PROMOTION_SLOT: i32 = 1;
/// Upkeep slot: deletion of old finished jobs.
pub const RETENTION_SLOT: i32 = 2;
/// The shard map's epochs: every enqueue's epoch check
/// (`shardq_check_route`) takes it shared, a writer of a new epoch
/// exclusive, so no enqueue routed by the old epoch commits after it.
pub const MAP_SLOT: i32 = 3;
/// A range moving in: `shardq reshard` holds it (for its session) while it
/// copies the range's deduplication ids; enqueues of a range still `closed`
/// wait on it (`shardq_hold_moving`).
pub const MOVE_SLOT: i32 = 4;

/// Upkeep slot: ending workflows past their deadline (`NewJob::timeout`).
pub const DEADLINE_SLOT: i32 = 5;

/// Upkeep slot: moving the lease floor (`shardq_lease_floor_moves`): one
/// move at a time numbers its rows.
pub const LEASE_FLOOR_SLOT: i32 = 6;

/// Serialises migration runs on one shard.
pub const MIGRATION: i64 = 0x7368_6172_6471_0001;

#[cfg(test)]
mod tests {
    /// `shardq_check_route` (migrations/functions/) spells the class out.
    #[test]
    fn the_map_lock_class_is_the_one_sql_takes() {
        assert_eq!(super::maintenance_class(), -1457378061);
        let sql = include_str!("../../migrations/functions/shardq_check_route.sql");
        assert!(sql.contains("pg_advisory_xact_lock_shared(-1457378061, 3)"));
        assert_eq!(super::MAP_SLOT, 3);
        let hold = include_str!("../../migrations/functions/shardq_hold_moving.sql");
        assert!(hold.contains("pg_advisory_xact_lock_shared(-1457378061, 3)"));
        assert!(hold.contains("pg_advisory_xact_lock_shared(-1457378061, 4)"));
        assert_eq!(super::MOVE_SLOT, 4);
    }
}
