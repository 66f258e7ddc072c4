//! The client: enqueue jobs, read and change them.

#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod browse;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
pub(crate) mod check;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod depth;
mod enqueue_once;
mod error;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod failures;
mod handle;
mod inspect;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
pub(crate) mod limits;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod map_report;
mod pause;
mod pending;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod queue_summary;
mod route_again;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod schedule_status;
mod transactional;

pub use crate::store::jobs::JobInfo;
pub use crate::store::ErrorKind;
pub use error::ClientError;
pub use handle::Client;
pub use inspect::JobOutcome;
pub use pause::PausedQueue;
pub use pending::PendingEnqueue;
pub use transactional::RoutedJob;

// The read models of the operator tools (`shardq status`, `check`, `map`,
// `limit`, `failures`, the dashboard's pages) and what they take: they follow
// those tools, not semver, so they sit behind the `internal` feature (see
// `lib.rs`), and the `Client` methods that return them are hidden.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::map_load::MapLoadError;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::store::backlog::StateCounts;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::store::browse::{
    FinishedSince, JobFilter, JobSummary, ListState, Position, StepInfo,
};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::store::check::{Example, Finding, Invariant};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::store::failures::ErrorGroup;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::store::horizon::{HeldBack, Holder, Horizon, TableVacuum};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::store::queues::{Connections, QueueCount};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use crate::store::workers::WorkerRow;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use browse::{
    JobDetail, JobList, JobQuery, OverviewOptions, PageCursor, QueueOverview, ShardOverview,
};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use check::{
    CheckOptions, CheckReport, ShardCheck, DEFAULT_COUNT_UP_TO, DEFAULT_DEADLINE, DEFAULT_EXAMPLES,
    DEFAULT_KEY_ENTRIES, DEFAULT_STATE_ROWS, STALE_MARGIN,
};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use depth::QueueDepth;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use failures::{FailureOptions, Failures};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use inspect::ShardStatus;
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use limits::{QueueLimit, QueueLimits, StartRate};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use map_report::{MapReport, RangeReport, ShardProblem};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use queue_summary::{summarize, QueueSummary, ALL_FINISHED};
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use schedule_status::ScheduleStatus;
