#!/usr/bin/env python3
"""What other storage designs would cost the database per job, measured.

Drains N claimed jobs, 1,000 at a time, with shardq's real claim function and
one completion variant, on a database that `shardq migrate` set up, and
prints the server backend's CPU per job (from /proc, so run it on the
server's machine), WAL bytes per job and jobs/s:

  current            shardq's completion statement (src/store/sql/jobs/complete.rs)
  move               the completion moves the row into a history table
                     partitioned by finished_at (DELETE … RETURNING → INSERT)
  delete             the completion deletes the row (no history kept)
  delete-without-fk  the same without the steps table's foreign key
  without-lease-index, without-finished-index, without-both
                     shardq's completion, with the index of running rows by
                     lease expiry (a claim's second index entry), the index of
                     finished rows (a completion's), or both dropped: what
                     each index entry costs a job

Each variant runs under each --fillfactor of the job table, the rounds
alternating. Usage:

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=/tmp port=5432 user=postgres dbname=shardq' \
      python3 bench/experiments/storage_design.py --rounds 2 --fillfactor 70,40

It empties workflow_status: never point it at a database that matters.
"""
import argparse, os, re, time
from pathlib import Path
import psycopg
from psycopg.types.json import Jsonb

SQL_FILE = Path(__file__).resolve().parents[2] / "src/store/sql/jobs/complete.rs"


def rust_const(name):
    text = SQL_FILE.read_text()
    body = re.search(r'pub const %s: &str = "(.*?)";' % name, text, re.S).group(1)
    return re.sub(r"\\\n\s*", "", body)


CLAIM = "SELECT * FROM shardq_claim(0, 0, 'q', %s, 'w', 30000)"
PICKED = """WITH c AS MATERIALIZED (SELECT *, 'w'::text AS owner
    FROM unnest(%(k)s::int[], %(i)s::bigint[], %(f)s::bigint[], %(o)s::jsonb[])
    AS c(shard_key, id, fence, output))"""
FENCED = "w.shard_key = c.shard_key AND w.id = c.id AND w.owner = c.owner AND w.fence = c.fence"
DELETE = f"{PICKED} DELETE FROM workflow_status w USING c WHERE {FENCED}"
MOVE = f"""{PICKED}, d AS (DELETE FROM workflow_status w USING c WHERE {FENCED}
        RETURNING w.*, c.output AS new_output)
    INSERT INTO shardq_history (shard_key, id, queue, handler, ordering_key, priority, status,
        payload, output, attempts, created_at, started_at, finished_at, fence)
    SELECT shard_key, id, queue, handler, ordering_key, priority, 'succeeded', payload,
        new_output, attempts, created_at, started_at, now(), fence FROM d"""
FK = "workflow_steps_shard_key_workflow_id_fkey"
VARIANTS = ["current", "move", "delete", "delete-without-fk"]
INDEXES_DROPPED = {
    "without-lease-index": ["workflow_status_lease"],
    "without-finished-index": ["workflow_status_finished"],
    "without-both": ["workflow_status_lease", "workflow_status_finished"],
}
VARIANTS += list(INDEXES_DROPPED)
# Definitions of the indexes a variant dropped, to put them back.
DROPPED = []


def backend_cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prepare(admin, variant, fillfactor, jobs):
    a = admin.execute
    a("TRUNCATE workflow_status CASCADE")
    a("DROP TABLE IF EXISTS shardq_history")
    a(f"ALTER TABLE workflow_status SET (fillfactor = {fillfactor})")
    if variant == "move":
        a("CREATE TABLE shardq_history (LIKE workflow_status INCLUDING DEFAULTS) "
          "PARTITION BY RANGE (finished_at)")
        a("CREATE TABLE shardq_history_all PARTITION OF shardq_history "
          "FOR VALUES FROM ('2000-01-01') TO ('2100-01-01')")
        a("CREATE INDEX ON shardq_history (shard_key, id)")
    if variant == "delete-without-fk":
        a(f"ALTER TABLE workflow_steps DROP CONSTRAINT {FK}")
    for index in INDEXES_DROPPED.get(variant, []):
        DROPPED.append(a("SELECT pg_get_indexdef(%s::regclass)", (index,)).fetchone()[0])
        a(f"DROP INDEX {index}")
    a("INSERT INTO workflow_status (shard_key, queue, handler, payload) "
      "SELECT g %% 1024, 'q', 'noop', '{\"n\": 1}' FROM generate_series(1, %s) g", (jobs,))
    a("VACUUM ANALYZE workflow_status")
    a("CHECKPOINT")


def restore(admin, variant):
    if variant == "delete-without-fk":
        admin.execute(f"ALTER TABLE workflow_steps ADD CONSTRAINT {FK} FOREIGN KEY "
                      "(shard_key, workflow_id) REFERENCES workflow_status (shard_key, id) "
                      "ON DELETE CASCADE")
    admin.execute("DROP TABLE IF EXISTS shardq_history")
    while DROPPED:
        admin.execute(DROPPED.pop())


def complete_statement():
    """shardq's completion (JOB_COMPLETE_MANY) with psycopg's placeholders."""
    return (rust_const("JOB_COMPLETE_MANY")
            .replace("$1", "%(k)s").replace("$2", "%(i)s").replace("$3", "%(f)s")
            .replace("$4", "%(st)s").replace("$5", "%(o)s").replace("$6", "'w'")
            .replace("$7", "%(e)s").replace("$8", "100").replace("$9", "1000"))


def drain(dsn, variant, batch):
    complete = complete_statement()
    statement = {"current": complete, "move": MOVE, "delete": DELETE,
                 "delete-without-fk": DELETE}.get(variant, complete)
    conn = psycopg.connect(dsn, autocommit=True)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    cpu0, t0, done = backend_cpu_s(pid), time.time(), 0
    while True:
        cur = conn.execute(CLAIM % batch)
        names = [d.name for d in cur.description]
        k, i, f = names.index("shard_key"), names.index("id"), names.index("fence")
        rows = [r for r in cur.fetchall() if r[i] is not None]
        if not rows:
            break
        n = len(rows)
        cur = conn.execute(statement, dict(
            k=[r[k] for r in rows], i=[r[i] for r in rows], f=[r[f] for r in rows],
            o=[Jsonb({"ok": True})] * n, st=["succeeded"] * n, e=[None] * n))
        # shardq's completion returns one row (its first column: written as
        # succeeded); the others their row count. A job fenced out would
        # make the variant look cheaper.
        written = cur.fetchone()[0] if statement is complete else cur.rowcount
        assert written == n, f"{variant}: completed {written} of {n}"
        done += n
    wall = time.time() - t0
    cpu = backend_cpu_s(pid) - cpu0
    conn.close()
    return done, cpu, wall


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--fillfactor", default="70,40")
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    admin = psycopg.connect(dsn, autocommit=True)
    version = admin.execute("SHOW server_version").fetchone()[0]
    (options,) = admin.execute("SELECT coalesce(array_to_string(reloptions, ', '), '') "
                               "FROM pg_class WHERE relname = 'workflow_status'").fetchone()
    print(f"storage design experiment: PostgreSQL {version}, {args.jobs} jobs, "
          f"claim and complete {args.batch} at a time, one backend, {os.cpu_count()} cores")
    print(f"{'round':>5}  {'fillfactor':>10}  {'variant':<18} {'CPU µs/job':>10} "
          f"{'WAL B/job':>9} {'jobs/s':>8}")
    for rnd in range(1, args.rounds + 1):
        for ff in [int(x) for x in args.fillfactor.split(",")]:
            for variant in args.variants.split(","):
                prepare(admin, variant, ff, args.jobs)
                lsn0 = admin.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
                try:
                    done, cpu, wall = drain(dsn, variant, args.batch)
                finally:
                    wal = admin.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn",
                                        (lsn0,)).fetchone()[0]
                    restore(admin, variant)
                assert done == args.jobs, f"{variant}: drained {done} of {args.jobs}"
                print(f"{rnd:>5}  {ff:>10}  {variant:<18} {1e6 * cpu / done:>10.1f} "
                      f"{float(wal) / done:>9.0f} {done / wall:>8.0f}", flush=True)
    # The table's storage options as the migrations left them.
    admin.execute("ALTER TABLE workflow_status RESET (fillfactor)")
    if options:
        admin.execute(f"ALTER TABLE workflow_status SET ({options})")


if __name__ == "__main__":
    main()
