//! Debounce: a burst of enqueues with one key becomes one run
//! ([`NewJob::debounce`]). The builder and its checks (the settings are in
//! `debounce.rs`); the write is `store::jobs::insert_debounced`, the rules
//! docs/workflows.md#debounce.

use crate::job::{Debounce, InvalidJob, NewJob, MAX_DEBOUNCE_KEY_BYTES, MAX_DEBOUNCE_WAIT};
use std::time::Duration;

impl NewJob {
    /// Debounces the job by `key` (per queue): while a run of the key is
    /// pending (not yet started), enqueueing the key again does not add a
    /// run; it makes the pending run this job (its payload, handler,
    /// priority and attempt limit: the last enqueue to commit wins) and
    /// moves its start to `period` after this enqueue, but never later than
    /// `max_wait` after the burst's first enqueue (times by the shard's
    /// clock). An enqueue while the run is queued or running starts the
    /// next pending run: none is swallowed.
    ///
    /// The key routes the job (its shard), so a debounced job has no
    /// ordering key, group, deduplication id or delay; the enqueue returns
    /// the id of the pending run it joined. `period` at least 1 ms,
    /// `max_wait` at least `period` and at most [`MAX_DEBOUNCE_WAIT`]:
    /// [`NewJob::validate`] says what is wrong.
    pub fn debounce(
        mut self,
        key: impl Into<String>,
        period: Duration,
        max_wait: Duration,
    ) -> Self {
        self.debounce = Some(Debounce {
            key: key.into(),
            period,
            max_wait,
        });
        self
    }

    /// The checks of a debounced job: its key, its times, and what it
    /// cannot be combined with.
    pub(crate) fn check_debounce(&self) -> Result<(), InvalidJob> {
        let Some(debounce) = &self.debounce else {
            return Ok(());
        };
        let field = "debounce key";
        if debounce.key.is_empty() {
            return Err(InvalidJob::EmptyName(field));
        }
        if debounce.key.contains('\0') {
            return Err(InvalidJob::NulInName(field));
        }
        if debounce.key.len() > MAX_DEBOUNCE_KEY_BYTES {
            return Err(InvalidJob::TooLong {
                field,
                size: debounce.key.len(),
                max: MAX_DEBOUNCE_KEY_BYTES,
            });
        }
        if debounce.period < Duration::from_millis(1)
            || debounce.max_wait < debounce.period
            || debounce.max_wait > MAX_DEBOUNCE_WAIT
        {
            return Err(InvalidJob::DebounceTimes {
                period: debounce.period,
                max_wait: debounce.max_wait,
            });
        }
        let refused = [
            (self.ordering_key.is_some(), "an ordering key"),
            (self.group.is_some(), "a group"),
            (self.dedup_id.is_some(), "a deduplication id"),
            (!self.delay.is_zero(), "a delay or run_at"),
        ];
        match refused.into_iter().find(|(set, _)| *set) {
            Some((_, what)) => Err(InvalidJob::DebounceWith(what)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job() -> NewJob {
        NewJob::new("q", "h", json!({}))
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn refuses_bad_keys_times_and_combinations() {
        let cases = [
            (
                job().debounce("", S, S),
                InvalidJob::EmptyName("debounce key"),
            ),
            (
                job().debounce("a\0b", S, S),
                InvalidJob::NulInName("debounce key"),
            ),
            (
                job().debounce("k".repeat(MAX_DEBOUNCE_KEY_BYTES + 1), S, S),
                InvalidJob::TooLong {
                    field: "debounce key",
                    size: MAX_DEBOUNCE_KEY_BYTES + 1,
                    max: MAX_DEBOUNCE_KEY_BYTES,
                },
            ),
            (
                job().debounce("k", Duration::ZERO, S),
                InvalidJob::DebounceTimes {
                    period: Duration::ZERO,
                    max_wait: S,
                },
            ),
            (
                job().debounce("k", 2 * S, S),
                InvalidJob::DebounceTimes {
                    period: 2 * S,
                    max_wait: S,
                },
            ),
            (
                job().debounce("k", S, MAX_DEBOUNCE_WAIT + S),
                InvalidJob::DebounceTimes {
                    period: S,
                    max_wait: MAX_DEBOUNCE_WAIT + S,
                },
            ),
            (
                job().ordering_key("o").debounce("k", S, S),
                InvalidJob::DebounceWith("an ordering key"),
            ),
            (
                job().group("g").debounce("k", S, S),
                InvalidJob::DebounceWith("a group"),
            ),
            (
                job()
                    .dedup("d", crate::job::OnDuplicate::ReturnExisting)
                    .debounce("k", S, S),
                InvalidJob::DebounceWith("a deduplication id"),
            ),
            (
                job().delay(S).debounce("k", S, S),
                InvalidJob::DebounceWith("a delay or run_at"),
            ),
        ];
        for (job, expected) in cases {
            assert_eq!(job.check_debounce(), Err(expected.clone()), "{expected}");
        }
        assert_eq!(job().debounce("k", S, S).check_debounce(), Ok(()));
        assert_eq!(
            job().priority(3).debounce("k", S, 9 * S).check_debounce(),
            Ok(())
        );
    }

    #[test]
    fn the_debounce_key_routes_the_job() {
        assert_eq!(job().debounce("k", S, S).routing_key(), Some("k"));
    }
}
