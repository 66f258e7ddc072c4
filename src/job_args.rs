//! Typed jobs: a job's arguments as a `serde` struct with a kind, enqueued
//! as a value ([`NewJob::from_args`]) and handled by a function that
//! receives the struct ([`crate::HandlerRegistry::register_typed`]).
//!
//! The kind is the handler name stored in the job's row, and the arguments
//! are its JSON payload, so a typed job is an ordinary job: the CLI, the SQL
//! enqueue functions and handlers in other languages see the same row.

use crate::job::NewJob;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A job's arguments: serialised as its payload, and registered, enqueued and
/// handled under [`JobArgs::KIND`].
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail {
///     to: String,
/// }
///
/// impl shardq::JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
/// }
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + 'static {
    /// The kind of job: the handler name its rows carry. Keep it stable
    /// while jobs of it may be enqueued (a renamed kind leaves them without
    /// a handler), and keep the struct able to decode the payloads already
    /// enqueued (add fields with `#[serde(default)]`).
    const KIND: &'static str;
}

/// Arguments that do not turn into a payload, or a payload that does not
/// turn back into arguments.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The arguments do not serialise as JSON (a map with non-string keys,
    /// say, or a `Serialize` impl that fails).
    #[error("arguments of job kind `{kind}` do not serialize as JSON")]
    Serialize {
        /// [`JobArgs::KIND`].
        kind: &'static str,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A job's payload does not decode as its kind's arguments (a missing
    /// field or a value of another type): written as the job's error when
    /// it ends `dead`, without further attempts.
    #[error("payload of job kind `{kind}` does not decode")]
    Decode {
        /// [`JobArgs::KIND`].
        kind: &'static str,
        /// Why, naming the field.
        #[source]
        source: serde_json::Error,
    },
}

impl NewJob {
    /// A job of kind [`JobArgs::KIND`] on `queue`, with `args` as its
    /// payload; no key, priority 0 (the other settings as on
    /// [`NewJob::new`]).
    ///
    /// # Errors
    ///
    /// [`ArgsError::Serialize`] when `args` does not serialise as JSON.
    pub fn from_args<A: JobArgs>(queue: impl Into<String>, args: &A) -> Result<Self, ArgsError> {
        let payload = serde_json::to_value(args).map_err(|source| ArgsError::Serialize {
            kind: A::KIND,
            source,
        })?;
        Ok(NewJob::new(queue, A::KIND, payload))
    }
}

/// `A` from a job's payload.
pub(crate) fn decode<A: JobArgs>(payload: &serde_json::Value) -> Result<A, ArgsError> {
    A::deserialize(payload).map_err(|source| ArgsError::Decode {
        kind: A::KIND,
        source,
    })
}
