//! Writing outcomes: the completion, the server-side function
//! `shardq_complete_many` (migrations/functions/shardq_complete_many.sql,
//! whose comment states its rules).

// Why completions are written as they are: statistics taken while nothing
// was running (after a bulk enqueue, say) estimate `owner = $n` at one row.
// With the fence as a filter on `workflow_status`, the planner then walked
// the whole primary key (or every running row) once per job in the batch:
// 10 s for 2,000 completions, found by `shardq bench scale` (tests/plans.rs
// pins the plan). So the batch is a MATERIALIZED CTE that carries the owner
// as a column, and every fence condition is a join condition: nothing
// restricts the table scan, the only cheap plan left is a primary-key probe
// per batch row, and the fence is still checked on the row being updated.
// (`owner` is set only while a row is `running`, so the fence needs no
// status test, which would bring the running-rows index into play.)

/// Writes many outcomes in one call, fenced: a row changes only while it is
/// still running under this owner ($6) and this claim's fence ($3). $1 shard
/// keys, $2 ids, $4 asked statuses (`succeeded`, `failed`, `dead` or `released`), $5
/// outputs, $7 errors, $8 and $9 the shortest and longest retry backoff in
/// ms. Returns one row: written as succeeded, retrying, dead, cancelled,
/// released, and how many of those were written already (by an earlier try
/// of this same write); the rest were fenced out.
///
/// The statement is the function `shardq_complete_many`, whose file
/// (migrations/functions/shardq_complete_many.sql) states its rules: the
/// backoff, released and cancelled jobs, replies lost after commit. It
/// keeps one generic plan per connection: planning it took 5x longer than
/// running it for one job. tests/plans.rs checks that plan.
pub const JOB_COMPLETE_MANY: &str = "SELECT * FROM shardq_complete_many($1::int[], $2::bigint[], \
    $3::bigint[], $4::text[], $5::jsonb[], $6::text, $7::text[], $8::float8, $9::float8)";
