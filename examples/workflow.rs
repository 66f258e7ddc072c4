//! A durable workflow, enqueued in your own transaction, run by a worker that
//! shuts down gracefully.
//!
//! - **Transactional enqueue**: the order row and its job commit together, on
//!   the shard the job routes to, or neither does.
//! - **Durable steps**: each step's output is recorded once; a retried
//!   attempt (here: the first attempt fails after charging the card) reuses
//!   recorded outputs instead of charging again.
//! - **Graceful shutdown**: Ctrl-C or SIGTERM stops claiming, lets running
//!   handlers finish, gives unstarted jobs back and writes every outcome.
//!   Without a signal, it stops once the queue is empty.
//!
//! Run: `shardq local up && cargo run --example workflow [-- shards.toml]`.

use shardq::{Config, HandlerRegistry, NewJob, Shardq};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).map(PathBuf::from);
    let mut config = Config::load(path.as_deref())?;
    config.worker.queues = vec!["orders".into()];
    let shardq = Shardq::connect(config)?;
    shardq.migrate().await?;

    // Your transaction, on the shard the job routes to: your own table and
    // the job commit together.
    let job = NewJob::new("orders", "fulfil", serde_json::json!({ "order": 42 }))
        .ordering_key("customer-7");
    let routed = shardq.client().route(job)?;
    let mut db = routed.shard().user_client().await?;
    let tx = db.transaction().await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS example_orders (id int PRIMARY KEY)")
        .await?;
    tx.execute(
        "INSERT INTO example_orders VALUES (42) ON CONFLICT DO NOTHING",
        &[],
    )
    .await?;
    let id = routed.insert(&*tx).await?;
    tx.commit().await?;
    println!("order 42 and job {id} committed together");

    let charges = Arc::new(AtomicU32::new(0));
    let mut handlers = HandlerRegistry::new();
    let counter = charges.clone();
    handlers.register("fulfil", move |ctx| {
        let charges = counter.clone();
        async move {
            let receipt: String = ctx
                .step("charge", || async {
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok("receipt-42".to_string())
                })
                .await?;
            if ctx.attempt == 1 {
                return Err("the warehouse did not answer; try again".into());
            }
            let parcel: String = ctx
                .step("ship", || async { Ok(format!("parcel for {receipt}")) })
                .await?;
            Ok(serde_json::json!({ "receipt": receipt, "parcel": parcel }))
        }
    });

    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        on_signal.cancel();
    });
    let report = shardq
        .worker(handlers)
        .stop_when_empty(true)
        .run(shutdown)
        .await;
    let outcome = shardq
        .client()
        .result(id, std::time::Duration::from_secs(5))
        .await?;
    println!(
        "attempts: {}, card charged {} time(s), outcome: {outcome:?}",
        report.stats.succeeded + report.stats.retrying,
        charges.load(Ordering::SeqCst)
    );
    Ok(())
}
