//! The library's integration tests, one binary (one link, one build folder
//! entry) with a module per area. Each test starts the PostgreSQL servers it
//! uses (see `shardq_harness::test_shards`).

/// What every test module shares, under the name the modules use.
mod common {
    pub use shardq_harness::child_test;
    pub use shardq_harness::pgbouncer;
    pub use shardq_harness::test_shards::*;
}

mod backlog;
mod bad_input;
mod browse_plans;
mod cancel;
mod check;
mod check_waits;
mod children;
mod completion_retry_race;
mod completion_stall;
mod config;
mod connections;
mod crash_recovery;
mod dead_worker;
mod deadlines;
mod debounce;
mod drain;
mod durable_sleep;
mod embedding;
mod enqueue_retry;
mod events;
mod examples;
mod executor_queues;
mod fencing;
mod frozen_shard;
mod fuzz;
mod gating;
mod heartbeat;
mod horizon_metrics;
mod horizon_recovery;
mod job_groups;
mod job_span;
mod lease_outage;
mod lifecycle;
mod limits_home_down;
mod lost_lease_steps;
mod lost_replies;
mod map_epochs;
mod messages;
mod metrics;
mod migrate;
mod ordering;
mod ordering_races;
mod pause;
mod pgbouncer_harness;
mod plans;
mod poison_outcomes;
mod pooler;
mod promotion_race;
mod public_api;
mod queue_limits;
mod ready_floors;
mod refused_outcomes;
mod replace_server;
mod reshard;
mod reshard_races;
mod schedule_clock;
mod schedule_config;
mod schedule_fleet;
mod schedule_missed;
mod schedule_outage;
mod schedule_race;
mod schedule_status;
mod security;
mod session_state;
mod shard_map;
mod shutdown;
mod sick_shard;
mod sick_shard_buffered;
mod silent_workers;
mod sizes;
mod slow_claims;
mod sql_enqueue;
mod status_summary;
mod step_log_reads;
mod store;
mod typed_jobs;
mod upkeep_locks;
mod wakeups;
