//! The functions that run with the owner's rights (SECURITY DEFINER) and
//! that a role writing jobs reaches (the trigger numbering ready jobs, the
//! floors it makes) resolve no name through the caller's search_path: a
//! producer that may create objects in a schema of its own puts an
//! operator `=` there, first in its search_path, raising with the role it
//! runs as. Its enqueue and its call of the floors' maker must run
//! shardq's code, not its own as the owner (before the fix the enqueue
//! raised "ran as postgres").

use crate::common;

use common::TestShards;

/// A producer role (docs/least_privilege.sql) with a schema of its own,
/// holding an `=` on text that raises with the role it runs as.
async fn producer_with_traps(shards: &TestShards) -> tokio_postgres::Client {
    let url = &shards.urls[0];
    let database = url.rsplit('/').next().expect("a database name");
    let role = format!("trap_{database}");
    let owner = common::connect(url).await;
    owner
        .batch_execute(include_str!("../../docs/least_privilege.sql"))
        .await
        .unwrap();
    owner
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN IN ROLE shardq_producer; \
             CREATE SCHEMA trap AUTHORIZATION {role}"
        ))
        .await
        .unwrap();
    let producer = common::connect(&url.replace("postgres@", &format!("{role}@"))).await;
    producer
        .batch_execute(
            "CREATE FUNCTION trap.texteq(text, text) RETURNS boolean LANGUAGE plpgsql \
                 AS $$BEGIN RAISE EXCEPTION 'trap = ran as %', current_user; END$$; \
             CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.texteq); \
             SET search_path = trap, pg_catalog, public",
        )
        .await
        .unwrap();
    producer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_search_path_runs_none_of_its_code_as_the_owner() {
    let shards = TestShards::databases(1).await;
    let set = shards.migrated(&shards.config("")).await;
    let producer = producer_with_traps(&shards).await;
    let trapped: bool = producer
        .query_one("SELECT 'a'::text = 'a'::text", &[])
        .await
        .map_or(true, |_| false);
    assert!(trapped, "the producer's own `=` is the trap in its session");

    // A new queue: the trigger probes the floors (a filter over the rows
    // there: the trap's `=` is no index's), then makes them.
    let db = set.get(0).client().await.unwrap();
    db.batch_execute("INSERT INTO shardq_ready_levels VALUES ('seeded', 0)")
        .await
        .unwrap();
    producer
        .batch_execute(
            "INSERT INTO public.workflow_status (shard_key, queue, handler) \
             VALUES (1, 'fresh', 'noop')",
        )
        .await
        .expect("the enqueue runs shardq's trigger, not the trap");
    // Its body resolves no name through a search_path (a fixed one):
    // this guards later changes of it.
    producer
        .batch_execute("SELECT public.shardq_ensure_floors(ARRAY['other'], ARRAY[3])")
        .await
        .expect("the floors' maker runs none of the producer's objects");

    let levels: Vec<(String, i32)> = db
        .query(
            "SELECT queue, priority FROM shardq_ready_levels ORDER BY queue",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        levels,
        vec![
            ("fresh".into(), 0),
            ("other".into(), 3),
            ("seeded".into(), 0)
        ]
    );
    let numbered: bool = db
        .query_one(
            "SELECT ready_seq IS NOT NULL FROM workflow_status WHERE queue = 'fresh'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(numbered, "the job was numbered for its claims");
}
