#!/usr/bin/env python3
"""What a narrow hot table would cost the database per job, measured beside
shardq's claim and completion and the minimal queue, in one run.

The design the horizon issue names: a ready job is a narrow row (queue,
priority, number, job id) that leaves on claim; the job's body stays in the
wide table, which the claim only reads; the lease is a narrow row of its own
(owner, fence, expiry) that the completion deletes while it writes the
outcome into the wide row once. Variants, each draining N jobs 1,000 at a
time on one backend:

  current      shardq_claim and shardq's completion (src/store/sql/jobs/complete.rs)
  minimal      the pipeline bench's minimal ceiling: a bare table, UPDATE …
               SKIP LOCKED RETURNING, DELETE (none of the guarantees)
  narrow       ready and lease rows as above; the wide table keeps a partial
               index of finished rows (retention), so the completion's
               update is not HOT
  narrow-hot   the same with the wide table's primary key as its only index
               (retention would walk ids), so the completion's update can be
               HOT
  active       one narrow row per unfinished job (ready or running, with the
               lease): the claim updates it (the minimal queue's update),
               the completion deletes it and writes the outcome into the
               wide row (primary key only, HOT)
  active-log   the same, and the completion also appends (id, queue, status,
               finished_at) to a narrow log indexed by finished_at: what
               keeps the reads of finished jobs by time (retention, the
               dashboard's completions) that the wide table's index served

It prints the server backend's CPU per job (from /proc: run it on the
server's machine), WAL bytes per job and jobs/s. Enqueue is not measured
(the tables are filled by one INSERT … SELECT each). Usage, on a database
`shardq migrate` set up (it empties workflow_status):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=shardq' \
      python3 bench/experiments/narrow_ready.py --rounds 3
"""
import argparse, os, time
import psycopg
from psycopg.types.json import Jsonb
import storage_design as current

WIDE = """CREATE TABLE nx_jobs (
    shard_key integer NOT NULL, id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL, handler text NOT NULL, ordering_key text,
    priority integer NOT NULL DEFAULT 0, status text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL DEFAULT '{}', output jsonb, error text,
    attempts integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz,
    finished_at timestamptz, run_at timestamptz NOT NULL DEFAULT now(),
    max_attempts integer NOT NULL DEFAULT 20, dedup_id text,
    PRIMARY KEY (id, shard_key)) WITH (fillfactor = %d)"""
FINISHED = ("CREATE INDEX nx_jobs_finished ON nx_jobs (finished_at) "
            "WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled')")
READY = """CREATE TABLE nx_ready (queue text NOT NULL, priority integer NOT NULL,
    seq bigint NOT NULL, shard_key integer NOT NULL, id bigint NOT NULL);
    CREATE INDEX nx_ready_order ON nx_ready (queue, priority, seq)"""
LEASES = """CREATE TABLE nx_leases (shard_key integer NOT NULL, id bigint NOT NULL,
    owner text NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (id, shard_key));
    CREATE INDEX nx_leases_expiry ON nx_leases (expires_at)"""

# The claim: take the first ready rows (they leave), read each job's body by
# its key, write its lease (the fence is the attempt number).
NARROW_CLAIM = """WITH taken AS (
    DELETE FROM nx_ready r WHERE r.ctid = ANY (ARRAY(
        SELECT ctid FROM nx_ready WHERE queue = 'q'
        ORDER BY priority, seq LIMIT %s FOR UPDATE SKIP LOCKED))
    RETURNING r.shard_key, r.id
), picked AS MATERIALIZED (
    SELECT j.shard_key, j.id, j.handler, j.payload, j.attempts + 1 AS fence
    FROM taken t JOIN nx_jobs j ON j.id = t.id AND j.shard_key = t.shard_key
), leased AS (
    INSERT INTO nx_leases (shard_key, id, owner, fence, expires_at)
    SELECT shard_key, id, 'w', fence, now() + interval '30 seconds' FROM picked
)
SELECT shard_key, id, handler, payload, fence FROM picked"""
# The completion: end the lease it holds (fenced: the lease row of this
# owner and fence, in `table`), write the outcome once. The owner is a
# column of the batch, as in shardq's completion: as a constant, statistics
# taken before any claim estimate it at one row and the planner walks every
# running row once per job.
def completion(table):
    return """WITH c AS MATERIALIZED (SELECT * FROM
        unnest(%(k)s::int[], %(i)s::bigint[], %(f)s::bigint[], %(o)s::jsonb[],
               array_fill('w'::text, ARRAY[cardinality(%(i)s::bigint[])]))
        AS c(shard_key, id, fence, output, owner)),
    ended AS (DELETE FROM """ + table + """ l USING c
        WHERE l.id = c.id AND l.shard_key = c.shard_key AND l.owner = c.owner
          AND l.fence = c.fence
        RETURNING l.shard_key, l.id, l.fence, c.output)
UPDATE nx_jobs j SET status = 'succeeded', output = e.output, attempts = e.fence,
    finished_at = now()
FROM ended e WHERE j.id = e.id AND j.shard_key = e.shard_key"""


NARROW_COMPLETE = completion("nx_leases")

ACTIVE = """CREATE TABLE nx_active (shard_key integer NOT NULL, id bigint NOT NULL,
    queue text NOT NULL, priority integer NOT NULL, seq bigint NOT NULL,
    owner text, fence bigint NOT NULL DEFAULT 0, expires_at timestamptz,
    PRIMARY KEY (id, shard_key)) WITH (fillfactor = 50);
    CREATE INDEX nx_active_ready ON nx_active (queue, priority, seq) WHERE owner IS NULL;
    CREATE INDEX nx_active_expiry ON nx_active (expires_at) WHERE owner IS NOT NULL"""
ACTIVE_CLAIM = """WITH leased AS (
    UPDATE nx_active a SET owner = 'w', fence = a.fence + 1,
        expires_at = now() + interval '30 seconds'
    WHERE a.ctid = ANY (ARRAY(
        SELECT ctid FROM nx_active WHERE queue = 'q' AND owner IS NULL
        ORDER BY priority, seq LIMIT %s FOR UPDATE SKIP LOCKED))
    RETURNING a.shard_key, a.id, a.fence
)
SELECT j.shard_key, j.id, j.handler, j.payload, l.fence
FROM leased l JOIN nx_jobs j ON j.id = l.id AND j.shard_key = l.shard_key"""
ACTIVE_COMPLETE = completion("nx_active")

FINISHED_LOG = """CREATE TABLE nx_finished (shard_key integer NOT NULL, id bigint NOT NULL,
    queue text NOT NULL, status text NOT NULL, finished_at timestamptz NOT NULL);
    CREATE INDEX nx_finished_at ON nx_finished (finished_at)"""
ACTIVE_LOG_COMPLETE = ACTIVE_COMPLETE.replace(
    "UPDATE nx_jobs j", """, written AS (UPDATE nx_jobs j""").replace(
    "FROM ended e WHERE j.id = e.id AND j.shard_key = e.shard_key",
    """FROM ended e WHERE j.id = e.id AND j.shard_key = e.shard_key
    RETURNING j.shard_key, j.id, j.queue, j.status, j.finished_at)
INSERT INTO nx_finished SELECT * FROM written""")

MINIMAL_CLAIM = """UPDATE bench_minimal m SET claimed = true
    FROM (SELECT id FROM bench_minimal WHERE NOT claimed
          ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) c
    WHERE m.id = c.id RETURNING m.id, m.payload"""
MINIMAL_COMPLETE = "DELETE FROM bench_minimal WHERE id = ANY(%(i)s)"

VARIANTS = ["current", "minimal", "narrow", "narrow-hot", "active", "active-log"]


def prepare(admin, variant, fillfactor, jobs):
    a = admin.execute
    a("DROP TABLE IF EXISTS nx_jobs, nx_ready, nx_leases, nx_active, nx_finished, bench_minimal")
    if variant == "current":
        current.prepare(admin, "current", fillfactor, jobs)
        return
    if variant == "minimal":
        a("CREATE TABLE bench_minimal (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
          "payload jsonb NOT NULL, claimed boolean NOT NULL DEFAULT false)")
        a("CREATE INDEX bench_minimal_ready ON bench_minimal (id) WHERE NOT claimed")
        a("INSERT INTO bench_minimal (payload) SELECT '{\"n\": 1}' FROM generate_series(1, %s)",
          (jobs,))
        a("VACUUM ANALYZE bench_minimal")
    else:
        a(WIDE % fillfactor)
        if variant == "narrow":
            a(FINISHED)
        a("INSERT INTO nx_jobs (shard_key, queue, handler, payload) "
          "SELECT g %% 1024, 'q', 'noop', '{\"n\": 1}' FROM generate_series(1, %s) g", (jobs,))
        if variant.startswith("active"):
            a(ACTIVE)
            if variant == "active-log":
                a(FINISHED_LOG)
            a("INSERT INTO nx_active (shard_key, id, queue, priority, seq) "
              "SELECT shard_key, id, queue, priority, id FROM nx_jobs")
            tables = ["nx_jobs", "nx_active"]
        else:
            a(READY)
            a(LEASES)
            a("INSERT INTO nx_ready SELECT queue, priority, id, shard_key, id FROM nx_jobs")
            tables = ["nx_jobs", "nx_ready", "nx_leases"]
        for table in tables:
            a(f"VACUUM ANALYZE {table}")
    a("CHECKPOINT")


def drain(dsn, variant, batch):
    if variant == "current":
        return current.drain(dsn, "current", batch)
    claim, complete = {
        "minimal": (MINIMAL_CLAIM, MINIMAL_COMPLETE),
        "narrow": (NARROW_CLAIM, NARROW_COMPLETE),
        "narrow-hot": (NARROW_CLAIM, NARROW_COMPLETE),
        "active": (ACTIVE_CLAIM, ACTIVE_COMPLETE),
        "active-log": (ACTIVE_CLAIM, ACTIVE_LOG_COMPLETE),
    }[variant]
    conn = psycopg.connect(dsn, autocommit=True)
    # As on shardq's connections: statistics taken before any claim would
    # otherwise hash every running row into each completion.
    conn.execute("SET enable_hashjoin = off")
    conn.execute("SET enable_mergejoin = off")
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    cpu0, t0, done = current.backend_cpu_s(pid), time.time(), 0
    while True:
        rows = conn.execute(claim % batch).fetchall()
        if not rows:
            break
        n = len(rows)
        if variant == "minimal":
            args = dict(i=[r[0] for r in rows])
        else:
            args = dict(k=[r[0] for r in rows], i=[r[1] for r in rows], f=[r[4] for r in rows],
                        o=[Jsonb({"ok": True})] * n)
        cur = conn.execute(complete, args)
        assert cur.rowcount == n, f"{variant}: completed {cur.rowcount} of {n}"
        done += n
    wall = time.time() - t0
    cpu = current.backend_cpu_s(pid) - cpu0
    conn.close()
    return done, cpu, wall


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fillfactor", type=int, default=40)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    admin = psycopg.connect(dsn, autocommit=True)
    version = admin.execute("SHOW server_version").fetchone()[0]
    print(f"narrow ready table experiment: PostgreSQL {version}, {args.jobs} jobs, "
          f"claim and complete {args.batch} at a time, one backend, fillfactor "
          f"{args.fillfactor}, {os.cpu_count()} cores")
    print(f"{'round':>5}  {'variant':<12} {'CPU µs/job':>10} {'WAL B/job':>9} {'jobs/s':>8}")
    for rnd in range(1, args.rounds + 1):
        for variant in args.variants.split(","):
            prepare(admin, variant, args.fillfactor, args.jobs)
            lsn0 = admin.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            try:
                done, cpu, wall = drain(dsn, variant, args.batch)
            finally:
                wal = admin.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn",
                                    (lsn0,)).fetchone()[0]
                if variant == "current":
                    current.restore(admin, "current")
            assert done == args.jobs, f"{variant}: drained {done} of {args.jobs}"
            print(f"{rnd:>5}  {variant:<12} {1e6 * cpu / done:>10.1f} "
                  f"{float(wal) / done:>9.0f} {done / wall:>8.0f}", flush=True)
    admin.execute("DROP TABLE IF EXISTS nx_jobs, nx_ready, nx_leases, nx_active, nx_finished, bench_minimal")


if __name__ == "__main__":
    main()
