//! An order saga: a workflow that waits.
//!
//! The `order` workflow charges the card (a step), packs each item in a
//! child workflow and gathers their results, then waits for a `shipment`
//! message, at most `--shipment-timeout-ms`. The message arrives: the
//! order succeeds as `shipped`. The timeout passes first: it refunds the
//! card (a step) and succeeds as `refunded`. It publishes each stage as the
//! event `stage`. While it waits for its children or the message it is
//! parked: it holds no worker slot, and it runs again from the start when
//! woken, its recorded steps returning at once (so the card is charged
//! once however often it replays).
//!
//! The program enqueues one order, waits until its stage is `awaiting
//! shipment`, sends the shipment message (unless `--no-shipment`), and
//! prints how the order ended.
//!
//! Run: `shardq local up && cargo run --example order_saga [-- shards.toml]
//! [--shipment-timeout-ms MS] [--no-shipment]`.

use anyhow::{bail, Context};
use serde_json::{json, Value};
use shardq::{ChildResult, Client, Config, HandlerRegistry, JobId, JobOutcome, NewJob, Shardq};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "orders";
/// How long the order waits for its shipment unless told otherwise.
const DEFAULT_SHIPMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long this program waits for the order to reach each point.
const PATIENCE: Duration = Duration::from_secs(60);

/// The command line.
struct Args {
    config: Option<PathBuf>,
    shipment_timeout: Duration,
    ship: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        config: None,
        shipment_timeout: DEFAULT_SHIPMENT_TIMEOUT,
        ship: true,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--no-shipment" => args.ship = false,
            "--shipment-timeout-ms" => {
                let ms = argv.next().context("--shipment-timeout-ms needs a value")?;
                let ms = ms
                    .parse()
                    .with_context(|| format!("--shipment-timeout-ms {ms}: not milliseconds"))?;
                args.shipment_timeout = Duration::from_millis(ms);
            }
            flag if flag.starts_with("--") => bail!("unknown flag {flag}"),
            path => args.config = Some(PathBuf::from(path)),
        }
    }
    Ok(args)
}

/// The order workflow. Its code reaches its steps, children, events and
/// recv in the same order on every run: they are recorded by that order.
fn order_handlers() -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    handlers.register("order", |ctx| async move {
        let order = ctx.payload["order"].clone();
        let receipt: String = ctx
            .step("charge", || async {
                println!("charged the card for order {order}");
                Ok(format!("receipt-{order}"))
            })
            .await?;
        ctx.set_event("stage", json!("charged")).await?;

        // One child per item, started before any is awaited, so they run
        // side by side. `?` on `result()` parks the order until that child ends.
        let mut packing = Vec::new();
        for item in ctx.payload["items"].as_array().cloned().unwrap_or_default() {
            let job = NewJob::new(QUEUE, "pack_item", json!({ "item": item }));
            packing.push(ctx.start_child(job).await?);
        }
        let mut parcels = Vec::new();
        for child in &packing {
            match child.result().await? {
                ChildResult::Succeeded(parcel) => parcels.push(parcel),
                other => return Err(format!("an item was not packed: {other:?}").into()),
            }
        }

        ctx.set_event("stage", json!("awaiting shipment")).await?;
        let timeout =
            Duration::from_millis(ctx.payload["shipment_timeout_ms"].as_u64().unwrap_or(0));
        match ctx.recv("shipment", timeout).await? {
            Some(shipment) => {
                ctx.set_event("stage", json!("shipped")).await?;
                Ok(json!({ "outcome": "shipped", "parcels": parcels, "shipment": shipment }))
            }
            None => {
                let refund: String = ctx
                    .step("refund", || async {
                        println!("refunded {receipt}: no shipment in time");
                        Ok(format!("refund of {receipt}"))
                    })
                    .await?;
                ctx.set_event("stage", json!("refunded")).await?;
                Ok(json!({ "outcome": "refunded", "refund": refund }))
            }
        }
    });
    handlers.register("pack_item", |ctx| async move {
        Ok(json!({ "parcel": ctx.payload["item"] }))
    });
    handlers
}

/// Waits until order `id` publishes `stage` as its stage.
async fn until_stage(client: &Client, id: JobId, stage: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let seen = client
            .get_event(id, "stage", Duration::from_secs(1))
            .await?;
        if seen.as_ref().and_then(Value::as_str) == Some(stage) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("order {id} did not reach stage `{stage}` (last seen: {seen:?})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut config = Config::load(args.config.as_deref())?;
    config.worker.queues = vec![QUEUE.into()];
    let shardq = Shardq::connect(config)?;
    shardq.migrate().await?;
    let client = shardq.client();

    let stop = CancellationToken::new();
    let worker = tokio::spawn(shardq.worker(order_handlers()).run(stop.clone()));

    let payload = json!({
        "order": 42,
        "items": ["book", "lamp", "mug"],
        "shipment_timeout_ms": args.shipment_timeout.as_millis() as u64,
    });
    let id = client.enqueue(NewJob::new(QUEUE, "order", payload)).await?;
    println!("enqueued order {id}");

    until_stage(&client, id, "awaiting shipment").await?;
    println!("order {id} awaits its shipment");
    if args.ship {
        // The key makes a resend (after an error or a lost reply) deliver once.
        let shipment = json!({ "carrier": "post", "tracking": "TRACK-42" });
        client
            .send(id, "shipment", shipment, Some("order-42-shipment"))
            .await?;
        println!("sent the shipment message");
    }

    let outcome = client.result(id, args.shipment_timeout + PATIENCE).await?;
    stop.cancel();
    worker.await?;
    match outcome {
        JobOutcome::Succeeded(output) => println!("order {id} ended: {}", output["outcome"]),
        other => bail!("order {id} did not succeed: {other:?}"),
    }
    Ok(())
}
