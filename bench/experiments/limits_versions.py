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
about 3 minutes (about 40 takes a second at 50 a take). With
`--before REV` it first applies REV's take and renewal: the code before,
beside the code after on another database of the same server, one that
REV migrated (a schema before 48: since 48 the old writes are refused).

`--group` instead sets a group rate on queue 'lim' (high enough that every
claim takes from the bucket, and so writes it), enqueues jobs of one group
'g', and makes each step one grouped claim of one job; at each checkpoint
it times the claim's read of the group's bucket and the whole claim.
There `--before REV` applies REV's shardq_claim_grouped and
shardq_group_heads and, where that claim used it, makes the bucket table
it used (shardq_group_tokens, one row per group updated in place, before
migration 50) on the same database: the rest of the claim is the same
code before and after.
"""
import argparse, os, statistics, subprocess, time
from pathlib import Path
import psycopg

ROOT = Path(__file__).resolve().parents[2]

TAKE = "SELECT shardq_take_starts('lim', 50)"

# A grouped claim of one job, and its read of one group's bucket: before
# migration 50 one row per group, upserted by each claim that takes from it;
# since, the group's newest row.
GROUP_CLAIM = "SELECT id FROM shardq_claim(1, 0, 'lim', 1, 'w', 600000)"
GROUP_READ_BEFORE = ("SELECT b.tokens, b.tokens_at FROM shardq_group_tokens b "
                     "WHERE b.queue = 'lim' AND b.job_group = 'g'")
GROUP_READ = "SELECT * FROM shardq_group_buckets_of('lim', ARRAY['g'])"


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
                   help="instead, a step is one grouped claim of one job of a group "
                        "with a rate; times the claim and its read of the bucket")
    p.add_argument("--before", metavar="REV",
                   help="first apply REV's shardq_take_starts and shardq_lease_permits "
                        "(before schema 48: the bucket in the limits row and each "
                        "lease in a row, updated by every take and renewal; on a "
                        "database REV migrated)")
    a = p.parse_args()
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    conn = psycopg.connect(dsn, autocommit=True)
    olds = ("shardq_group_heads", "shardq_claim_grouped") if a.group else (
        "shardq_take_starts", "shardq_lease_permits")
    old_texts = [subprocess.run(
        ["git", "show", f"{a.before}:migrations/functions/{name}.sql"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
        for name in (olds if a.before else ())]
    old_buckets = any("shardq_group_tokens" in text for text in old_texts)
    if old_buckets:
        conn.execute("CREATE TABLE IF NOT EXISTS shardq_group_tokens (queue text NOT NULL, "
                     "job_group text NOT NULL, tokens double precision NOT NULL, "
                     "tokens_at timestamptz NOT NULL, PRIMARY KEY (queue, job_group))")
    for text in old_texts:
        conn.execute(text)
    for (table,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname IN ("
            "'shardq_limit_leases', 'shardq_limit_lease_moves', 'shardq_limit_holders', "
            "'shardq_rate_buckets')").fetchall():
        conn.execute(f"DELETE FROM {table} WHERE queue = 'lim'")
    conn.execute("DELETE FROM shardq_queue_limits WHERE queue = 'lim'")
    if a.group:
        for (table,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname IN ("
                "'shardq_group_tokens', 'shardq_group_buckets')").fetchall():
            conn.execute(f"DELETE FROM {table} WHERE queue = 'lim'")
        conn.execute("DELETE FROM workflow_status WHERE queue = 'lim'")
        # A group rate high enough that every claim takes (and so writes).
        conn.execute("""INSERT INTO shardq_queue_limits
            (queue, group_rate_count, group_rate_period_ms, revision)
            VALUES ('lim', 100000000, 1000, 1)""")
        jobs = a.steps + 40 * (a.steps // a.every + 2)
        conn.execute("SELECT shardq_enqueue('lim', 'noop', p_group => 'g') "
                     "FROM generate_series(1, %s)", (jobs,))
    else:
        # A rate high enough that every take is granted (and so writes).
        conn.execute("""INSERT INTO shardq_queue_limits
            (queue, concurrency, rate_count, rate_period_ms, revision)
            VALUES ('lim', 1000, 100000000, 1000, 1)""")
    holder = psycopg.connect(dsn)
    if not a.no_hold:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1").fetchall()
    (schema,) = conn.execute("SELECT max(version) FROM shardq_migrations").fetchone()
    shape = f", the {'claim' if a.group else 'take'} of {a.before}" if a.before else ""
    what = "one group's bucket" if a.group else f"holders={a.holders}"
    print(f"schema {schema}{shape}, {what}, hold={not a.no_hold}")
    if a.group:
        read = GROUP_READ_BEFORE if old_buckets else GROUP_READ
        print("steps,bucket_read_ms,claim_ms")
        for step in range(a.steps + 1):
            if step % a.every == 0 or step == 20:
                print(f"{step},{timed(conn, read):.2f},{timed(conn, GROUP_CLAIM):.2f}",
                      flush=True)
            conn.execute(GROUP_CLAIM)
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
