//! Every SQL statement shardq runs, in one place, named after what it does.
//! Values are always bind parameters.
//!
//! Statements are sent with their parameter types (`query_typed`): one round
//! trip on the unnamed statement, no named prepared statement left on the
//! connection, which is what a transaction-pooling proxy needs.

mod backlog;
mod browse;
mod check;
mod claim;
mod jobs;
mod maintenance;
mod pause;
mod schedules;
mod schema;
mod steps;
mod workers;

pub use backlog::*;
pub use browse::*;
pub use check::*;
pub use claim::*;
pub use jobs::*;
pub use maintenance::*;
pub use pause::*;
pub use schedules::*;
pub use schema::*;
pub use steps::*;
pub use workers::*;

/// One bind parameter with its PostgreSQL type.
pub type Param<'a> = (
    &'a (dyn tokio_postgres::types::ToSql + Sync),
    tokio_postgres::types::Type,
);
