//! A per-second schedule run by two `shardq worker` processes over two
//! shards for about 10 s, one of them SIGKILLed and restarted in the middle:
//! every tick from the first to the last is enqueued exactly once (checked
//! by the jobs' deduplication ids, which name their tick), all on the shard
//! the schedule's name routes to, and the durable `last_tick` is the last
//! job's tick.

use crate::common;

use chrono::{DateTime, TimeDelta, Utc};
use common::{wait_until, TestShards};
use shardq::router;
use shardq::Schedule;
use shardq_harness::process::{Ended, Proc};
use std::path::Path;
use std::time::Duration;

const NAME: &str = "every-second";

const FLEET_TOML: &str = "
[worker]
queues = [\"ticks\"]
concurrency = 2

[[schedules]]
name = \"every-second\"
cron = \"* * * * * *\"
queue = \"ticks\"
handler = \"noop\"
payload = { from = \"fleet\" }
";

fn worker(config: &Path, log: &Path) -> Proc {
    let mut command = shardq_harness::exe::shardq_command(config);
    command.arg("worker");
    Proc::spawn(command, log.to_path_buf(), true).unwrap()
}

async fn stop(mut worker: Proc) {
    worker.terminate();
    match worker.wait_or_kill(Duration::from_secs(15)).await {
        Ended::Exited(status) if status.success() => {}
        other => panic!("worker ended {other:?}\n{}", worker.log_tail()),
    }
}

async fn schedule_jobs(shard: &shardq::shards::Shard) -> i64 {
    let db = shard.client().await.unwrap();
    db.query_one(
        "SELECT count(*) FROM workflow_status WHERE dedup_id LIKE 'every-second@%'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_enqueue_every_tick_once_across_a_kill_and_restart() {
    let shards = TestShards::databases(2).await;
    let config = shards.config(FLEET_TOML);
    let set = shards.migrated(&config).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shards.toml");
    std::fs::write(&path, shards.toml(FLEET_TOML)).unwrap();

    let a = worker(&path, &dir.path().join("a.log"));
    let mut b = worker(&path, &dir.path().join("b.log"));
    let home = router::shard_index(router::shard_key_for(NAME), set.len());
    let probe = set.get(home).clone();
    wait_until(Duration::from_secs(30), "the first tick's job", || {
        let probe = probe.clone();
        async move { schedule_jobs(&probe).await > 0 }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    b.kill().await.unwrap();
    let killed_at = Utc::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = worker(&path, &dir.path().join("b2.log"));
    let restarted_at = Utc::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop(a).await;
    stop(b).await;

    let mut ticks: Vec<DateTime<Utc>> = Vec::new();
    // How long after its tick each job was written (printed, not asserted).
    let mut lateness_ms: Vec<i64> = Vec::new();
    for (index, shard) in set.all().iter().enumerate() {
        let db = shard.client().await.unwrap();
        let rows = db
            .query(
                "SELECT dedup_id, count(*), min(created_at) FROM workflow_status \
                 WHERE dedup_id LIKE 'every-second@%' GROUP BY 1",
                &[],
            )
            .await
            .unwrap();
        if index != home {
            assert!(
                rows.is_empty(),
                "jobs on shard {index}, not the routed {home}"
            );
        }
        for row in rows {
            let dedup_id: String = row.get(0);
            let copies: i64 = row.get(1);
            assert_eq!(copies, 1, "tick {dedup_id} enqueued {copies} times");
            let at = dedup_id.split_once('@').unwrap().1;
            let tick = DateTime::parse_from_rfc3339(at).unwrap().to_utc();
            let created: DateTime<Utc> = row.get(2);
            lateness_ms.push((created - tick).num_milliseconds());
            ticks.push(tick);
        }
    }
    ticks.sort();
    lateness_ms.sort();
    println!(
        "written after their tick: min {} ms, median {} ms, max {} ms",
        lateness_ms[0],
        lateness_ms[lateness_ms.len() / 2],
        lateness_ms[lateness_ms.len() - 1]
    );
    println!(
        "{} ticks from {} to {}; killed at {killed_at}, restarted at {restarted_at}",
        ticks.len(),
        ticks[0],
        ticks[ticks.len() - 1]
    );
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::seconds(1),
            "tick lost between {} and {}",
            pair[0],
            pair[1]
        );
    }
    let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
    assert!(
        first < killed_at - TimeDelta::seconds(2),
        "first tick {first}"
    );
    assert!(
        last > restarted_at + TimeDelta::seconds(3),
        "last tick {last}"
    );

    let recorded = shardq::store::schedules::last_tick(set.get(home), NAME)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recorded.at, last, "last_tick is the last job's tick");
    // Same as the schedule computes: every tick is a whole second.
    let schedule = Schedule::new(NAME, "* * * * * *", "ticks", "noop").unwrap();
    assert_eq!(schedule.latest_at_or_before(last), Some(last));
}
