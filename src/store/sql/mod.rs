//! Every SQL statement shardq runs, in one place, named after what it does.
//! Values are always bind parameters.
//!
//! Statements are sent with their parameter types (`query_typed`): one round
//! trip on the unnamed statement, no named prepared statement left on the
//! connection, which is what a transaction-pooling proxy needs.
//!
//! Filed by operation: each file holds the statements of the `store` module
//! of the same name (`jobs/claim.rs` those of `store::jobs::claim`, and so
//! on); `locks.rs` those of the key locks that `exec` and `upkeep` take
//! around their transactions; `macros.rs` the fragments several statements
//! share.

#[macro_use]
mod macros;

mod backlog;
mod browse;
mod cascades;
mod check;
mod check_job_state;
mod check_waits;
mod children;
mod deadlines;
mod events;
mod failures;
mod horizon;
mod jobs;
mod limits;
mod locks;
mod map;
mod messages;
mod queues;
mod reshard;
mod schedules;
mod schema;
mod steps;
mod upkeep;
mod workers;

pub use backlog::*;
pub use browse::*;
pub use cascades::*;
pub use check::*;
pub use check_job_state::*;
pub use check_waits::*;
pub use children::*;
pub use deadlines::*;
pub use events::*;
pub use failures::*;
pub use horizon::*;
pub use jobs::*;
pub use limits::*;
pub use locks::*;
pub use map::*;
pub use messages::*;
pub use queues::*;
pub use reshard::*;
pub use schedules::*;
pub use schema::*;
pub use steps::*;
pub use upkeep::*;
pub use workers::*;

/// One bind parameter with its PostgreSQL type.
pub type Param<'a> = (
    &'a (dyn tokio_postgres::types::ToSql + Sync),
    tokio_postgres::types::Type,
);

/// Sets the server's statement timeout ($1 ms) for the rest of the
/// transaction, or of a savepoint in it: a read given a share of a
/// deadline (the check's job states, the exporter's backlog).
pub const LOCAL_STATEMENT_TIMEOUT: &str = "SELECT set_config('statement_timeout', $1::text, true)";
