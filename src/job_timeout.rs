//! Deadlines: a workflow that has not ended by its deadline ends
//! `cancelled` ([`NewJob::timeout`]). The builder and its check; the
//! deadline pass is `store::deadlines`, the rules docs/workflows.md, "Deadlines".

use crate::job::{InvalidJob, NewJob, MAX_TIMEOUT};
use std::time::Duration;

impl NewJob {
    /// Gives the whole workflow a deadline: `timeout` after the enqueue, by
    /// the shard's clock (never the caller's). A workflow not ended by then
    /// ends `cancelled`, with an error that says its deadline passed and
    /// when, whatever it was doing: queued, waiting behind its key, delayed,
    /// retrying, or parked (a durable sleep, a `recv`, a child's result)
    /// ends within the promoter's pass (about a second); a running one gets
    /// its cancellation asked, as `Client::cancel` asks it, and its handler
    /// learns it at its next step, sleep or wait
    /// (`StepError::Cancelled`). A child started with
    /// `JobContext::start_child` takes the earlier of its own deadline and
    /// its parent's (unless it is abandoned on its parent's cancel,
    /// [`crate::ChildPolicy::Abandon`]). At least 1 ms, at most
    /// [`MAX_TIMEOUT`]: [`NewJob::validate`] says what is wrong.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The timeout in whole milliseconds, as the enqueue statements take it
    /// (NULL: no deadline); valid once [`NewJob::validate`] passed.
    pub(crate) fn timeout_ms(&self) -> Option<i64> {
        self.timeout.map(|t| t.as_millis() as i64)
    }

    /// The check of a timeout: positive and at most [`MAX_TIMEOUT`].
    pub(crate) fn check_timeout(&self) -> Result<(), InvalidJob> {
        match self.timeout {
            Some(t) if t < Duration::from_millis(1) || t > MAX_TIMEOUT => {
                Err(InvalidJob::Timeout(t))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::EnqueueLimits;

    fn job() -> NewJob {
        NewJob::new("q", "h", serde_json::json!({}))
    }

    #[test]
    fn a_timeout_must_be_positive_and_at_most_a_year() {
        let limits = EnqueueLimits {
            max_payload_bytes: 1 << 20,
            default_max_attempts: 3,
        };
        assert!(job().validate(&limits).is_ok());
        assert!(job()
            .timeout(Duration::from_secs(5))
            .validate(&limits)
            .is_ok());
        assert!(job().timeout(MAX_TIMEOUT).validate(&limits).is_ok());
        for bad in [Duration::ZERO, Duration::from_micros(999), MAX_TIMEOUT * 2] {
            let err = job().timeout(bad).validate(&limits).unwrap_err();
            assert_eq!(err, InvalidJob::Timeout(bad));
            assert!(err.to_string().contains("at least 1 ms"), "{err}");
        }
    }
}
