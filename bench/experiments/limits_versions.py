#!/usr/bin/env python3
"""What a queue's limits cost while a transaction holds a shard's xmin
horizon: the rows they update in place keep every version, and each read
of such a row walks the versions kept.

A rate-limited queue's claims take their starts from the limit row's
token bucket (shardq_take_starts updates that row, several times a second
at high rates); a concurrency-limited queue's processes each renew their
lease of permits every 500 ms (shardq_lease_permits upserts the holder's
row and sums every other holder's). This sets a queue 'lim' with both,
takes a REPEATABLE READ snapshot and holds it, then runs STEPS steps back
to back: one take of 50 starts and one renewal by each of HOLDERS
holders. At each checkpoint it times, as medians of 20, one take and one
renewal (a new snapshot each, as a worker's call).

Usage, on a shard `shardq migrate` set up (`shardq local up --shards 1`):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=shardq' \\
      python3 bench/experiments/limits_versions.py --holders 8 --steps 7200

At 8 processes, 7,200 steps are the renewals of an hour (2 a second each);
a take a step is what a queue limited to 2,000 starts a second asks in
about 3 minutes (about 40 takes a second at 50 a take). `--group` times
instead a grouped claim's read and write of one group's rate bucket
(shardq_group_tokens: one row per group, still updated in place). With
`--before REV` it first applies REV's take and renewal: the code before,
beside the code after on another database of the same server, one that
REV migrated (a schema before 48: since 48 the old writes are refused).
"""
import argparse, os, statistics, subprocess, time
from pathlib import Path
import psycopg

ROOT = Path(__file__).resolve().parents[2]

TAKE = "SELECT shardq_take_starts('lim', 50)"

# A grouped claim's read and write of one group's bucket (shardq_claim_grouped:
# each claim that takes from a group with a rate upserts its row).
GROUP_READ = ("SELECT b.tokens, b.tokens_at FROM shardq_group_tokens b "
              "WHERE b.queue = 'lim' AND b.job_group = 'g'")
GROUP_WRITE = ("INSERT INTO shardq_group_tokens AS b (queue, job_group, tokens, tokens_at) "
               "VALUES ('lim', 'g', 1, clock_timestamp()) ON CONFLICT (queue, job_group) "
               "DO UPDATE SET tokens = EXCLUDED.tokens, tokens_at = EXCLUDED.tokens_at "
               "RETURNING 1")


def renew(holder):
    return (f"SELECT * FROM shardq_lease_permits('h{holder}', ARRAY['lim'], "
            "ARRAY[10], 5000)")


def timed(conn, sql, n=20):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.execute(sql).fetchall()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--holders", type=int, default=8)
    p.add_argument("--steps", type=int, default=7200)
    p.add_argument("--every", type=int, default=720)
    p.add_argument("--no-hold", action="store_true", help="the same without the snapshot")
    p.add_argument("--group", action="store_true",
                   help="instead, a step is one grouped claim's write of one group's "
                        "rate bucket; times that write and the claim's read of it")
    p.add_argument("--before", metavar="REV",
                   help="first apply REV's shardq_take_starts and shardq_lease_permits "
                        "(before schema 48: the bucket in the limits row and each "
                        "lease in a row, updated by every take and renewal; on a "
                        "database REV migrated)")
    a = p.parse_args()
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    conn = psycopg.connect(dsn, autocommit=True)
    for name in ("shardq_take_starts", "shardq_lease_permits") if a.before else ():
        conn.execute(subprocess.run(
            ["git", "show", f"{a.before}:migrations/functions/{name}.sql"],
            cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    for (table,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname IN ("
            "'shardq_limit_leases', 'shardq_limit_lease_moves', 'shardq_limit_holders', "
            "'shardq_rate_buckets')").fetchall():
        conn.execute(f"DELETE FROM {table} WHERE queue = 'lim'")
    conn.execute("DELETE FROM shardq_queue_limits WHERE queue = 'lim'")
    # A rate high enough that every take is granted (and so writes).
    conn.execute("""INSERT INTO shardq_queue_limits
        (queue, concurrency, rate_count, rate_period_ms, revision)
        VALUES ('lim', 1000, 100000000, 1000, 1)""")
    holder = psycopg.connect(dsn)
    if not a.no_hold:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1").fetchall()
    (schema,) = conn.execute("SELECT max(version) FROM shardq_migrations").fetchone()
    shape = f", the take of {a.before}" if a.before else ""
    what = "one group's bucket" if a.group else f"holders={a.holders}"
    print(f"schema {schema}{shape}, {what}, hold={not a.no_hold}")
    if a.group:
        conn.execute("DELETE FROM shardq_group_tokens WHERE queue = 'lim'")
        print("steps,group_read_ms,group_write_ms")
        for step in range(a.steps + 1):
            if step % a.every == 0 or step == 20:
                print(f"{step},{timed(conn, GROUP_READ):.2f},{timed(conn, GROUP_WRITE):.2f}",
                      flush=True)
            conn.execute(GROUP_WRITE)
        holder.rollback()
        return
    print("steps,take_ms,renew_ms")
    for step in range(a.steps + 1):
        if step % a.every == 0 or step == 20:
            take = timed(conn, TAKE)
            ren = timed(conn, renew(0))
            print(f"{step},{take:.2f},{ren:.2f}", flush=True)
        conn.execute(TAKE)
        for h in range(a.holders):
            conn.execute(renew(h))
    holder.rollback()


if __name__ == "__main__":
    main()
