//! A point-in-time copy of a worker's totals.

/// A point-in-time copy of [`Stats`](super::Stats)'s totals.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StatsSnapshot {
    /// Jobs claimed.
    pub claimed: u64,
    /// Busy answers.
    pub busy: u64,
    /// Empty answers.
    pub empty: u64,
    /// Failed claims.
    pub claim_errors: u64,
    /// Claim statements that returned jobs.
    pub claim_statements: u64,
    /// Succeeded jobs written.
    pub succeeded: u64,
    /// Failed jobs scheduled for another attempt.
    pub retrying: u64,
    /// Failed jobs that are dead.
    pub dead: u64,
    /// Cancelled jobs.
    pub cancelled: u64,
    /// Fenced-out completions.
    pub fenced: u64,
    /// Completion statements.
    pub completion_statements: u64,
    /// Recovered jobs.
    pub recovered: u64,
    /// Released jobs.
    pub released: u64,
    /// Abandoned handlers.
    pub abandoned: u64,
    /// Longest a producer waited on one claim, in µs: at most the budget
    /// of that claim's shard (a few hundred ms) and the time to give up.
    pub claim_wait_max_us: u64,
    /// Claims not answered within their shard's budget (their replies are
    /// handled by a task of their own: jobs run or go back).
    pub claims_detached: u64,
    /// Outcomes at the completer not yet written now.
    pub unwritten: u64,
    /// The most outcomes that ever waited at the completer at once.
    pub unwritten_peak: u64,
}

impl StatsSnapshot {
    /// Attempts whose outcome was written: succeeded, retrying, dead or cancelled.
    pub fn finished(&self) -> u64 {
        self.succeeded + self.retrying + self.dead + self.cancelled
    }
}
