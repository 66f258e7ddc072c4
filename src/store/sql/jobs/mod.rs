//! The statements of the job operations, one file per module of
//! `store::jobs`.

mod change;
mod claim;
mod complete;
mod debounce;
mod insert;
mod lease;
mod read;

pub use change::*;
pub use claim::*;
pub use complete::*;
pub use debounce::*;
pub use insert::*;
pub use lease::*;
pub use read::*;
