//! `store::jobs`: leases held (`extend_leases`, `owned_running`).

use super::{
    claim, complete, exec, insert, job, one_shard, params, seconds_until, status, where_id, OWNER,
};
use serde_json::json;
use shardq::job::{Completion, Outcome};
use shardq::store::jobs::{self, Claim, ClaimParams, ExtendLeases};
use shardq::store::JobStatus;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_leases_moves_only_rows_held_under_the_same_owner_and_fence() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    insert(shard, &[job("q", 0), job("q", 1), job("q", 2)]).await;
    let short = ClaimParams {
        lease: Duration::from_secs(5),
        ..params("q", 10, OWNER)
    };
    let Claim::Jobs(claimed) = jobs::claim(shard, short).await.unwrap() else {
        panic!("claim");
    };
    let [a, b, c] = [claimed[0].id, claimed[1].id, claimed[2].id];
    let f = claimed[0].fence;
    // c finished: no owner any more.
    complete(
        shard,
        OWNER,
        &[Completion::of(&claimed[2], Outcome::Succeeded(json!(1)))],
    )
    .await;
    let held = [(a, f), (b, f + 1), (c, f)];
    let extend = |owner| ExtendLeases {
        owner,
        held: &held,
        lease: Duration::from_secs(600),
    };
    assert_eq!(
        jobs::extend_leases(shard, extend("worker-b"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(jobs::extend_leases(shard, extend(OWNER)).await.unwrap(), 1);
    let lease_a = seconds_until(shard, a, "lease_expires_at").await;
    let lease_b = seconds_until(shard, b, "lease_expires_at").await;
    assert!((590.0..=600.0).contains(&lease_a), "a: {lease_a} s");
    assert!(
        lease_b <= 5.0,
        "b with a stale fence was extended: {lease_b} s"
    );
    assert_eq!(status(shard, c).await, JobStatus::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_running_finds_an_owners_running_jobs_older_than_age() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let ids = insert(
        shard,
        &[job("q", 0), job("q", 1).ordering_key("k"), job("q", 2)],
    )
    .await;
    let mine = claim(shard, "q", 2, OWNER).await;
    assert_eq!(mine.len(), 2);
    let theirs = claim(shard, "q", 10, "worker-b").await;
    assert_eq!(theirs[0].id, ids[2]);

    let mut found = jobs::owned_running(shard, OWNER, Duration::ZERO)
        .await
        .unwrap();
    found.sort_by_key(|r| r.id.id);
    assert_eq!(
        found,
        vec![
            jobs::OwnedRunning {
                id: ids[0],
                fence: 1,
                key: None
            },
            jobs::OwnedRunning {
                id: ids[1],
                fence: 1,
                key: Some(shardq::job::key_order("q", "k"))
            },
        ]
    );
    assert!(jobs::owned_running(shard, OWNER, Duration::from_secs(300))
        .await
        .unwrap()
        .is_empty());
    exec(
        shard,
        &format!(
            "UPDATE workflow_status SET started_at = now() - interval '10 min' WHERE {}",
            where_id(ids[1])
        ),
    )
    .await;
    let old = jobs::owned_running(shard, OWNER, Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(old.iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[1]]);
    // Finished jobs are not running any more.
    complete(
        shard,
        OWNER,
        &[Completion::of(&mine[0], Outcome::Succeeded(json!(1)))],
    )
    .await;
    let left = jobs::owned_running(shard, OWNER, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(left.iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[1]]);
}
