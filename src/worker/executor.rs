//! Executor slots: each runs one handler at a time. Jobs with an ordering key
//! always reach the same slot (hash of their queue and key: ordering is per
//! queue and key, see [`slot_for`]), so they run in claim order and never
//! concurrently in this process; other jobs go to any free slot.

use super::context::JobContext;
use super::handler::HandlerRegistry;
use super::slot_input::SlotInputs;
use super::step_log::StepLog;
use super::worker_run::{ShardAnswers, WorkerRun};
use crate::config::Config;
use crate::job::{ClaimedJob, Completion, Outcome};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The executor slots' settings, from [`Config`].
#[derive(Debug, Clone)]
pub(crate) struct ExecutorConfig {
    /// Longest a handler may run (`worker.handler_timeout`).
    pub handler_timeout: Option<Duration>,
    /// Largest message a handler's `send` takes (`limits.max_payload_bytes`).
    pub max_message_bytes: usize,
    /// Attempts of a child workflow that does not say
    /// (`limits.default_max_attempts`).
    pub default_max_attempts: i32,
}

impl ExecutorConfig {
    pub(crate) fn new(config: &Config) -> Self {
        ExecutorConfig {
            handler_timeout: config.worker.handler_timeout,
            max_message_bytes: config.limits.max_payload_bytes,
            default_max_attempts: config.limits.default_max_attempts,
        }
    }
}

/// The slot of the jobs of ordering key `key` in `queue`, among `slots`: the
/// producers dispatch by it, and a slot's hold-back ([`HeldBack`]) is by the
/// same (queue, key), so the same key string in two queues is two keys.
pub(crate) fn slot_for(queue: &str, key: &str, slots: usize) -> usize {
    // A NUL cannot occur in either (PostgreSQL text): ("ab", "c") and
    // ("a", "bc") hash apart.
    let mut bytes = Vec::with_capacity(queue.len() + 1 + key.len());
    bytes.extend_from_slice(queue.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(key.as_bytes());
    (crate::router::fnv1a64(&bytes) % slots.max(1) as u64) as usize
}

/// What every executor slot uses.
pub(crate) struct Executor {
    pub config: ExecutorConfig,
    pub run: Arc<WorkerRun>,
    pub registry: Arc<HandlerRegistry>,
}

/// One slot's loop. Returns when `stop` is cancelled (after finishing the
/// job in hand) or when its inputs are closed and drained; hands back its
/// inputs so that the jobs still in its own queue can be released (those
/// set aside are released from the [`SetAsideJobs`] they share).
///
/// A job of a sick shard (see [`ShardHealth::sick`]) runs only when the slot
/// has nothing else to run (see `set_aside`).
///
/// A completion is handed on with a send that never waits in practice: the
/// channel holds as many as there are buffer credits (see `credits`).
///
/// [`SetAsideJobs`]: super::slot_input::SetAsideJobs
/// [`ShardHealth::sick`]: super::shard_health::ShardHealth::sick
pub(crate) async fn run_slot(
    executor: Arc<Executor>,
    mut inputs: SlotInputs,
    completions: mpsc::Sender<Completion>,
    stop: CancellationToken,
) -> SlotInputs {
    let mut held_back = HeldBack::default();
    let health = &executor.run.health;
    loop {
        // Biased: stop first, then the inputs.
        let job = tokio::select! {
            biased;
            _ = stop.cancelled() => return inputs,
            job = inputs.next(|shard| health.sick(shard)) => match job {
                Some(job) => job,
                None => return inputs,
            },
        };
        executor.run.stats.record_unbuffered(1);
        let completion = if held_back.holds(&job) {
            Completion::of(&job, Outcome::Released)
        } else {
            let key = job
                .ordering_key
                .clone()
                .map(|k| ((job.queue.clone(), k), job.claim));
            let done = execute(&executor, job).await;
            // Only a retried failure or a parked workflow (it runs again
            // when it wakes) holds the run back: a job dead for good is not
            // run again, so the next jobs of its key keep their order.
            if let (Some(key), Outcome::Failed(_) | Outcome::Parked) = (key, &done.outcome) {
                held_back.failed(key);
            }
            done
        };
        if completions.send(completion).await.is_err() {
            return inputs;
        }
    }
}

/// Keys whose run failed in this slot: the rest of that run (the jobs of the
/// key that came in the same claim) is released unstarted, so the key's
/// later jobs wait behind the failed one's retry instead of overtaking it.
/// A key is a (queue, ordering key): a job of the same key string in another
/// queue is another key and neither lifts nor takes the hold.
#[derive(Default)]
struct HeldBack {
    /// (Queue, key) → the claim whose run failed.
    failed: HashMap<(String, String), u64>,
}

/// More failed runs than this remembered at once means something is badly
/// wrong; forgetting them only risks running a failed run's tail.
const HELD_BACK_LIMIT: usize = 4096;

impl HeldBack {
    fn failed(&mut self, (key, claim): ((String, String), u64)) {
        if self.failed.len() >= HELD_BACK_LIMIT {
            self.failed.clear();
        }
        self.failed.insert(key, claim);
    }

    /// Whether `job` belongs to a run that failed; forgets older runs of its key.
    fn holds(&mut self, job: &ClaimedJob) -> bool {
        let Some(key) = &job.ordering_key else {
            return false;
        };
        let key = (job.queue.clone(), key.clone());
        match self.failed.get(&key) {
            Some(&claim) if claim == job.claim => true,
            Some(_) => {
                self.failed.remove(&key);
                false
            }
            None => false,
        }
    }
}

/// Runs one job's handler and turns the result into a completion. While it
/// runs, the job's cancellation token is the one the leaser cancels; a job
/// whose cancellation was asked before it started is released instead (and
/// written as cancelled).
async fn execute(executor: &Executor, job: ClaimedJob) -> Completion {
    let run = &executor.run;
    let cancel = run.running.cancel_token(job.id);
    if cancel.is_cancelled() {
        return Completion::of(&job, Outcome::Released);
    }
    if let Ok(waited) = std::time::SystemTime::now().duration_since(job.created_at) {
        run.stats.record_pickup(job.shard, &job.queue, waited);
    }
    let mut done = Completion::of(&job, Outcome::Released);
    let ctx = JobContext {
        id: job.id,
        queue: job.queue,
        ordering_key: job.ordering_key,
        payload: job.payload,
        attempt: job.attempt,
        enqueued_at: job.created_at,
        fence: job.fence,
        shard: run.shards.get(job.shard).clone(),
        owner: run.owner.clone(),
        cancel,
        steps: Arc::new(StepLog::for_claim(job.fence, job.attempt, job.held_until)),
        sleeps: Default::default(),
        sends: Default::default(),
        recvs: Default::default(),
        set_events: Default::default(),
        get_events: Default::default(),
        shards: run.shards.clone(),
        max_message_bytes: executor.config.max_message_bytes,
        children: Default::default(),
        default_max_attempts: executor.config.default_max_attempts,
        parked: Default::default(),
        answers: ShardAnswers(run.clone()),
    };
    let parked = ctx.parked.clone();
    run.stats.record_handler_running(true);
    let outcome = run_with_timeout(executor, job.handler, ctx).await;
    run.stats.record_handler_running(false);
    // A handler that returned the error of a sleep not over (or of a recv
    // that waits for a message) parks (it may have wrapped it: asking to
    // park is what counts); one that succeeded anyway has succeeded.
    let parked = parked.load(std::sync::atomic::Ordering::SeqCst);
    let outcome = match outcome {
        Outcome::Failed(_) if parked => Outcome::Parked,
        other => other,
    };
    match &outcome {
        Outcome::Failed(message) => tracing::debug!(job = %done.id, error = %message, "job failed"),
        Outcome::Dead(message) => {
            tracing::debug!(job = %done.id, error = %message, "job failed for good")
        }
        Outcome::Parked => {
            tracing::debug!(job = %done.id, "workflow parked until its sleep ends or its message comes")
        }
        Outcome::Succeeded(_) | Outcome::Released => {}
    }
    done.outcome = outcome.storable();
    done.finished = std::time::Instant::now();
    done
}

/// Runs the handler as its own task, so that one that never returns can be
/// abandoned after `worker.handler_timeout`: its attempt fails (and is retried
/// like any failure) and the slot moves on. A task stuck without awaiting
/// cannot be stopped, only abandoned; it is counted.
async fn run_with_timeout(executor: &Executor, handler: String, ctx: JobContext) -> Outcome {
    let registry = executor.registry.clone();
    let shard = ctx.shard.index;
    // The handler's own events carry the job: its id, queue, shard and attempt.
    let span = tracing::info_span!(
        "job",
        id = %ctx.id,
        queue = %ctx.queue,
        shard = %ctx.shard.name,
        attempt = ctx.attempt,
        handler = %handler,
    );
    let mut task = tokio::spawn(async move { registry.run(&handler, ctx).await }.instrument(span));
    let Some(limit) = executor.config.handler_timeout else {
        return task
            .await
            .unwrap_or_else(|e| Outcome::Failed(format!("handler task failed: {e}")));
    };
    match tokio::time::timeout(limit, &mut task).await {
        Ok(joined) => {
            joined.unwrap_or_else(|e| Outcome::Failed(format!("handler task failed: {e}")))
        }
        Err(_) => {
            task.abort();
            executor.run.stats.record_abandoned(shard);
            tracing::warn!(
                timeout_s = limit.as_secs_f64(),
                "handler timed out; abandoning it"
            );
            Outcome::Failed(format!(
                "handler timed out after {} ms and was abandoned (worker.handler_timeout_ms)",
                limit.as_millis()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobId;
    use crate::shards::ShardSet;
    use crate::telemetry::Stats;
    use crate::worker::running::LostClaims;
    use crate::worker::shard_health::ShardHealth;
    use crate::worker::slot_input::SetAsideJobs;
    use std::sync::Mutex;

    /// The inputs of slot 0 of one, over two shards.
    fn inputs(
        own: mpsc::Receiver<ClaimedJob>,
        unkeyed: async_channel::Receiver<ClaimedJob>,
    ) -> SlotInputs {
        SlotInputs {
            slot: 0,
            own,
            unkeyed,
            set_aside: Arc::new(SetAsideJobs::new(1, 2)),
        }
    }

    /// An executor over a shard it never connects to: the handler here
    /// touches no database, and pools connect only when used.
    fn executor(calls: Arc<Mutex<Vec<String>>>) -> Arc<Executor> {
        let config = Config::from_toml(
            "[[shards]]\nname = \"s0\"\nurl = \"postgres://nobody@127.0.0.1:1/none\"\n\
             [[shards]]\nname = \"s1\"\nurl = \"postgres://nobody@127.0.0.1:1/none\"\n",
        )
        .unwrap();
        let shards = ShardSet::connect(&config).unwrap();
        let mut registry = HandlerRegistry::new();
        registry.register("record", move |ctx: JobContext| {
            let calls = calls.clone();
            async move {
                let name = ctx.payload["name"].as_str().unwrap_or_default().to_string();
                calls.lock().unwrap().push(name);
                if ctx.payload["fail"] == true {
                    return Err("failed on purpose".into());
                }
                if ctx.payload["dead"] == true {
                    let failure = crate::worker::handler::PermanentFailure::new("dead on purpose");
                    return Err(failure.into());
                }
                Ok(serde_json::Value::Null)
            }
        });
        Arc::new(Executor {
            config: ExecutorConfig::new(&config),
            run: Arc::new(WorkerRun {
                lost_claims: LostClaims::new(2),
                shards,
                owner: "test".into(),
                stats: Arc::new(Stats::new(2)),
                running: Default::default(),
                health: ShardHealth::new(2, Duration::from_millis(250)),
                permits: Arc::new(crate::worker::permits::Permits::new(&[], 0)),
            }),
            registry: Arc::new(registry),
        })
    }

    fn job(id: i64, queue: &str, key: &str, claim: u64, fail: bool) -> ClaimedJob {
        ClaimedJob {
            id: JobId { shard_key: 0, id },
            shard: 0,
            queue: queue.into(),
            handler: "record".into(),
            ordering_key: Some(key.into()),
            payload: serde_json::json!({ "name": format!("{queue}{id}"), "fail": fail }),
            attempt: 1,
            fence: 1,
            claim,
            created_at: std::time::SystemTime::now(),
            held_until: tokio::time::Instant::now(),
        }
    }

    /// Runs `jobs` through one slot of `executor` (in its own queue, in
    /// this order) until `n` outcomes come back: each job's id and outcome.
    async fn slot_outcomes(
        executor: Arc<Executor>,
        jobs: Vec<ClaimedJob>,
        n: usize,
    ) -> Vec<(i64, Outcome)> {
        let (own_tx, own_rx) = mpsc::channel(8);
        let (unkeyed_tx, unkeyed_rx) = async_channel::bounded::<ClaimedJob>(1);
        let (done_tx, mut done_rx) = mpsc::channel(8);
        for j in jobs {
            own_tx.send(j).await.unwrap();
        }
        let stop = CancellationToken::new();
        let slot = tokio::spawn(run_slot(
            executor,
            inputs(own_rx, unkeyed_rx),
            done_tx,
            stop.clone(),
        ));
        let mut outcomes = Vec::new();
        while outcomes.len() < n {
            let done = done_rx.recv().await.expect("a completion");
            outcomes.push((done.id.id, done.outcome));
        }
        stop.cancel();
        slot.await.unwrap();
        drop((own_tx, unkeyed_tx));
        outcomes
    }

    /// Each outcome's job id and kind of outcome.
    fn kinds(outcomes: Vec<(i64, Outcome)>) -> Vec<(i64, &'static str)> {
        outcomes
            .into_iter()
            .map(|(id, outcome)| {
                let what = match outcome {
                    Outcome::Succeeded(_) => "succeeded",
                    Outcome::Failed(_) => "failed",
                    Outcome::Dead(_) => "dead",
                    Outcome::Released => "released",
                    Outcome::Parked => "parked",
                };
                (id, what)
            })
            .collect()
    }

    /// A slot serving two queues whose jobs share a key string: a job of
    /// queue B between the failed run of queue A and the rest of that run
    /// must not lift A's hold-back (ordering is per queue and key).
    #[tokio::test]
    async fn another_queues_job_of_the_same_key_string_keeps_the_failed_runs_hold() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        // Claim 1 brought A's run of key k (A1 fails); claim 2, B's job of k,
        // reached the slot between A1 and the rest of A's run.
        let jobs = vec![
            job(1, "A", "k", 1, true),
            job(2, "B", "k", 2, false),
            job(3, "A", "k", 1, false),
            job(4, "A", "k", 1, false),
        ];
        let outcomes = kinds(slot_outcomes(executor(calls.clone()), jobs, 4).await);
        assert_eq!(
            outcomes,
            vec![
                (1, "failed"),
                (2, "succeeded"),
                (3, "released"),
                (4, "released")
            ],
            "A's later jobs wait behind A1's retry; B's job runs"
        );
        assert_eq!(*calls.lock().unwrap(), vec!["A1", "B2"]);
    }

    /// A job of a run that fails for good is not run again, so the rest of
    /// its run keeps its order by running now: only a retried failure holds
    /// the run back.
    #[tokio::test]
    async fn a_run_goes_on_after_a_job_that_failed_for_good() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let mut first = job(1, "A", "k", 1, false);
        first.payload["dead"] = true.into();
        let jobs = vec![
            first,
            job(2, "A", "k", 1, false),
            job(3, "A", "k", 1, false),
        ];
        let outcomes: Vec<(i64, String)> = slot_outcomes(executor(calls.clone()), jobs, 3)
            .await
            .into_iter()
            .map(|(id, outcome)| match outcome {
                Outcome::Dead(message) => (id, format!("dead: {message}")),
                other => (id, format!("{other:?}")),
            })
            .collect();
        assert_eq!(
            outcomes,
            vec![
                (1, "dead: dead on purpose".to_string()),
                (2, "Succeeded(Null)".to_string()),
                (3, "Succeeded(Null)".to_string())
            ]
        );
        assert_eq!(*calls.lock().unwrap(), vec!["A1", "A2", "A3"]);
    }

    /// A slot holding jobs of a sick shard runs the healthy shard's job
    /// first and the sick one's only when nothing else is there, in their
    /// key's order; the hold-back of a failed run still releases the rest
    /// of that run when it comes to run.
    #[tokio::test]
    async fn a_sick_shards_jobs_run_after_the_healthy_ones_in_key_order_with_the_hold_back() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let on_shard_1 = |mut j: ClaimedJob| {
            j.shard = 1;
            j
        };
        // Shard 0's key k: A1 fails, A2 is the rest of its run, A3 a later claim.
        let jobs = vec![
            job(1, "A", "k", 1, true),
            on_shard_1(job(2, "B", "j", 1, false)),
            job(3, "A", "k", 1, false),
            job(4, "A", "k", 2, false),
        ];
        let executor = executor(calls.clone());
        executor.run.health.write_failed(0);
        let outcomes = kinds(slot_outcomes(executor, jobs, 4).await);
        assert_eq!(
            outcomes,
            vec![
                (2, "succeeded"),
                (1, "failed"),
                (3, "released"),
                (4, "succeeded")
            ],
            "the healthy shard's job first; then shard 0's, held back as before"
        );
        assert_eq!(*calls.lock().unwrap(), vec!["B2", "A1", "A4"]);
    }

    /// A slot whose two inputs are closed (every producer gone) and drained
    /// returns by itself, with its stop token never cancelled: the pipeline
    /// relies on it to learn that the slots are done.
    #[tokio::test]
    async fn a_slot_returns_when_both_of_its_inputs_close() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (own_tx, own_rx) = mpsc::channel(8);
        let (shared_tx, shared_rx) = async_channel::bounded::<ClaimedJob>(8);
        let (done_tx, mut done_rx) = mpsc::channel(8);
        own_tx.send(job(1, "A", "k", 1, false)).await.unwrap();
        let stop = CancellationToken::new();
        let slot = tokio::spawn(run_slot(
            executor(calls.clone()),
            inputs(own_rx, shared_rx),
            done_tx,
            stop.clone(),
        ));
        drop((own_tx, shared_tx));
        // Generous: the slot has one job to run and then nothing to wait for.
        let returned = tokio::time::timeout(Duration::from_secs(30), slot).await;
        assert!(
            returned.is_ok(),
            "the slot must return once both inputs are closed and drained"
        );
        assert!(done_rx.recv().await.is_some(), "the job in hand was run");
        assert!(!stop.is_cancelled());
    }

    #[test]
    fn the_slot_of_a_key_is_fixed_per_queue_and_key() {
        for slots in [1, 3, 16] {
            let slot = slot_for("A", "k", slots);
            assert!(slot < slots);
            assert_eq!(slot_for("A", "k", slots), slot);
        }
        // The queue is part of the key: some key string lands apart in two
        // queues (with one hash of the string alone, none would).
        assert!((0..64).any(|i| {
            let key = format!("k{i}");
            slot_for("A", &key, 16) != slot_for("B", &key, 16)
        }));
    }
}
