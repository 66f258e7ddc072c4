//! The migrations this binary knows, in order: a leaf the runner, the lint
//! and the tests read.

/// The first line that marks a migration to run statement by statement,
/// outside a transaction ([`no_transaction`](super::no_transaction)).
pub(crate) const MARKER: &str = "-- shardq:no-transaction";

/// The first line that marks a migration after which the old server-side
/// functions would fail (it drops or replaces what they write): the
/// functions whose text changed are applied in its transaction, not only
/// with the last migration of the run, so no later migration of the same
/// run (a concurrent index build may take minutes) runs beside them. Every
/// function file must then apply to the schema as that migration leaves it
/// (the current texts are applied there, not the ones of its day).
pub(crate) const FUNCTIONS_MARKER: &str = "-- shardq:functions-with-this";

/// One migration file.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version, ascending from 1.
    pub version: i32,
    /// File name.
    pub name: &'static str,
    /// SQL text.
    pub sql: &'static str,
}

impl Migration {
    /// Whether the migration runs in one transaction (no
    /// `-- shardq:no-transaction` first line).
    pub fn runs_in_transaction(&self) -> bool {
        self.sql.lines().next().map(str::trim) != Some(MARKER)
    }

    /// Whether the functions whose text changed are applied in this
    /// migration's transaction ([`FUNCTIONS_MARKER`] first line).
    pub fn applies_functions(&self) -> bool {
        self.sql.lines().next().map(str::trim) == Some(FUNCTIONS_MARKER)
    }
}

/// All migrations this binary knows, in order. From version 6 on, a
/// migration must not hold a lock that stops the fleet while it scans or
/// builds: a test lints each (`no_transaction::lint`).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_init.sql",
        sql: include_str!("../../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "0002_key_order.sql",
        sql: include_str!("../../migrations/0002_key_order.sql"),
    },
    Migration {
        version: 3,
        name: "0003_lifecycle.sql",
        sql: include_str!("../../migrations/0003_lifecycle.sql"),
    },
    Migration {
        version: 4,
        name: "0004_key_exclusion.sql",
        sql: include_str!("../../migrations/0004_key_exclusion.sql"),
    },
    Migration {
        version: 5,
        name: "0005_shard_map.sql",
        sql: include_str!("../../migrations/0005_shard_map.sql"),
    },
    Migration {
        version: 6,
        name: "0006_queue_activity.sql",
        sql: include_str!("../../migrations/0006_queue_activity.sql"),
    },
    Migration {
        version: 7,
        name: "0007_pause.sql",
        sql: include_str!("../../migrations/0007_pause.sql"),
    },
    Migration {
        version: 8,
        name: "0008_schedules.sql",
        sql: include_str!("../../migrations/0008_schedules.sql"),
    },
    Migration {
        version: 9,
        name: "0009_workers.sql",
        sql: include_str!("../../migrations/0009_workers.sql"),
    },
    Migration {
        version: 10,
        name: "0010_fillfactor.sql",
        sql: include_str!("../../migrations/0010_fillfactor.sql"),
    },
    Migration {
        version: 11,
        name: "0011_claim_by_tid.sql",
        sql: include_str!("../../migrations/0011_claim_by_tid.sql"),
    },
    Migration {
        version: 12,
        name: "0012_claim_plans_once.sql",
        sql: include_str!("../../migrations/0012_claim_plans_once.sql"),
    },
    Migration {
        version: 13,
        name: "0013_primary_key_by_id.sql",
        sql: include_str!("../../migrations/0013_primary_key_by_id.sql"),
    },
    Migration {
        version: 14,
        name: "0014_complete_plans_once.sql",
        sql: include_str!("../../migrations/0014_complete_plans_once.sql"),
    },
    Migration {
        version: 15,
        name: "0015_backoff_capped.sql",
        sql: include_str!("../../migrations/0015_backoff_capped.sql"),
    },
    Migration {
        version: 16,
        name: "0016_retry_safe_writes.sql",
        sql: include_str!("../../migrations/0016_retry_safe_writes.sql"),
    },
    Migration {
        version: 17,
        name: "0017_map_epochs.sql",
        sql: include_str!("../../migrations/0017_map_epochs.sql"),
    },
    Migration {
        version: 18,
        name: "0018_reshard_indexes.sql",
        sql: include_str!("../../migrations/0018_reshard_indexes.sql"),
    },
    Migration {
        version: 19,
        name: "0019_reshard.sql",
        sql: include_str!("../../migrations/0019_reshard.sql"),
    },
    Migration {
        version: 20,
        name: "0020_map_change_mark.sql",
        sql: include_str!("../../migrations/0020_map_change_mark.sql"),
    },
    Migration {
        version: 21,
        name: "0021_queue_limits.sql",
        sql: include_str!("../../migrations/0021_queue_limits.sql"),
    },
    Migration {
        version: 22,
        name: "0022_job_groups.sql",
        sql: include_str!("../../migrations/0022_job_groups.sql"),
    },
    Migration {
        version: 23,
        name: "0023_group_indexes.sql",
        sql: include_str!("../../migrations/0023_group_indexes.sql"),
    },
    Migration {
        version: 24,
        name: "0024_enqueue_group.sql",
        sql: include_str!("../../migrations/0024_enqueue_group.sql"),
    },
    Migration {
        version: 25,
        name: "0025_failed_by_queue.sql",
        sql: include_str!("../../migrations/0025_failed_by_queue.sql"),
    },
    Migration {
        version: 26,
        name: "0026_worker_claim_time.sql",
        sql: include_str!("../../migrations/0026_worker_claim_time.sql"),
    },
    Migration {
        version: 27,
        name: "0027_ready_order.sql",
        sql: include_str!("../../migrations/0027_ready_order.sql"),
    },
    Migration {
        version: 28,
        name: "0028_ready_order_index.sql",
        sql: include_str!("../../migrations/0028_ready_order_index.sql"),
    },
    Migration {
        version: 29,
        name: "0029_ready_order_switch.sql",
        sql: include_str!("../../migrations/0029_ready_order_switch.sql"),
    },
    Migration {
        version: 30,
        name: "0030_claim_result.sql",
        sql: include_str!("../../migrations/0030_claim_result.sql"),
    },
    Migration {
        version: 31,
        name: "0031_workflow_messages.sql",
        sql: include_str!("../../migrations/0031_workflow_messages.sql"),
    },
    Migration {
        version: 32,
        name: "0032_workflow_events.sql",
        sql: include_str!("../../migrations/0032_workflow_events.sql"),
    },
    Migration {
        version: 33,
        name: "0033_child_workflows.sql",
        sql: include_str!("../../migrations/0033_child_workflows.sql"),
    },
    Migration {
        version: 34,
        name: "0034_debounce.sql",
        sql: include_str!("../../migrations/0034_debounce.sql"),
    },
    Migration {
        version: 35,
        name: "0035_parked_workflows.sql",
        sql: include_str!("../../migrations/0035_parked_workflows.sql"),
    },
    Migration {
        version: 36,
        name: "0036_deadlines.sql",
        sql: include_str!("../../migrations/0036_deadlines.sql"),
    },
    Migration {
        version: 37,
        name: "0037_keyed_ready_order.sql",
        sql: include_str!("../../migrations/0037_keyed_ready_order.sql"),
    },
    Migration {
        version: 38,
        name: "0038_keyed_ready_index.sql",
        sql: include_str!("../../migrations/0038_keyed_ready_index.sql"),
    },
    Migration {
        version: 39,
        name: "0039_relay_leases.sql",
        sql: include_str!("../../migrations/0039_relay_leases.sql"),
    },
    Migration {
        version: 40,
        name: "0040_cascades_owed.sql",
        sql: include_str!("../../migrations/0040_cascades_owed.sql"),
    },
    Migration {
        version: 41,
        name: "0041_group_turns.sql",
        sql: include_str!("../../migrations/0041_group_turns.sql"),
    },
    Migration {
        version: 42,
        name: "0042_group_turn_index.sql",
        sql: include_str!("../../migrations/0042_group_turn_index.sql"),
    },
    Migration {
        version: 43,
        name: "0043_grouped_index_roles.sql",
        sql: include_str!("../../migrations/0043_grouped_index_roles.sql"),
    },
    Migration {
        version: 44,
        name: "0044_key_floors.sql",
        sql: include_str!("../../migrations/0044_key_floors.sql"),
    },
    Migration {
        version: 45,
        name: "0045_key_index_role.sql",
        sql: include_str!("../../migrations/0045_key_index_role.sql"),
    },
    Migration {
        version: 46,
        name: "0046_one_group_line_index.sql",
        sql: include_str!("../../migrations/0046_one_group_line_index.sql"),
    },
    Migration {
        version: 47,
        name: "0047_floors_and_rounds_as_moves.sql",
        sql: include_str!("../../migrations/0047_floors_and_rounds_as_moves.sql"),
    },
    Migration {
        version: 48,
        name: "0048_limits_as_moves.sql",
        sql: include_str!("../../migrations/0048_limits_as_moves.sql"),
    },
    Migration {
        version: 49,
        name: "0049_ready_barrier_as_moves.sql",
        sql: include_str!("../../migrations/0049_ready_barrier_as_moves.sql"),
    },
    Migration {
        version: 50,
        name: "0050_group_buckets_as_moves.sql",
        sql: include_str!("../../migrations/0050_group_buckets_as_moves.sql"),
    },
    Migration {
        version: 51,
        name: "0051_lease_floor.sql",
        sql: include_str!("../../migrations/0051_lease_floor.sql"),
    },
    Migration {
        version: 52,
        name: "0052_group_rounds_readable.sql",
        sql: include_str!("../../migrations/0052_group_rounds_readable.sql"),
    },
];

/// The schema version this binary needs.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}
