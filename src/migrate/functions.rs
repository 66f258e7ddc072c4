//! Server-side functions: one file each in `migrations/functions/`, holding
//! its current text (`CREATE OR REPLACE`).
//!
//! The numbered migrations keep tables, indexes and data moves only. `migrate`
//! records the SHA-256 of each function's text as applied (`shardq_functions`)
//! and re-applies a function whose file's text differs from the recorded one:
//! after every table migration of the run, in the transaction of the last
//! one when it runs in a transaction, else in the run's closing transaction
//! (the one that checks the shard map), under the migration lock either way;
//! and, earlier, in the transaction of a migration marked
//! `-- shardq:functions-with-this` (one the old functions cannot run after:
//! 47, 48 and 50). So every function file must also apply to the schema
//! right after each marked migration, which the upgrade tests from versions
//! 16, 46, 47 and 49 check (and must run there until the next migration
//! commits: the floors' move runs on the barrier as 47 left it; a lease or
//! a take, on a shard upgraded from 46 or older, fails until 48 commits, a
//! moment later, and its caller asks again, as does a grouped claim of a
//! queue with a group rate, from a shard at 47 or older, until 50
//! commits; should 48, 49 or 50 fail, until `migrate` runs again);
//! otherwise a function never meets a table older than the one its
//! text was written for. A shard migrated before this scheme existed (every
//! function unrecorded) gets every function's current text on its next
//! `migrate`.
//!
//! A function whose signature changes needs its old signature dropped: that
//! `DROP FUNCTION` goes in the numbered migration that makes the change
//! (written as the newest migration, it commits in the same transaction as
//! the new text, so callers never find neither).

use super::error::MigrateError;
use crate::shards::Shard;
use crate::store::schema;

/// One server-side function's file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Function {
    /// The function's name (its file is `migrations/functions/{name}.sql`).
    pub name: &'static str,
    /// The file's text, run as it is.
    pub sql: &'static str,
}

/// Every server-side function, in the order they are applied: a function
/// before those that call it (`LANGUAGE sql` bodies are checked when created).
pub(crate) const FUNCTIONS: &[Function] = &[
    Function {
        name: "shardq_key_lock",
        sql: include_str!("../../migrations/functions/shardq_key_lock.sql"),
    },
    Function {
        name: "shardq_key_jobs_from",
        sql: include_str!("../../migrations/functions/shardq_key_jobs_from.sql"),
    },
    Function {
        name: "shardq_lock_keys",
        sql: include_str!("../../migrations/functions/shardq_lock_keys.sql"),
    },
    Function {
        name: "shardq_promote_keys",
        sql: include_str!("../../migrations/functions/shardq_promote_keys.sql"),
    },
    Function {
        name: "shardq_key_floor_lower",
        sql: include_str!("../../migrations/functions/shardq_key_floor_lower.sql"),
    },
    Function {
        name: "shardq_group_round_of",
        sql: include_str!("../../migrations/functions/shardq_group_round_of.sql"),
    },
    Function {
        name: "shardq_ready_floor_of",
        sql: include_str!("../../migrations/functions/shardq_ready_floor_of.sql"),
    },
    Function {
        name: "shardq_ensure_floors",
        sql: include_str!("../../migrations/functions/shardq_ensure_floors.sql"),
    },
    Function {
        name: "shardq_owe_cascades",
        sql: include_str!("../../migrations/functions/shardq_owe_cascades.sql"),
    },
    Function {
        name: "shardq_cascades_paid",
        sql: include_str!("../../migrations/functions/shardq_cascades_paid.sql"),
    },
    Function {
        name: "shardq_mark_ready",
        sql: include_str!("../../migrations/functions/shardq_mark_ready.sql"),
    },
    Function {
        name: "shardq_take_turn",
        sql: include_str!("../../migrations/functions/shardq_take_turn.sql"),
    },
    Function {
        name: "shardq_move_group_rounds",
        sql: include_str!("../../migrations/functions/shardq_move_group_rounds.sql"),
    },
    Function {
        name: "shardq_advance_ready_floors",
        sql: include_str!("../../migrations/functions/shardq_advance_ready_floors.sql"),
    },
    Function {
        name: "shardq_lock_plain_ready",
        sql: include_str!("../../migrations/functions/shardq_lock_plain_ready.sql"),
    },
    Function {
        name: "shardq_lock_keyed_ready",
        sql: include_str!("../../migrations/functions/shardq_lock_keyed_ready.sql"),
    },
    Function {
        name: "shardq_take",
        sql: include_str!("../../migrations/functions/shardq_take.sql"),
    },
    Function {
        name: "shardq_claim_keyed",
        sql: include_str!("../../migrations/functions/shardq_claim_keyed.sql"),
    },
    Function {
        name: "shardq_queue_has_ready",
        sql: include_str!("../../migrations/functions/shardq_queue_has_ready.sql"),
    },
    Function {
        name: "shardq_group_floor",
        sql: include_str!("../../migrations/functions/shardq_group_floor.sql"),
    },
    Function {
        name: "shardq_grouped_ready_turn",
        sql: include_str!("../../migrations/functions/shardq_grouped_ready_turn.sql"),
    },
    Function {
        name: "shardq_group_heads",
        sql: include_str!("../../migrations/functions/shardq_group_heads.sql"),
    },
    Function {
        name: "shardq_group_buckets_of",
        sql: include_str!("../../migrations/functions/shardq_group_buckets_of.sql"),
    },
    Function {
        name: "shardq_group_buckets_write",
        sql: include_str!("../../migrations/functions/shardq_group_buckets_write.sql"),
    },
    Function {
        name: "shardq_claim_grouped",
        sql: include_str!("../../migrations/functions/shardq_claim_grouped.sql"),
    },
    Function {
        name: "shardq_claim",
        sql: include_str!("../../migrations/functions/shardq_claim.sql"),
    },
    Function {
        name: "shardq_complete_many",
        sql: include_str!("../../migrations/functions/shardq_complete_many.sql"),
    },
    Function {
        name: "shardq_reserve_ids",
        sql: include_str!("../../migrations/functions/shardq_reserve_ids.sql"),
    },
    // Enqueue from SQL, for callers in any language (docs/enqueue-from-sql.md).
    Function {
        name: "shardq_shard_key",
        sql: include_str!("../../migrations/functions/shardq_shard_key.sql"),
    },
    Function {
        name: "shardq_refuse_stale_snapshot",
        sql: include_str!("../../migrations/functions/shardq_refuse_stale_snapshot.sql"),
    },
    Function {
        name: "shardq_check_route",
        sql: include_str!("../../migrations/functions/shardq_check_route.sql"),
    },
    Function {
        name: "shardq_owns_key",
        sql: include_str!("../../migrations/functions/shardq_owns_key.sql"),
    },
    Function {
        name: "shardq_hold_moving",
        sql: include_str!("../../migrations/functions/shardq_hold_moving.sql"),
    },
    Function {
        name: "shardq_route",
        sql: include_str!("../../migrations/functions/shardq_route.sql"),
    },
    Function {
        name: "shardq_enqueue_row",
        sql: include_str!("../../migrations/functions/shardq_enqueue_row.sql"),
    },
    Function {
        name: "shardq_enqueue",
        sql: include_str!("../../migrations/functions/shardq_enqueue.sql"),
    },
    Function {
        name: "shardq_enqueue_many",
        sql: include_str!("../../migrations/functions/shardq_enqueue_many.sql"),
    },
    // Messages and events from SQL (docs/enqueue-from-sql.md); the Rust
    // client sends through shardq_send_row too.
    Function {
        name: "shardq_send_row",
        sql: include_str!("../../migrations/functions/shardq_send_row.sql"),
    },
    Function {
        name: "shardq_send",
        sql: include_str!("../../migrations/functions/shardq_send.sql"),
    },
    Function {
        name: "shardq_step_log",
        sql: include_str!("../../migrations/functions/shardq_step_log.sql"),
    },
    Function {
        name: "shardq_step_record",
        sql: include_str!("../../migrations/functions/shardq_step_record.sql"),
    },
    Function {
        name: "shardq_step_sleep",
        sql: include_str!("../../migrations/functions/shardq_step_sleep.sql"),
    },
    Function {
        name: "shardq_hold_workflow",
        sql: include_str!("../../migrations/functions/shardq_hold_workflow.sql"),
    },
    Function {
        name: "shardq_recv_take",
        sql: include_str!("../../migrations/functions/shardq_recv_take.sql"),
    },
    Function {
        name: "shardq_recv",
        sql: include_str!("../../migrations/functions/shardq_recv.sql"),
    },
    Function {
        name: "shardq_child_result_decide",
        sql: include_str!("../../migrations/functions/shardq_child_result_decide.sql"),
    },
    Function {
        name: "shardq_child_result",
        sql: include_str!("../../migrations/functions/shardq_child_result.sql"),
    },
    Function {
        name: "shardq_child_intent",
        sql: include_str!("../../migrations/functions/shardq_child_intent.sql"),
    },
    Function {
        name: "shardq_child_wait",
        sql: include_str!("../../migrations/functions/shardq_child_wait.sql"),
    },
    Function {
        name: "shardq_get_event",
        sql: include_str!("../../migrations/functions/shardq_get_event.sql"),
    },
    Function {
        name: "shardq_lease_permits",
        sql: include_str!("../../migrations/functions/shardq_lease_permits.sql"),
    },
    Function {
        name: "shardq_refuse_old_limits_write",
        sql: include_str!("../../migrations/functions/shardq_refuse_old_limits_write.sql"),
    },
    Function {
        name: "shardq_permits_in_use",
        sql: include_str!("../../migrations/functions/shardq_permits_in_use.sql"),
    },
    Function {
        name: "shardq_take_starts",
        sql: include_str!("../../migrations/functions/shardq_take_starts.sql"),
    },
    // Child workflows (JobContext::start_child, ChildHandle::result).
    Function {
        name: "shardq_start_child",
        sql: include_str!("../../migrations/functions/shardq_start_child.sql"),
    },
    Function {
        name: "shardq_wake_parent",
        sql: include_str!("../../migrations/functions/shardq_wake_parent.sql"),
    },
    Function {
        name: "shardq_child_finished",
        sql: include_str!("../../migrations/functions/shardq_child_finished.sql"),
    },
    Function {
        name: "shardq_wake_parents",
        sql: include_str!("../../migrations/functions/shardq_wake_parents.sql"),
    },
];

/// The functions as (name, text) pairs, as the store takes them.
pub(super) fn pairs() -> Vec<(&'static str, &'static str)> {
    FUNCTIONS.iter().map(|f| (f.name, f.sql)).collect()
}

/// Refuses a shard whose functions differ from this binary's (read only).
pub(super) async fn check(shard: &Shard) -> Result<(), MigrateError> {
    let stale = schema::stale_functions(shard, &pairs()).await?;
    if stale.is_empty() {
        return Ok(());
    }
    Err(MigrateError::FunctionsDiffer {
        shard: shard.name.clone(),
        names: stale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_file_is_listed_once_and_defines_its_function() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/functions");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("migrations/functions")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut listed: Vec<String> = FUNCTIONS
            .iter()
            .map(|f| format!("{}.sql", f.name))
            .collect();
        listed.sort();
        assert_eq!(
            files, listed,
            "list each file of migrations/functions/ in FUNCTIONS"
        );
        for f in FUNCTIONS {
            let create = format!("CREATE OR REPLACE FUNCTION {}(", f.name);
            assert!(f.sql.contains(&create), "{}.sql: no `{create}`", f.name);
        }
    }

    #[test]
    fn no_numbered_migration_defines_a_function() {
        for m in super::super::list::MIGRATIONS {
            let upper = m.sql.to_uppercase();
            let defines = upper
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .any(|l| l.contains("CREATE FUNCTION") || l.contains("CREATE OR REPLACE FUNCTION"));
            assert!(
                !defines,
                "{}: a function's text goes in migrations/functions/ (one current definition)",
                m.name
            );
        }
    }
}
