//! Periodic jobs: the durable last tick of each schedule (`shardq_schedules`).

/// Records schedule $1 with last tick $2 unless it is recorded already.
/// Returns a row when it was new.
pub const SCHEDULE_REGISTER: &str = "INSERT INTO shardq_schedules (name, last_tick) \
    VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING name";

/// The last tick of schedule $1.
pub const SCHEDULE_LAST_TICK: &str =
    "SELECT last_tick, updated_at FROM shardq_schedules WHERE name = $1";

/// The last ticks of the schedules named in $1.
pub const SCHEDULE_LAST_TICKS: &str =
    "SELECT name, last_tick, updated_at FROM shardq_schedules WHERE name = ANY($1)";

/// The shard's clock, which judges when a tick is due (a worker's own clock
/// may be minutes off).
pub const SCHEDULE_CLOCK: &str = "SELECT now() AS now";

/// One tick of schedule $1 at $2, in one statement: moves `last_tick`
/// forward to $2 only if it is older and the tick is ripe by the database's
/// clock, and only then, when $9 is true, enqueues the tick's job (shard key
/// $3, queue $4, handler $5, payload $6, attempts $7, deduplication id $8).
///
/// Ripe: a tick to enqueue ($9) once it is not in the future; a tick to skip
/// as missed (not $9) once it is older than the grace $10 (milliseconds).
/// So a worker whose clock runs ahead can neither enqueue a tick early nor
/// move `last_tick` past ticks that have not happened yet; `ripe` false
/// means nothing was written and the tick is to be tried again later.
///
/// Two processes running the same tick serialise on the schedule's row: the
/// second one's UPDATE waits for the first to commit, then re-reads the row
/// (READ COMMITTED re-checks the WHERE on the new version), finds
/// `last_tick = $2` and changes nothing, so its INSERT selects no row. A
/// process killed before the commit leaves nothing: the row and the job
/// commit together or not at all. The deduplication conflict clause only
/// keeps a job of the same id that is still unfinished from failing the
/// statement; `last_tick` is what makes the tick exactly once.
///
/// Only on the shard that holds the schedule's shard key ($3) at its
/// current epoch, and not while that key's range is still `closed` on its
/// way in (`shardq reshard` copies the schedule's row then): elsewhere
/// `owned` is false and nothing is written, so a process with an old map
/// finds the schedule's shard again and no tick runs on two shards.
/// `shardq_owns_key` reads the map under its lock, after a new epoch's
/// writer (migrations/functions/shardq_owns_key.sql).
pub const SCHEDULE_TICK: &str = "WITH judged AS ( \
        SELECT $2 <= now() - CASE WHEN $9 THEN 0 ELSE $10 END * interval '1 millisecond' \
            AS ripe \
    ), owned AS MATERIALIZED ( \
        SELECT shardq_owns_key($3) AS yes \
    ), advanced AS ( \
        UPDATE shardq_schedules SET last_tick = $2, updated_at = now() \
        WHERE name = $1 AND last_tick < $2 AND (SELECT ripe FROM judged) \
          AND (SELECT yes FROM owned) \
        RETURNING name \
    ), job AS ( \
        INSERT INTO workflow_status \
            (shard_key, queue, handler, payload, status, run_at, max_attempts, dedup_id) \
        SELECT $3, $4, $5, $6, 'queued', now(), $7, $8 FROM advanced WHERE $9 \
        ON CONFLICT (queue, dedup_id) \
            WHERE dedup_id IS NOT NULL AND status IN ('scheduled', 'queued', 'running') \
        DO NOTHING \
        RETURNING id, pg_notify('shardq_ready', queue) AS woken \
    ) \
    SELECT (SELECT ripe FROM judged) AS ripe, EXISTS (SELECT 1 FROM advanced) AS advanced, \
        (SELECT id FROM job) AS job_id, (SELECT yes FROM owned) AS owned";

/// `shardq reshard`: the schedules ($1..$2 their shard keys' range) as rows
/// (name, last tick, updated at) to copy to the range's new shard.
pub const SCHEDULE_ROWS_OF_RANGE: &str = "SELECT name, last_tick, updated_at \
    FROM shardq_schedules WHERE shardq_shard_key(name) >= $1 AND shardq_shard_key(name) < $2";

/// `shardq reshard`, while the range is closed (no tick runs on the new
/// shard): writes the old shard's state of schedule $1 over any the new
/// shard registered meanwhile.
pub const SCHEDULE_ROW_COPY: &str = "INSERT INTO shardq_schedules (name, last_tick, updated_at) \
    VALUES ($1, $2, $3) ON CONFLICT (name) DO UPDATE \
    SET last_tick = EXCLUDED.last_tick, updated_at = EXCLUDED.updated_at";
