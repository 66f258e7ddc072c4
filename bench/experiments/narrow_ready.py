#!/usr/bin/env python3
"""What a claim that leaves the wide job row alone would cost the database
per job, measured beside shardq's claim and completion and the minimal
queue, in one run.

The design the horizon issue names: a ready job is a narrow row that
leaves on claim; the job's body stays in the wide table, which the claim
only reads; the lease is a narrow row of its own that the completion
deletes, fenced, while it writes the outcome into the wide row once.
Variants, each draining N jobs 1,000 at a time on one backend, with the
session settings of shardq's own connections (src/shards.rs):

  current      shardq_claim and shardq_complete_many on workflow_status
  minimal      the pipeline bench's minimal ceiling: a bare table, UPDATE …
               SKIP LOCKED RETURNING, DELETE (none of the guarantees)
  narrow-full  ready rows (queue, priority, number, job id) and lease rows
               (owner, fence, expiry) in narrow tables; the wide table is
               workflow_status's columns with every index of
               workflow_status but those of ready and running jobs (which
               the narrow tables replace), so the completion's update
               evaluates their predicates and writes what they index
  narrow       the same with only the primary key and the index of
               finished rows on the wide table
  narrow-hot   the same with the primary key alone: no index names a
               column the completion writes, so its update can stay on its
               page (HOT); reads of finished jobs by time would need
               another way
  active       one narrow row per ready or running job (queue, priority,
               number, owner, fence, expiry): the claim updates it, the
               completion deletes it and writes the outcome into the wide
               row (primary key alone, HOT)
  active-log   the same, the completion also appending (id, queue, status,
               finished_at) to a narrow log indexed by finished_at

In the narrow variants the fence is the attempt number, read from the wide
row (no recovery runs here); a real design keeps a fence that grows with
every claim, as the active variants do.

It prints the server backend's CPU per job (from /proc: run it on the
server's machine; autovacuum and other processes are not counted), WAL
bytes per job and jobs/s. Enqueue is not measured (the tables are filled by
one INSERT … SELECT each). Usage, on a database `shardq migrate` set up
(it empties workflow_status, and drops and creates tables named nx_*):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=shardq' \
      python3 bench/experiments/narrow_ready.py --rounds 3
"""
import argparse, os, time
import psycopg
from psycopg.types.json import Jsonb
import storage_design

# shardq's connections (src/shards.rs): plans for each statement's values,
# no sequential scans, hash or merge joins, or JIT.
SESSION = ("-c plan_cache_mode=force_custom_plan -c enable_seqscan=off "
           "-c enable_hashjoin=off -c enable_mergejoin=off -c jit=off")
TABLES = "nx_jobs, nx_ready, nx_leases, nx_active, nx_finished, nx_minimal"

# The indexes of ready and running jobs: what the narrow tables replace.
MOVED = {"workflow_status_dequeue_plain", "workflow_status_dequeue_keyed",
         "workflow_status_ready_plain", "workflow_status_ready_keyed",
         "workflow_status_ready_grouped", "workflow_status_group_lines",
         "workflow_status_lease", "workflow_status_running_grouped"}
FINISHED = ("CREATE INDEX nx_jobs_finished ON nx_jobs (finished_at) "
            "WHERE status IN ('succeeded', 'failed', 'dead', 'cancelled')")
READY = """CREATE TABLE nx_ready (queue text NOT NULL, priority integer NOT NULL,
    seq bigint NOT NULL, shard_key integer NOT NULL, id bigint NOT NULL);
    CREATE INDEX nx_ready_order ON nx_ready (queue, priority, seq)"""
LEASES = """CREATE TABLE nx_leases (shard_key integer NOT NULL, id bigint NOT NULL,
    owner text NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (id, shard_key));
    CREATE INDEX nx_leases_expiry ON nx_leases (expires_at)"""
ACTIVE = """CREATE TABLE nx_active (shard_key integer NOT NULL, id bigint NOT NULL,
    queue text NOT NULL, priority integer NOT NULL, seq bigint NOT NULL,
    owner text, fence bigint NOT NULL DEFAULT 0, expires_at timestamptz,
    PRIMARY KEY (id, shard_key)) WITH (fillfactor = %d);
    CREATE INDEX nx_active_ready ON nx_active (queue, priority, seq) WHERE owner IS NULL;
    CREATE INDEX nx_active_expiry ON nx_active (expires_at) WHERE owner IS NOT NULL"""
FINISHED_LOG = """CREATE TABLE nx_finished (shard_key integer NOT NULL, id bigint NOT NULL,
    queue text NOT NULL, status text NOT NULL, finished_at timestamptz NOT NULL);
    CREATE INDEX nx_finished_at ON nx_finished (finished_at)"""

CURRENT_CLAIM = storage_design.CLAIM
CURRENT_COMPLETE = storage_design.complete_statement()

# The claim: take the first ready rows (they leave), read each job's body by
# its key, write its lease.
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


def completion(table):
    """End the lease the completion holds (fenced: the row of this owner and
    fence in `table`), write the outcome once. The owner is a column of the
    batch, as in shardq's completion: as a constant, statistics taken before
    any claim estimate it at one row and the planner walks every running
    row once per job."""
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
ACTIVE_COMPLETE = completion("nx_active")
ACTIVE_LOG_COMPLETE = ACTIVE_COMPLETE.replace(
    "UPDATE nx_jobs j", """, written AS (UPDATE nx_jobs j""").replace(
    "FROM ended e WHERE j.id = e.id AND j.shard_key = e.shard_key",
    """FROM ended e WHERE j.id = e.id AND j.shard_key = e.shard_key
    RETURNING j.shard_key, j.id, j.queue, j.status, j.finished_at)
INSERT INTO nx_finished SELECT * FROM written""")

MINIMAL_CLAIM = """UPDATE nx_minimal m SET claimed = true
    FROM (SELECT id FROM nx_minimal WHERE NOT claimed
          ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) c
    WHERE m.id = c.id RETURNING m.id, m.payload"""
MINIMAL_COMPLETE = "DELETE FROM nx_minimal WHERE id = ANY(%(i)s)"

# Per variant: claim, completion, and the columns of a claimed row that
# hold its shard key, id and fence (None: the minimal queue has none).
STATEMENTS = {
    "current": (CURRENT_CLAIM, CURRENT_COMPLETE, ("shard_key", "id", "fence")),
    "minimal": (MINIMAL_CLAIM, MINIMAL_COMPLETE, None),
    "narrow-full": (NARROW_CLAIM, NARROW_COMPLETE, ("shard_key", "id", "fence")),
    "narrow": (NARROW_CLAIM, NARROW_COMPLETE, ("shard_key", "id", "fence")),
    "narrow-hot": (NARROW_CLAIM, NARROW_COMPLETE, ("shard_key", "id", "fence")),
    "active": (ACTIVE_CLAIM, ACTIVE_COMPLETE, ("shard_key", "id", "fence")),
    "active-log": (ACTIVE_CLAIM, ACTIVE_LOG_COMPLETE, ("shard_key", "id", "fence")),
}
VARIANTS = list(STATEMENTS)


def wide_table(admin, variant, fillfactor):
    """The wide table: workflow_status's columns and storage options, and
    the indexes the variant keeps."""
    a = admin.execute
    (options,) = a("SELECT coalesce(array_to_string(reloptions, ', '), '') FROM pg_class "
                   "WHERE oid = 'workflow_status'::regclass").fetchone()
    options = ", ".join([o for o in options.split(", ") if o and not o.startswith("fillfactor")]
                        + [f"fillfactor={fillfactor}"])
    a("CREATE TABLE nx_jobs (LIKE workflow_status INCLUDING DEFAULTS INCLUDING IDENTITY "
      f"INCLUDING CONSTRAINTS) WITH ({options})")
    a("ALTER TABLE nx_jobs ADD PRIMARY KEY (id, shard_key)")
    if variant == "narrow-full":
        for name, definition in a("SELECT indexname, indexdef FROM pg_indexes "
                                  "WHERE tablename = 'workflow_status'").fetchall():
            if name in MOVED or name == "workflow_status_pkey":
                continue
            a(definition.replace(name, "nx_" + name, 1)
              .replace(" ON public.workflow_status ", " ON nx_jobs "))
    elif variant == "narrow":
        a(FINISHED)


def prepare(admin, variant, fillfactor, jobs):
    a = admin.execute
    a(f"DROP TABLE IF EXISTS {TABLES}")
    if variant == "current":
        storage_design.prepare(admin, "current", fillfactor, jobs)
        return
    if variant == "minimal":
        a("CREATE TABLE nx_minimal (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
          "payload jsonb NOT NULL, claimed boolean NOT NULL DEFAULT false)")
        a("CREATE INDEX nx_minimal_ready ON nx_minimal (id) WHERE NOT claimed")
        a("INSERT INTO nx_minimal (payload) SELECT '{\"n\": 1}' FROM generate_series(1, %s)",
          (jobs,))
        a("VACUUM ANALYZE nx_minimal")
    else:
        wide_table(admin, variant, fillfactor)
        a("INSERT INTO nx_jobs (shard_key, queue, handler, payload) "
          "SELECT g %% 1024, 'q', 'noop', '{\"n\": 1}' FROM generate_series(1, %s) g", (jobs,))
        if variant.startswith("active"):
            a(ACTIVE % fillfactor)
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
    claim, complete, keys = STATEMENTS[variant]
    conn = psycopg.connect(dsn, autocommit=True, options=SESSION)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    cpu0, t0, done = storage_design.backend_cpu_s(pid), time.time(), 0
    while True:
        cur = conn.execute(claim % batch)
        names = [d.name for d in cur.description]
        rows = cur.fetchall()
        if keys:
            k, i, f = (names.index(name) for name in keys)
            rows = [r for r in rows if r[i] is not None]  # shardq_claim's "none" row
        if not rows:
            break
        n = len(rows)
        if keys is None:
            cur = conn.execute(complete, dict(i=[r[0] for r in rows]))
            written = cur.rowcount
        else:
            cur = conn.execute(complete, dict(
                k=[r[k] for r in rows], i=[r[i] for r in rows], f=[r[f] for r in rows],
                o=[Jsonb({"ok": True})] * n, st=["succeeded"] * n, e=[None] * n))
            # shardq_complete_many returns one row, its first column the
            # jobs written as succeeded; the others their row count.
            written = cur.fetchone()[0] if variant == "current" else cur.rowcount
        assert written == n, f"{variant}: completed {written} of {n}"
        done += n
    wall = time.time() - t0
    cpu = storage_design.backend_cpu_s(pid) - cpu0
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
    (options,) = admin.execute("SELECT coalesce(array_to_string(reloptions, ', '), '') "
                               "FROM pg_class WHERE relname = 'workflow_status'").fetchone()
    print(f"narrow ready table experiment: PostgreSQL {version}, {args.jobs} jobs, "
          f"claim and complete {args.batch} at a time, one backend, fillfactor "
          f"{args.fillfactor}, {os.cpu_count()} cores")
    print(f"{'round':>5}  {'variant':<12} {'CPU µs/job':>10} {'WAL B/job':>9} {'jobs/s':>8}")
    try:
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
                        storage_design.restore(admin, "current")
                assert done == args.jobs, f"{variant}: drained {done} of {args.jobs}"
                print(f"{rnd:>5}  {variant:<12} {1e6 * cpu / done:>10.1f} "
                      f"{float(wal) / done:>9.0f} {done / wall:>8.0f}", flush=True)
    finally:
        admin.execute(f"DROP TABLE IF EXISTS {TABLES}")
        # The job table's storage options as the migrations left them.
        admin.execute("ALTER TABLE workflow_status RESET (fillfactor)")
        if options:
            admin.execute(f"ALTER TABLE workflow_status SET ({options})")


if __name__ == "__main__":
    main()
