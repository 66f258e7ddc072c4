//! `store::steps`: a workflow's recorded steps.

use super::{claim, insert, job, one_shard, OWNER};
use serde_json::{json, Value};
use shardq::store::jobs;
use shardq::store::steps;
use shardq::JobId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_record_is_fenced_and_get_reads_it_back() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];
    assert_eq!(steps::get(shard, id, "fetch").await.unwrap(), None);
    let c = claim(shard, "q", 1, OWNER).await.remove(0);
    let out = json!({ "rows": 3 });
    let null = Value::Null;
    let step = |name, output, owner, fence| steps::RecordStep {
        id,
        name,
        output,
        owner,
        fence,
    };
    assert!(steps::record(shard, step("fetch", &out, OWNER, c.fence))
        .await
        .unwrap());
    assert_eq!(
        steps::get(shard, id, "fetch").await.unwrap(),
        Some(Some(out.clone()))
    );
    // A JSON null is a recorded output.
    assert!(steps::record(shard, step("nothing", &null, OWNER, c.fence))
        .await
        .unwrap());
    assert_eq!(
        steps::get(shard, id, "nothing").await.unwrap(),
        Some(Some(Value::Null))
    );
    // Stale fence, other owner: refused.
    assert!(
        !steps::record(shard, step("late", &out, OWNER, c.fence - 1))
            .await
            .unwrap()
    );
    assert!(
        !steps::record(shard, step("late", &out, "worker-b", c.fence))
            .await
            .unwrap()
    );
    assert_eq!(steps::get(shard, id, "late").await.unwrap(), None);
    // Cancellation asked: refused.
    jobs::cancel(shard, id).await.unwrap();
    assert!(!steps::record(shard, step("late", &out, OWNER, c.fence))
        .await
        .unwrap());
    assert_eq!(steps::get(shard, id, "late").await.unwrap(), None);
    // Steps belong to their workflow.
    let other = JobId {
        shard_key: id.shard_key,
        id: id.id + 1000,
    };
    assert_eq!(steps::get(shard, other, "fetch").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_record_repeated_says_recorded_and_keeps_the_first_output() {
    let (_pg, _config, set) = one_shard("").await;
    let shard = set.get(0);
    let id = insert(shard, &[job("q", 0)]).await[0];
    let c = claim(shard, "q", 1, OWNER).await.remove(0);
    let out = json!({ "rows": 3 });
    let other_out = json!("other");
    let step = |output| steps::RecordStep {
        id,
        name: "fetch",
        output,
        owner: OWNER,
        fence: c.fence,
    };
    assert!(steps::record(shard, step(&out)).await.unwrap());
    // The documented contract: "Returns whether it is recorded (now or
    // before)"; "a repeat finds the step recorded".
    let again = steps::record(shard, step(&other_out)).await.unwrap();
    assert_eq!(
        steps::get(shard, id, "fetch").await.unwrap(),
        Some(Some(out.clone()))
    );
    assert!(
        again,
        "a repeat of a recorded step is reported as not recorded"
    );
}
