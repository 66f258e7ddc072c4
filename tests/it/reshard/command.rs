//! `shardq reshard` as a user runs it.

use crate::common;

use common::{ShardList, TestShards};

/// `shardq reshard` as a user runs it: the dry run prints the plan and
/// changes nothing, the move prints its end, `shards show` the new epoch;
/// a new list that reorders the current shards is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_plans_moves_and_refuses_a_reordered_list() {
    let servers = TestShards::databases(3).await;
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, urls: &[String]| {
        let path = dir.path().join(name);
        std::fs::write(&path, ShardList::numbered(urls).pool_size(12).toml("")).unwrap();
        path
    };
    let old = write("old.toml", &servers.urls[..2]);
    let new = write("new.toml", &servers.urls);
    let reordered = write(
        "reordered.toml",
        &[
            servers.urls[1].clone(),
            servers.urls[0].clone(),
            servers.urls[2].clone(),
        ],
    );
    let run = shardq_harness::exe::shardq_output;
    assert!(run(&old, &["migrate"]).await.0);

    let (ok, text) = run(
        &old,
        &["reshard", "--to", new.to_str().unwrap(), "--dry-run"],
    )
    .await;
    assert!(ok, "{text}");
    assert!(text.contains("plan for epoch 2: 2 ranges move"), "{text}");
    assert!(
        text.contains("s0 → s2") && text.contains("s1 → s2"),
        "{text}"
    );
    assert!(text.contains("dry run: nothing changed"), "{text}");
    let (ok, text) = run(&new, &["shards", "show"]).await;
    assert!(
        ok && text.contains("shard map epoch 1 (2 shards)"),
        "{text}"
    );

    let (ok, text) = run(&old, &["reshard", "--to", reordered.to_str().unwrap()]).await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("the new list replaces shard 0 and has 3 shards instead of 2"),
        "{text}"
    );

    let (ok, text) = run(&old, &["reshard", "--to", new.to_str().unwrap()]).await;
    assert!(ok, "{text}");
    assert!(text.contains("done: epoch 2, 2 ranges moved"), "{text}");
    let (ok, text) = run(&new, &["shards", "show"]).await;
    assert!(
        ok && text.contains("shard map epoch 2 (3 shards)"),
        "{text}"
    );
    let (ok, text) = run(&new, &["check"]).await;
    assert!(ok, "the moved fleet passes `shardq check`: {text}");
}
