//! The states a job row can be in (the `status` column).

use std::fmt;

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Keyed, parked behind the running or retrying job of its key.
    Waiting,
    /// Not ready yet: delayed, or waiting out a retry backoff.
    Scheduled,
    /// Ready to be claimed.
    Queued,
    /// Claimed by a worker, under a lease.
    Running,
    /// Finished with an output.
    Succeeded,
    /// Finished with an error (schema versions before 3; now `dead`).
    Failed,
    /// Failed on its last attempt.
    Dead,
    /// Cancelled.
    Cancelled,
    /// Moving to another shard (`shardq reshard`): on its new shard, not
    /// claimable until the old shard has finished its range's jobs.
    Held,
}

impl JobStatus {
    /// Every state, in lifecycle order.
    pub const ALL: [JobStatus; 9] = [
        JobStatus::Waiting,
        JobStatus::Scheduled,
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Dead,
        JobStatus::Cancelled,
        JobStatus::Held,
    ];

    /// The value in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Waiting => "waiting",
            JobStatus::Scheduled => "scheduled",
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Dead => "dead",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Held => "held",
        }
    }

    /// The state named `text`, as stored in the `status` column.
    pub fn parse(text: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Decodes the `status` column; a value this binary does not know (a
    /// newer schema) is a bug in the upgrade order, so it panics with both.
    pub(crate) fn from_column(text: &str) -> JobStatus {
        JobStatus::parse(text)
            .unwrap_or_else(|| panic!("unknown job status `{text}` in workflow_status"))
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for JobStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for JobStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::JobStatus;

    #[test]
    fn every_status_reads_back_as_itself() {
        for status in JobStatus::ALL {
            assert_eq!(JobStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(JobStatus::parse("finished"), None);
    }
}
