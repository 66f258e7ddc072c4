//! The client: enqueue jobs, read and change them.

mod browse;
mod cancel_children;
#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
pub(crate) mod check;
mod depth;
mod enqueue_debounced;
mod enqueue_once;
mod error;
pub(crate) mod events;
mod failures;
mod handle;
mod inspect;
pub(crate) mod limits;
mod map_report;
pub(crate) mod messages;
mod pause;
mod pending;
#[cfg_attr(not(feature = "internal"), allow(dead_code, unreachable_pub))]
mod queue_summary;
mod route_again;
mod schedule_status;
mod transactional;

pub use crate::store::jobs::JobInfo;
pub use crate::store::ErrorKind;
pub use error::ClientError;
pub use handle::Client;
pub use inspect::JobOutcome;
pub use limits::{QueueLimit, QueueLimits, StartRate};
pub use pause::PausedQueue;
pub use pending::PendingEnqueue;
pub use transactional::RoutedJob;

// The read models of the operator tools (`shardq status`, `check`, `shards
// show`, the dashboard's pages) and what they take: they follow
// those tools, not semver, so they sit behind the `internal` feature (see
// `lib.rs`), and the `Client` methods that return them are hidden.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use {
    crate::map_load::MapLoadError,
    crate::store::backlog::StateCounts,
    crate::store::browse::{FinishedSince, JobFilter, JobSummary, ListState, Position, StepInfo},
    crate::store::check::{Example, Finding, Invariant},
    crate::store::failures::ErrorGroup,
    crate::store::horizon::{HeldBack, Holder, Horizon, TableVacuum},
    crate::store::queues::{Connections, QueueCount},
    crate::store::workers::WorkerRow,
    browse::{
        JobDetail, JobList, JobQuery, OverviewOptions, PageCursor, QueueOverview, ShardOverview,
    },
    check::{
        CheckOptions, CheckReport, ShardCheck, DEFAULT_CHILD_GRACE, DEFAULT_COUNT_UP_TO,
        DEFAULT_DEADLINE, DEFAULT_EXAMPLES, DEFAULT_KEY_ENTRIES, DEFAULT_STATE_ROWS,
        DEFAULT_WAIT_ENTRIES, STALE_MARGIN,
    },
    depth::QueueDepth,
    failures::{FailureOptions, Failures},
    inspect::ShardStatus,
    map_report::{MapReport, RangeReport, ShardProblem},
    queue_summary::{summarize, QueueSummary, ALL_FINISHED},
    schedule_status::ScheduleStatus,
};
