//! Operations on job rows, noun first: `store::jobs::claim`,
//! `store::jobs::complete_many`, `store::jobs::insert_many`, … Each takes the
//! shard and a params struct (or the one value it needs), runs one statement
//! or one transaction, and decodes its rows here, next to the statement.

mod change;
mod claim;
mod complete;
mod debounce;
mod ids;
mod insert;
mod lease;
mod read;

pub use change::{cancel, cancel_owing, retry};
pub use claim::{claim, probe, Claim, ClaimParams};
pub use complete::{complete_many, CompleteMany, Written};
pub use debounce::insert_debounced;
pub use insert::{find_dedup, insert_dedup_as, insert_in, insert_many_as, reserve_ids, NewRow};
pub use lease::{cancel_requested, extend_leases, owned_running, ExtendLeases};
pub use read::{exists, get, outcome, present, JobInfo};
// What only the tests and benchmarks name: inserts without an epoch fence,
// and the rows two reads return.
#[cfg(feature = "internal")]
pub use change::Cancelled;
#[cfg(feature = "internal")]
pub use insert::{insert_dedup, insert_many};
#[cfg(feature = "internal")]
pub use lease::OwnedRunning;
#[cfg(feature = "internal")]
pub use read::JobOutcomeRow;
