//! Online resharding: moving ranges of shard keys to a new shard list while
//! the fleet runs (`shardq reshard --to NEW.toml`, docs/operations.md).
//!
//! One epoch of the map records the new ranges and the moves; then, per
//! move, the old shard's unclaimed jobs of the range are copied to the new
//! shard `held`, new enqueues of the range are written there `held`, and
//! once the old shard holds no unfinished job of the range (its running
//! jobs finish there, fenced by their leases) the held jobs are released.
//! Every step is recorded in the map tables or in the jobs themselves, so
//! a command stopped at any point and run again finishes the move.

mod copy;
mod plan;
mod replace;
mod run;

pub use plan::{plan, Plan, RangeMove};
pub use replace::check_replacements;
pub use run::{reshard, Options, Progress, ReshardError, Step, Summary};
