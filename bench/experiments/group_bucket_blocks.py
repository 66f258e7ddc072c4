#!/usr/bin/env python3
"""Blocks of a group rate's buckets one grouped claim reads and writes
while a snapshot holds the shard's horizon, after N claims of one group.

Sets a group rate on queue 'tenants' high enough that every claim takes
from the bucket (and so writes it), enqueues jobs of one group 'g', takes
a REPEATABLE READ snapshot and holds it, then claims one job at a time;
at each checkpoint (after ANALYZE) it counts the buckets' heap and index
blocks one more claim fetched (pg_stat_get_xact_blocks_fetched). Counts,
not times: they do not depend on the machine's load.

Usage, on a fresh database `shardq migrate` set up (`shardq local up
--shards 1`):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=probe' \\
      python3 bench/experiments/group_bucket_blocks.py --at 1,500,2000,5000,10000

With `--before REV` it first applies REV's shardq_claim_grouped and makes
the bucket table it used (shardq_group_tokens, one row per group updated
in place, before migration 50): run it on another fresh database.
"""
import argparse, os, subprocess
from pathlib import Path
import psycopg

ROOT = Path(__file__).resolve().parents[2]
CLAIM = "SELECT id FROM shardq_claim(1, 0, 'tenants', 1, 'w', 600000) WHERE id IS NOT NULL"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--at", default="1,500,2000,5000,10000",
                   help="checkpoints: claims held before the counted one")
    p.add_argument("--before", metavar="REV",
                   help="apply REV's shardq_claim_grouped and its bucket table first")
    a = p.parse_args()
    at = [int(x) for x in a.at.split(",")]
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    conn = psycopg.connect(dsn, autocommit=True)
    if a.before:
        conn.execute("CREATE TABLE IF NOT EXISTS shardq_group_tokens (queue text NOT NULL, "
                     "job_group text NOT NULL, tokens double precision NOT NULL, "
                     "tokens_at timestamptz NOT NULL, PRIMARY KEY (queue, job_group))")
        conn.execute(subprocess.run(
            ["git", "show", f"{a.before}:migrations/functions/shardq_claim_grouped.sql"],
            cwd=ROOT, check=True, capture_output=True, text=True).stdout)
        table = "shardq_group_tokens"
    else:
        table = "shardq_group_buckets"
    conn.execute("""INSERT INTO shardq_queue_limits
        (queue, group_rate_count, group_rate_period_ms, revision)
        VALUES ('tenants', 100000000, 1000, 1)""")
    conn.execute("SELECT shardq_enqueue('tenants', 'noop', p_group => 'g') "
                 "FROM generate_series(1, %s)", (max(at) + len(at) + 10,))
    holder = psycopg.connect(dsn)
    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM workflow_status").fetchall()
    blocks = (f"SELECT sum(pg_stat_get_xact_blocks_fetched(r::regclass))::int8 "
              f"FROM unnest(array['{table}', '{table}_pkey']) r")
    print(f"{'before ' + a.before if a.before else 'after'}: {table}, hold=True")
    print("claims_held,blocks")
    done = 0
    for n in at:
        while done < n:
            assert len(conn.execute(CLAIM).fetchall()) == 1
            done += 1
        conn.execute("ANALYZE")
        with conn.transaction():
            first = conn.execute(blocks).fetchone()[0]
            assert len(conn.execute(CLAIM).fetchall()) == 1
            done += 1
            print(f"{n},{conn.execute(blocks).fetchone()[0] - first}", flush=True)
    holder.rollback()


if __name__ == "__main__":
    main()
