//! Online resharding (`shardq::reshard`), one file per part of a move: under
//! load, stopped and run again, with a shard frozen, enqueues and schedules
//! while a range moves, debounced runs, lookups, and the `shardq reshard` command. What they
//! share is here: the worker's settings and a move of two shards to three.

mod children;
mod command;
mod debounce;
mod enqueue;
mod events;
mod fan_out;
mod frozen;
mod lookups;
mod message_stream;
mod messages;
mod resume;
mod schedules;
mod under_load;

use crate::common;

use common::{ShardList, TestShards};
use shardq::shards::ShardSet;
use shardq::{Client, Config, JobId, NewJob};
use std::collections::HashMap;

const WORKER_TOML: &str = "
[dequeue]
batch_size = 50
empty_backoff_min_ms = 5
empty_backoff_max_ms = 50
[worker]
queues = [\"moving\"]
concurrency = 8
maintenance_interval_ms = 100
retry_backoff_min_ms = 1500
retry_backoff_max_ms = 1500
";

async fn unfinished(shards: &ShardSet) -> i64 {
    let mut n = 0;
    for shard in shards.all() {
        let row = shard
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FROM workflow_status \
                 WHERE status NOT IN ('succeeded', 'dead', 'cancelled', 'failed')",
                &[],
            )
            .await
            .unwrap();
        n += row.get::<_, i64>(0);
    }
    n
}

/// A key whose shard key the move 2 → 3 gives to the new shard.
/// Shards 0 and 1 migrated with a two-shard map, shard 2 migrated to join
/// (`TestShards` of three), with the configs of both lists (`extra` added)
/// and the plan of 2 → 3. Bind `servers`: dropping it stops them.
pub(crate) struct GrowingToThree {
    pub servers: TestShards,
    pub old: Config,
    pub new: Config,
    pub all: ShardSet,
    pub plan: shardq::reshard::Plan,
}

pub(crate) async fn growing_to_three(servers: TestShards, extra: &str) -> GrowingToThree {
    let old = Config::from_toml(
        &ShardList::numbered(&servers.urls[..2])
            .pool_size(12)
            .toml(extra),
    )
    .unwrap();
    let new =
        Config::from_toml(&ShardList::numbered(&servers.urls).pool_size(12).toml(extra)).unwrap();
    shardq::migrate::migrate_all(&ShardSet::connect(&old).unwrap())
        .await
        .unwrap();
    let all = ShardSet::connect(&new).unwrap();
    shardq::migrate::migrate_joining(all.get(2), 3)
        .await
        .unwrap();
    let plan = shardq::reshard::plan(shardq::shard_map::ShardMap::from_formula(2).ranges(), 3);
    GrowingToThree {
        servers,
        old,
        new,
        all,
        plan,
    }
}

/// Two databases migrated with a two-shard map and two more migrated to
/// join a list of four, with the configs of both lists (`extra` added).
/// Bind `servers`: dropping it stops them.
pub(crate) struct GrowingToFour {
    pub servers: TestShards,
    pub old: Config,
    pub new: Config,
    pub all: ShardSet,
}

pub(crate) async fn growing_to_four(extra: &str) -> GrowingToFour {
    let servers = TestShards::databases(4).await;
    let list = |urls: &[String]| {
        Config::from_toml(&ShardList::numbered(urls).pool_size(12).toml(extra)).unwrap()
    };
    let (old, new) = (list(&servers.urls[..2]), list(&servers.urls));
    shardq::migrate::migrate_all(&ShardSet::connect(&old).unwrap())
        .await
        .expect("migrate");
    let all = ShardSet::connect(&new).unwrap();
    for shard in &all.all()[2..] {
        shardq::migrate::migrate_joining(shard, 4)
            .await
            .expect("migrate a new shard");
    }
    GrowingToFour {
        servers,
        old,
        new,
        all,
    }
}

/// [`growing_to_three`] on three servers (one can be frozen), statements
/// given up after `statement_ms`, with `jobs` enqueued by the map of two.
async fn on_servers_with_jobs(
    statement_ms: u64,
    jobs: Vec<NewJob>,
) -> (GrowingToThree, Vec<JobId>) {
    let fast = format!("{WORKER_TOML}[database]\nstatement_timeout_ms = {statement_ms}\n");
    let m = growing_to_three(TestShards::servers(3).await, &fast).await;
    let first = Client::new(&m.new)
        .unwrap()
        .enqueue_many(jobs)
        .await
        .unwrap();
    (m, first)
}

/// A REPEATABLE READ transaction on `db`, its snapshot not yet taken.
async fn repeatable_read(db: &mut deadpool_postgres::Client) -> deadpool_postgres::Transaction<'_> {
    db.build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap()
}

fn moving_key(plan: &shardq::reshard::Plan, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| {
            let at = shardq::router::shard_key_for(k);
            plan.moves
                .iter()
                .any(|m| m.first_key <= at && at < m.end_key && m.to_index == 2)
        })
        .unwrap()
}

async fn statuses(shard: &shardq::shards::Shard) -> HashMap<String, i64> {
    let db = shard.client().await.unwrap();
    db.query(
        "SELECT status, count(*) FROM workflow_status GROUP BY status",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}
