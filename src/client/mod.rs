//! The client: enqueue jobs, read and change them.

mod browse;
mod check;
mod depth;
mod enqueue_once;
mod error;
mod failures;
mod handle;
mod inspect;
mod limits;
mod map_report;
mod pause;
mod pending;
mod queue_summary;
mod route_again;
mod schedule_status;
mod transactional;

pub use crate::map_load::MapLoadError;
pub use crate::store::backlog::StateCounts;
pub use crate::store::browse::{
    FinishedSince, JobFilter, JobSummary, ListState, Position, StepInfo,
};
pub use crate::store::check::{Example, Finding, Invariant};
pub use crate::store::failures::ErrorGroup;
pub use crate::store::horizon::{HeldBack, Holder, Horizon, TableVacuum};
pub use crate::store::jobs::JobInfo;
pub use crate::store::queues::{Connections, QueueCount};
pub use crate::store::workers::WorkerRow;
pub use crate::store::ErrorKind;
pub use browse::{
    JobDetail, JobList, JobQuery, OverviewOptions, PageCursor, QueueOverview, ShardOverview,
};
pub use check::{
    CheckOptions, CheckReport, ShardCheck, DEFAULT_COUNT_UP_TO, DEFAULT_DEADLINE, DEFAULT_EXAMPLES,
    DEFAULT_KEY_ENTRIES, DEFAULT_STATE_ROWS, STALE_MARGIN,
};
pub use depth::QueueDepth;
pub use error::ClientError;
pub use failures::{FailureOptions, Failures};
pub use handle::Client;
pub use inspect::{JobOutcome, ShardStatus};
pub use limits::{QueueLimit, QueueLimits, StartRate};
pub use map_report::{MapReport, RangeReport, ShardProblem};
pub use pause::PausedQueue;
pub use pending::PendingEnqueue;
pub use queue_summary::{summarize, QueueSummary, ALL_FINISHED};
pub use schedule_status::ScheduleStatus;
pub use transactional::RoutedJob;
