//! Connections per shard: a process's pool is sized from what a worker uses
//! (producers + 6) unless `pool_size` says otherwise, idle connections are
//! closed, and `shardq status` reports what each shard's server holds.

use crate::common;

use common::{wait_until, TestShards};
use shardq::Client;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_are_sized_from_the_worker_and_idle_connections_go() {
    let shards = TestShards::databases(1).await;
    let toml = format!(
        "[[shards]]\nname = \"s0\"\nurl = \"{}\"\n[worker]\nproducers = 3\n",
        shards.urls[0]
    );
    let config = shardq::Config::from_toml(&toml).unwrap();
    assert_eq!(config.shards[0].pool_size, 3 + 6);
    let set = shards.migrated(&config).await;
    let client = Client::from_shards(set.clone(), config.limits.clone());
    let shard = set.get(0);

    let held: Vec<_> = futures_util::future::join_all((0..6).map(|_| shard.client()))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let status = client.status().await;
    let seen = status[0].connections.expect("connections reported");
    assert!(seen.shardq >= 6, "{seen:?}");
    assert!(
        seen.max >= seen.total && seen.total >= seen.shardq,
        "{seen:?}"
    );
    // Each goes back to the pool once cleaned (a round trip after the drop);
    // the maintenance loop releases idle ones every pass, as here.
    drop(held);

    wait_until(
        Duration::from_secs(10),
        "idle connections closed",
        || async {
            shard.release_idle(Duration::ZERO);
            let n = client.status().await[0].connections.expect("reported");
            // The status query's own connection is the one left.
            n.shardq <= 1
        },
    )
    .await;
}
