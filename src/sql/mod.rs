//! Every SQL statement shardq runs, in one place, named after what it does.
//! Values are always bind parameters.

mod claim;
mod jobs;
mod maintenance;
mod schema;
mod steps;

pub use claim::*;
pub use jobs::*;
pub use maintenance::*;
pub use schema::*;
pub use steps::*;
