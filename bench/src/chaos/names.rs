//! The chaos run's queues and handlers, and which jobs are workflows: what
//! the load, the workers and the checks must agree on. A leaf.

/// The queue of the chaos run.
pub const QUEUE: &str = "chaos";

/// The torture run's second queue: it uses the same key strings as [`QUEUE`].
pub const TORTURE_QUEUE: &str = "chaos-b";

/// The handler of the three-step workflow.
pub const WORKFLOW_HANDLER: &str = "chaos.workflow";

/// Every this-many-th job is a three-step workflow; the rest are noops.
pub const WORKFLOW_EVERY: u64 = 5;

/// Whether job `n` is a workflow (else a noop).
pub fn is_workflow(n: u64) -> bool {
    n % WORKFLOW_EVERY == 0
}

/// The environment variable that makes a chaos worker the torture run's
/// skewed scheduler: how many seconds its scheduler clock runs ahead.
pub const AHEAD_ENV: &str = "CHAOS_SCHEDULER_CLOCK_AHEAD_S";

/// The torture run's children's queue (`torture::waits`): served by the
/// workers, not read by the job checks (a child's payload has no job
/// number of its own).
pub const CHILD_QUEUE: &str = "chaos-kids";

/// What a chaos worker logs once SIGTERM stops it gracefully (before, the
/// signal kills it): the fleet waits for it before it stops a worker.
pub const STOPS_ON_SIGTERM: &str = "chaos worker: SIGTERM stops it gracefully from here";
