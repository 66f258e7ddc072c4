//! Handlers: named async functions that run a job.

pub use super::context::HandlerError;
use super::context::JobContext;
use crate::job::Outcome;
use crate::job_args::JobArgs;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a handler returns: the job's output, or why it failed.
pub type HandlerResult = Result<Value, HandlerError>;

type HandlerFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;
type HandlerFn = dyn Fn(JobContext) -> HandlerFuture + Send + Sync;

/// A handler's error that ends its job `dead` at once, without the attempts
/// it has left: for a failure that no retry can mend (a request the remote
/// side refuses as malformed, say). Return it as the handler's error, or as
/// a cause anywhere in the error's chain (so also from a step's closure);
/// its message becomes the job's error. Any other error is retried after a
/// backoff while attempts are left.
///
/// ```
/// # let mut handlers = shardq::HandlerRegistry::new();
/// handlers.register("charge", |ctx| async move {
///     let Some(cents) = ctx.payload["cents"].as_u64() else {
///         return Err(shardq::PermanentFailure::new("`cents` is missing or not a number").into());
///     };
///     Ok(serde_json::json!({ "charged": cents }))
/// });
/// ```
#[derive(Debug)]
pub struct PermanentFailure(HandlerError);

impl PermanentFailure {
    /// `error`, as a failure not to retry.
    pub fn new(error: impl Into<HandlerError>) -> Self {
        PermanentFailure(error.into())
    }
}

// Transparent: the job's error reads as the wrapped error's chain.
impl std::fmt::Display for PermanentFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for PermanentFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Whether `err` or one of its causes is a [`PermanentFailure`].
fn is_permanent(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |e| e.source()).any(|e| e.is::<PermanentFailure>())
}

/// The name of the built-in handler that does nothing and returns `null`
/// (registered by [`HandlerRegistry::with_builtins`]).
pub const NOOP: &str = "noop";

/// The name of the built-in handler that sleeps `payload.ms` milliseconds
/// (default 100), for demos, benchmarks and shutdown tests (registered by
/// [`HandlerRegistry::with_builtins`]).
pub const SLEEP: &str = "sleep";

/// Default sleep of the [`SLEEP`] handler.
const DEFAULT_SLEEP_MS: u64 = 100;

/// Handlers by name. Empty when new; [`HandlerRegistry::with_builtins`]
/// starts with the built-in [`NOOP`] and [`SLEEP`].
#[derive(Clone)]
pub struct HandlerRegistry {
    handlers: HashMap<String, Arc<HandlerFn>>,
}

impl std::fmt::Debug for HandlerRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("HandlerRegistry")
            .field("handlers", &names)
            .finish()
    }
}

impl Default for HandlerRegistry {
    /// An empty registry, as [`HandlerRegistry::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl HandlerRegistry {
    /// An empty registry: a worker runs only the handlers its embedder
    /// registers (a job naming another fails with "no handler is registered").
    pub fn new() -> Self {
        HandlerRegistry {
            handlers: HashMap::new(),
        }
    }

    /// A registry holding the built-in [`NOOP`] and [`SLEEP`] handlers: what
    /// `shardq worker` runs (its demo and the benchmarks enqueue them).
    pub fn with_builtins() -> Self {
        let mut registry = Self::new();
        registry.register(NOOP, |_ctx| async { Ok(Value::Null) });
        registry.register(SLEEP, |ctx| async move {
            let ms = ctx.payload["ms"].as_u64().unwrap_or(DEFAULT_SLEEP_MS);
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            Ok(Value::Null)
        });
        registry
    }

    /// Registers `handler` under `name`, replacing any earlier one.
    pub fn register<F, Fut>(&mut self, name: impl Into<String>, handler: F) -> &mut Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let boxed: Arc<HandlerFn> = Arc::new(move |ctx| Box::pin(handler(ctx)));
        self.handlers.insert(name.into(), boxed);
        self
    }

    /// Registers `handler` for the jobs of kind [`JobArgs::KIND`] (made by
    /// [`crate::NewJob::from_args`]), replacing any earlier handler of that
    /// name. The handler receives the payload decoded as `A`, and the job's
    /// context (for its id, cancellation and durable steps).
    ///
    /// A payload that does not decode as `A` ends the job `dead` at once,
    /// with an [`crate::ArgsError::Decode`] naming the kind and the field as
    /// its error: no attempt of the same payload could succeed.
    pub fn register_typed<A, F, Fut>(&mut self, handler: F) -> &mut Self
    where
        A: JobArgs,
        F: Fn(A, JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler = Arc::new(handler);
        self.register(A::KIND, move |ctx: JobContext| {
            let handler = handler.clone();
            async move {
                let args =
                    crate::job_args::decode::<A>(&ctx.payload).map_err(PermanentFailure::new)?;
                handler(args, ctx).await
            }
        })
    }

    /// Runs the handler named `name`; a missing handler, an error and a panic
    /// all become a failure with a message for the job's `error` column, and a
    /// [`PermanentFailure`] a `dead` outcome.
    pub(crate) async fn run(&self, name: &str, ctx: JobContext) -> Outcome {
        use futures_util::FutureExt;
        let Some(handler) = self.handlers.get(name) else {
            return Outcome::Failed(format!(
                "no handler is registered under the name `{name}`; register it in the worker or fix the job's handler"
            ));
        };
        match std::panic::AssertUnwindSafe(handler(ctx))
            .catch_unwind()
            .await
        {
            Ok(Ok(output)) => Outcome::Succeeded(output),
            Ok(Err(err)) if is_permanent(err.as_ref()) => {
                Outcome::Dead(crate::error_chain::error_chain(err.as_ref()))
            }
            Ok(Err(err)) => Outcome::Failed(crate::error_chain::error_chain(err.as_ref())),
            Err(panic) => Outcome::Failed(format!("handler panicked: {}", panic_message(&panic))),
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_registry_is_empty_and_the_builtins_are_asked_for() {
        // An embedder's worker must not run `noop` or `sleep` jobs it never
        // registered (they would succeed doing nothing).
        assert_eq!(
            format!("{:?}", HandlerRegistry::new()),
            "HandlerRegistry { handlers: [] }"
        );
        assert_eq!(
            format!("{:?}", HandlerRegistry::default()),
            "HandlerRegistry { handlers: [] }"
        );
        assert_eq!(
            format!("{:?}", HandlerRegistry::with_builtins()),
            "HandlerRegistry { handlers: [\"noop\", \"sleep\"] }"
        );
    }
}
