//! Job values: what is enqueued, what a claim returns, what a handler produces.

use serde_json::Value;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

pub use crate::debounce::{Debounce, MAX_DEBOUNCE_KEY_BYTES, MAX_DEBOUNCE_WAIT};
pub use crate::job_status::JobStatus;

#[cfg(feature = "internal")]
#[doc(hidden)]
pub use claimed::{key_order, ClaimedJob, Completion, Outcome};
#[cfg(not(feature = "internal"))]
pub(crate) use claimed::{key_order, ClaimedJob, Completion, Outcome};

/// A job's identity: its shard key (which routes it) and its id on that shard.
/// Written as `shard_key-id`, e.g. `4821-1337`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId {
    /// Routing key, `0..65536`.
    pub shard_key: i32,
    /// Id, unique on its shard.
    pub id: i64,
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.shard_key, self.id)
    }
}

/// Longest queue name, in bytes. Queue names sit in the jobs table's indexes
/// next to an ordering key or deduplication id, and one btree entry must fit
/// in a third of a page (2,704 bytes on 8 kB pages): a name plus a key at
/// their limits stay well under it.
pub const MAX_QUEUE_BYTES: usize = 255;

/// Longest handler name, in bytes: a name, not data (it is not indexed, but
/// is written on every row and in every log line of the job).
pub const MAX_HANDLER_BYTES: usize = 255;

/// Longest ordering key, in bytes: indexed with its queue (see [`MAX_QUEUE_BYTES`]).
pub const MAX_ORDERING_KEY_BYTES: usize = 1024;

/// Longest deduplication id, in bytes: indexed with its queue (see [`MAX_QUEUE_BYTES`]).
pub const MAX_DEDUP_ID_BYTES: usize = 1024;

/// Longest group name, in bytes: indexed with its queue (see [`MAX_QUEUE_BYTES`]).
pub const MAX_GROUP_BYTES: usize = 1024;

/// Checks a message to a workflow before anything is written: its topic
/// (not empty, no NUL, at most [`MAX_QUEUE_BYTES`]), its idempotency key
/// (no NUL, at most [`MAX_DEDUP_ID_BYTES`]) and its payload (at most
/// `max_payload_bytes` as JSON text, no NUL), as an enqueue checks a job's.
pub(crate) fn validate_message(
    topic: &str,
    message: &Value,
    idempotency_key: Option<&str>,
    max_payload_bytes: usize,
) -> Result<(), InvalidJob> {
    if topic.is_empty() {
        return Err(InvalidJob::EmptyName("topic"));
    }
    for (field, value, max) in [
        ("topic", Some(topic), MAX_QUEUE_BYTES),
        ("idempotency key", idempotency_key, MAX_DEDUP_ID_BYTES),
    ] {
        let Some(value) = value else { continue };
        if value.contains('\0') {
            return Err(InvalidJob::NulInName(field));
        }
        if value.len() > max {
            return Err(InvalidJob::TooLong {
                field,
                size: value.len(),
                max,
            });
        }
    }
    let size = message.to_string().len();
    if size > max_payload_bytes {
        return Err(InvalidJob::PayloadTooLarge {
            size,
            max: max_payload_bytes,
        });
    }
    if has_nul(message) {
        return Err(InvalidJob::NulInPayload);
    }
    Ok(())
}

/// Checks a workflow event before anything is written or read: its key
/// (not empty, no NUL, at most [`MAX_QUEUE_BYTES`], as a message's topic)
/// and, when setting, its value (at most `max_payload_bytes` as JSON text,
/// no NUL).
pub(crate) fn validate_event(
    key: &str,
    value: Option<&Value>,
    max_payload_bytes: usize,
) -> Result<(), InvalidJob> {
    if key.is_empty() {
        return Err(InvalidJob::EmptyName("event key"));
    }
    if key.contains('\0') {
        return Err(InvalidJob::NulInName("event key"));
    }
    if key.len() > MAX_QUEUE_BYTES {
        return Err(InvalidJob::TooLong {
            field: "event key",
            size: key.len(),
            max: MAX_QUEUE_BYTES,
        });
    }
    let Some(value) = value else { return Ok(()) };
    let size = value.to_string().len();
    if size > max_payload_bytes {
        return Err(InvalidJob::PayloadTooLarge {
            size,
            max: max_payload_bytes,
        });
    }
    if has_nul(value) {
        return Err(InvalidJob::NulInPayload);
    }
    Ok(())
}

/// What is wrong with a job, found before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidJob {
    /// The queue or handler name is empty.
    #[error("{0} name is empty")]
    EmptyName(&'static str),
    /// A name, key or id holds a NUL character.
    #[error("{0} contains a NUL character, which PostgreSQL text cannot store")]
    NulInName(&'static str),
    /// The payload is over `limits.max_payload_bytes`.
    #[error("payload is {size} bytes, over limits.max_payload_bytes = {max}")]
    PayloadTooLarge {
        /// Its size as JSON text.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A name, key or id is longer than its limit.
    #[error("{field} is {size} bytes, over the limit of {max} bytes; shorten it (a long key or id can be hashed)")]
    TooLong {
        /// Which field: `queue`, `handler`, `ordering key`, `deduplication id` or `group`.
        field: &'static str,
        /// Its size in bytes (UTF-8).
        size: usize,
        /// Its limit ([`MAX_QUEUE_BYTES`] and the like).
        max: usize,
    },
    /// The payload holds a NUL character.
    #[error("payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")]
    NulInPayload,
    /// Both an ordering key and a deduplication id.
    #[error(
        "a job cannot have both an ordering key and a deduplication id: the \
         ordering key chooses the shard, so the deduplication id could not be \
         checked across all shards; drop one of them"
    )]
    KeyAndDedup,
    /// Both an ordering key and a group.
    #[error(
        "a job cannot have both an ordering key and a group: a key already runs \
         its jobs one at a time in order, and both would choose the shard; drop \
         one of them"
    )]
    KeyAndGroup,
    /// Fewer than one attempt, or more than [`MAX_ATTEMPTS`].
    #[error("max_attempts is {0}; it must be at least 1 and at most {MAX_ATTEMPTS}")]
    MaxAttempts(i32),
    /// A deduplication id on a transactional enqueue.
    #[error(
        "transactional enqueue does not take a deduplication id (its check needs \
         shardq's own statement); enqueue it with Client::enqueue"
    )]
    DedupInTransaction,
    /// A debounce whose period or max_wait is out of bounds.
    #[error(
        "debounce period is {period:?} and max_wait {max_wait:?}: the period must be at \
         least 1 ms, and max_wait at least the period and at most a year \
         (MAX_DEBOUNCE_WAIT)"
    )]
    DebounceTimes {
        /// The period given.
        period: Duration,
        /// The max_wait given.
        max_wait: Duration,
    },
    /// A debounced job with something a debounce decides itself, or that
    /// would route it elsewhere: an ordering key, a group, a deduplication
    /// id, a delay.
    #[error(
        "a debounced job cannot also have {0}: the debounce key chooses the job's shard \
         (so every enqueue of the key meets the pending run) and its start time; \
         drop one of them (put what tells the runs apart into the debounce key)"
    )]
    DebounceWith(&'static str),
    /// A debounce on a transactional enqueue.
    #[error(
        "transactional enqueue does not take a debounce (joining the pending run needs \
         shardq's own statement); enqueue it with Client::enqueue"
    )]
    DebounceInTransaction,
    /// A timeout of zero or over [`MAX_TIMEOUT`].
    #[error("timeout is {0:?}; it must be at least 1 ms and at most a year (MAX_TIMEOUT)")]
    Timeout(Duration),
}

/// The longest timeout a job takes ([`NewJob::timeout`]: a year): longer
/// is almost surely a mistake of units, and it keeps the shard's
/// `now() + timeout` far from the end of `timestamptz`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(366 * 24 * 3600);

/// A job id that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid job id `{0}`: expected SHARDKEY-ID, e.g. 4821-1337")]
pub struct JobIdParseError(String);

impl FromStr for JobId {
    type Err = JobIdParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || JobIdParseError(s.to_string());
        let (key, id) = s.split_once('-').ok_or_else(err)?;
        let shard_key: i32 = key.parse().map_err(|_| err())?;
        if !(0..crate::router::SHARD_KEY_SPACE as i32).contains(&shard_key) {
            return Err(err());
        }
        Ok(JobId {
            shard_key,
            id: id.parse().map_err(|_| err())?,
        })
    }
}

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Queue name.
    pub queue: String,
    /// Registered handler name.
    pub handler: String,
    /// JSON payload handed to the handler.
    pub payload: Value,
    /// Jobs with the same ordering key share a shard and run one at a time.
    pub ordering_key: Option<String>,
    /// Lower runs first within a queue on a shard.
    pub priority: i32,
    /// Not claimable before this much time has passed.
    pub delay: Duration,
    /// Attempts before the job is `dead` (default: `limits.default_max_attempts`).
    pub max_attempts: Option<i32>,
    /// At most one unfinished job per queue has this id (see [`OnDuplicate`]).
    pub dedup_id: Option<String>,
    /// The job's group (a tenant, an account): groups take turns in claims
    /// and each has the queue's group limits. Not with an ordering key.
    pub group: Option<String>,
    /// What enqueueing a duplicate does.
    pub on_duplicate: OnDuplicate,
    /// Started as a child workflow (`JobContext::start_child`): whether a
    /// cancel of its parent cancels it too. Not used by a plain enqueue.
    pub on_parent_cancel: ChildPolicy,
    /// Debounced by a key: see [`NewJob::debounce`].
    pub debounce: Option<Debounce>,
    /// A deadline for the whole workflow, this long after the enqueue by
    /// the shard's clock: see [`NewJob::timeout`].
    pub timeout: Option<Duration>,
}

/// What a cancel of a child workflow's parent does to it
/// ([`NewJob::on_parent_cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChildPolicy {
    /// Cancel it (and its own unfinished children), as the parent.
    #[default]
    Cancel,
    /// Leave it to run to its end (a cleanup the parent started, say): the
    /// cancel cascade passes it and its descendants by.
    Abandon,
}

/// What enqueueing a job whose deduplication id is taken does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDuplicate {
    /// Return the existing job's id.
    #[default]
    ReturnExisting,
    /// Fail with [`crate::ClientError::Duplicate`].
    Error,
}

impl NewJob {
    /// A job for `handler` on `queue` with `payload`, no key, priority 0.
    pub fn new(queue: impl Into<String>, handler: impl Into<String>, payload: Value) -> Self {
        NewJob {
            queue: queue.into(),
            handler: handler.into(),
            payload,
            ordering_key: None,
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: None,
            dedup_id: None,
            group: None,
            on_duplicate: OnDuplicate::ReturnExisting,
            on_parent_cancel: ChildPolicy::Cancel,
            debounce: None,
            timeout: None,
        }
    }

    /// Makes the job claimable only after `delay`.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Makes the job claimable only from `at` (now when it is past).
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.delay = at.duration_since(SystemTime::now()).unwrap_or_default();
        self
    }

    /// Sets what a cancel of its parent does to it when it is started as
    /// a child workflow (`JobContext::start_child`): cancel it (the
    /// default) or abandon it (it runs on).
    pub fn on_parent_cancel(mut self, policy: ChildPolicy) -> Self {
        self.on_parent_cancel = policy;
        self
    }

    /// Sets the attempt limit.
    pub fn max_attempts(mut self, attempts: i32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Sets the deduplication id and what a duplicate does.
    pub fn dedup(mut self, id: impl Into<String>, on_duplicate: OnDuplicate) -> Self {
        self.dedup_id = Some(id.into());
        self.on_duplicate = on_duplicate;
        self
    }

    /// Checks what PostgreSQL would refuse or what exceeds `limits`; the error
    /// says what is wrong and what to do.
    ///
    /// # Errors
    ///
    /// [`InvalidJob`]: empty names, NUL characters, a name, key or id over
    /// its size limit ([`NewJob::check_sizes`]), an oversized payload, an
    /// ordering key with a deduplication id or a group, an empty group,
    /// fewer than one attempt, a bad debounce ([`NewJob::debounce`]).
    pub fn validate(&self, limits: &EnqueueLimits) -> Result<(), InvalidJob> {
        let empty_group = self.group.as_ref().filter(|g| g.is_empty());
        for (what, value) in [("queue", &self.queue), ("handler", &self.handler)]
            .into_iter()
            .chain(empty_group.map(|g| ("group", g)))
        {
            if value.is_empty() {
                return Err(InvalidJob::EmptyName(what));
            }
        }
        let names = [
            ("queue", Some(&self.queue)),
            ("handler", Some(&self.handler)),
            ("ordering key", self.ordering_key.as_ref()),
            ("deduplication id", self.dedup_id.as_ref()),
            ("group", self.group.as_ref()),
        ];
        for (what, value) in names {
            if value.is_some_and(|v| v.contains('\0')) {
                return Err(InvalidJob::NulInName(what));
            }
        }
        self.check_sizes()?;
        let size = self.payload.to_string().len();
        if size > limits.max_payload_bytes {
            return Err(InvalidJob::PayloadTooLarge {
                size,
                max: limits.max_payload_bytes,
            });
        }
        if has_nul(&self.payload) {
            return Err(InvalidJob::NulInPayload);
        }
        if self.ordering_key.is_some() && self.dedup_id.is_some() {
            return Err(InvalidJob::KeyAndDedup);
        }
        if self.ordering_key.is_some() && self.group.is_some() {
            return Err(InvalidJob::KeyAndGroup);
        }
        check_max_attempts(self.max_attempts)?;
        self.check_timeout()?;
        self.check_debounce()
    }

    /// Checks every name, key and id against its size limit, so a batch is
    /// refused before any shard writes its part (the database would refuse
    /// an oversized index entry only on the shard that holds it).
    ///
    /// # Errors
    ///
    /// [`InvalidJob::TooLong`] naming the first field over its limit.
    pub fn check_sizes(&self) -> Result<(), InvalidJob> {
        let fields = [
            ("queue", Some(&self.queue), MAX_QUEUE_BYTES),
            ("handler", Some(&self.handler), MAX_HANDLER_BYTES),
            (
                "ordering key",
                self.ordering_key.as_ref(),
                MAX_ORDERING_KEY_BYTES,
            ),
            (
                "deduplication id",
                self.dedup_id.as_ref(),
                MAX_DEDUP_ID_BYTES,
            ),
            ("group", self.group.as_ref(), MAX_GROUP_BYTES),
        ];
        for (field, value, max) in fields {
            let size = value.map_or(0, String::len);
            if size > max {
                return Err(InvalidJob::TooLong { field, size, max });
            }
        }
        Ok(())
    }

    /// The key that routes this job: its ordering key, else its group (a
    /// group's jobs share a shard, where its limits and turns are counted),
    /// else its deduplication id, else its debounce key (a debounced job
    /// has none of the others).
    pub fn routing_key(&self) -> Option<&str> {
        self.ordering_key
            .as_deref()
            .or(self.group.as_deref())
            .or(self.dedup_id.as_deref())
            .or(self.debounce.as_ref().map(|d| d.key.as_str()))
    }

    /// Sets the group (a tenant, an account, an API key): the queue's
    /// groups take turns in every claim, and each has the queue's group
    /// limits (`shardq limit set --group-concurrency`). Its jobs are placed
    /// by the group, so they share a shard; a deduplication id is then
    /// checked among the jobs of that shard. Not with an ordering key.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Sets the ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
}

/// Whether any string or key in `value` holds a NUL character.
fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Enqueue limits (`[limits]` of the config), checked by [`NewJob::validate`].
#[derive(Debug, Clone)]
pub struct EnqueueLimits {
    /// Largest payload in bytes.
    pub max_payload_bytes: usize,
    /// Attempts of a job that does not say.
    pub default_max_attempts: i32,
}

/// The most attempts a job may have (`NewJob::max_attempts`,
/// `limits.default_max_attempts`). A thousand attempts at even the shortest
/// backoff outlast any failure a retry can wait out; beyond that a job
/// retries forever in all but name, and its counters drift toward the
/// limits of their types (`attempts` is an int4).
pub const MAX_ATTEMPTS: i32 = 1_000;

/// A job's own attempt limit, when it sets one, within `1..=MAX_ATTEMPTS`.
fn check_max_attempts(attempts: Option<i32>) -> Result<(), InvalidJob> {
    match attempts {
        Some(n) if !(1..=MAX_ATTEMPTS).contains(&n) => Err(InvalidJob::MaxAttempts(n)),
        _ => Ok(()),
    }
}

// What a claim brings and a handler's run leaves: the worker's and the
// store's own values, not an embedder's (a handler sees its job through
// `JobContext`), opened to this workspace by the `internal` feature (see
// `lib.rs`).
#[cfg_attr(not(feature = "internal"), allow(unreachable_pub))]
mod claimed {
    use super::{has_nul, JobId};
    use serde_json::Value;
    use std::time::SystemTime;

    /// A job claimed by this process (the worker's and the store's; a handler
    /// sees its job through `JobContext`).
    #[derive(Debug, Clone)]
    pub struct ClaimedJob {
        /// Identity.
        pub id: JobId,
        /// Index of the shard it came from.
        pub shard: usize,
        /// Queue.
        pub queue: String,
        /// Handler name.
        pub handler: String,
        /// Ordering key.
        pub ordering_key: Option<String>,
        /// Payload.
        pub payload: Value,
        /// This attempt's number (1 for the first).
        pub attempt: i32,
        /// This claim's fencing token: raised by every claim of the row, never
        /// lowered; completions and step records are written only under it.
        pub fence: i64,
        /// Which claim of this process brought it (jobs of one key that came in
        /// one claim form a run).
        pub claim: u64,
        /// When it was enqueued (the shard's clock).
        pub created_at: SystemTime,
        /// Until when this claim surely holds the job: its lease, counted
        /// from before the claim's statement was sent (the shard counts it
        /// from later). No other claim can take the job before then.
        pub held_until: tokio::time::Instant,
    }

    #[cfg(test)]
    impl ClaimedJob {
        /// For unit tests: job `id` of shard `shard`, queue `q`, handler
        /// `noop`, first attempt of its first claim.
        pub(crate) fn for_test(id: i64, shard: usize, key: Option<&str>) -> ClaimedJob {
            ClaimedJob {
                id: JobId { shard_key: 0, id },
                shard,
                queue: "q".into(),
                handler: "noop".into(),
                ordering_key: key.map(Into::into),
                payload: Value::Null,
                attempt: 1,
                fence: 1,
                claim: 0,
                created_at: SystemTime::now(),
                held_until: tokio::time::Instant::now(),
            }
        }
    }

    /// How a job ended (the worker's and the store's).
    #[derive(Debug, Clone)]
    pub enum Outcome {
        /// The handler returned this output.
        Succeeded(Value),
        /// The handler failed with this message: retried after a backoff while
        /// attempts are left, else `dead`.
        Failed(String),
        /// The handler failed for good with this message (a
        /// [`crate::PermanentFailure`], or a payload that does not decode as a
        /// typed handler's arguments): `dead` at once, whatever attempts are
        /// left.
        Dead(String),
        /// Never started: give it back uncounted (to `waiting` behind its key,
        /// or `cancelled` when its cancellation was asked).
        Released,
        /// A durable sleep is not over: park the workflow until its wake time
        /// (the job's `run_at`, set by the sleep), uncounted.
        Parked,
    }

    impl Outcome {
        /// The outcome as PostgreSQL can store it: NUL characters in an error
        /// text are replaced, and an output holding one (jsonb cannot store
        /// `\u0000`) turns the outcome into a failure that says so. Without this,
        /// one such outcome fails the whole batch's write.
        pub fn storable(self) -> Outcome {
            match self {
                Outcome::Succeeded(output) if has_nul(&output) => Outcome::Failed(
                    "the handler's output contains a NUL character (\\u0000), which PostgreSQL \
                     jsonb cannot store; the output was discarded"
                        .into(),
                ),
                Outcome::Failed(message) if message.contains('\0') => {
                    Outcome::Failed(message.replace('\0', "\u{FFFD}"))
                }
                Outcome::Dead(message) if message.contains('\0') => {
                    Outcome::Dead(message.replace('\0', "\u{FFFD}"))
                }
                other => other,
            }
        }
    }

    /// A finished job waiting to be written back (the worker's and the store's).
    #[derive(Debug, Clone)]
    pub struct Completion {
        /// Identity.
        pub id: JobId,
        /// Shard index.
        pub shard: usize,
        /// The claim's fencing token.
        pub fence: i64,
        /// The job's ordering key, hashed with its queue ([`key_order`]);
        /// `None` without a key. A keyed write takes the key lock, and waits
        /// for an earlier write of the same key still in flight, so that a
        /// key's `finished_at` times follow its order.
        pub key: Option<u64>,
        /// Result.
        pub outcome: Outcome,
        /// When the handler ended (for the completion-lag histogram).
        pub finished: std::time::Instant,
        /// Whether the job holds buffer credits, given back as its outcome
        /// reaches the completer and is written: every job that entered the
        /// buffer does; a late claim's job given back for want of room does not.
        pub credited: bool,
    }

    impl Completion {
        /// `job`'s completion with `outcome`, made storable.
        pub fn of(job: &ClaimedJob, outcome: Outcome) -> Completion {
            Completion {
                id: job.id,
                shard: job.shard,
                fence: job.fence,
                key: job
                    .ordering_key
                    .as_deref()
                    .map(|key| key_order(&job.queue, key)),
                outcome: outcome.storable(),
                finished: std::time::Instant::now(),
                credited: true,
            }
        }

        /// `job` given back unstarted by a process that had no buffer room
        /// for it: released, and holding no buffer credits to give back.
        pub fn given_back_without_room(job: &ClaimedJob) -> Completion {
            Completion {
                credited: false,
                ..Completion::of(job, Outcome::Released)
            }
        }

        /// Whether the job has an ordering key.
        pub fn keyed(&self) -> bool {
            self.key.is_some()
        }
    }

    /// A queue's ordering key as one number: what a completion's write
    /// waits on (two keys sharing a number only wait for each other's
    /// writes).
    pub fn key_order(queue: &str, key: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (queue, key).hash(&mut hasher);
        hasher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_id_round_trips_and_rejects_garbage() {
        let id = JobId {
            shard_key: 4821,
            id: 1337,
        };
        assert_eq!(id.to_string().parse::<JobId>().unwrap(), id);
        for bad in ["", "12", "a-1", "1-b", "70000-1", "-1-2"] {
            assert!(bad.parse::<JobId>().is_err(), "{bad}");
        }
    }
}
