#!/usr/bin/env python3
"""How long the dashboard's count of dead, failed and cancelled jobs takes as
retention keeps more of them: the capped count (`sql::FAILED_COUNTS`, read
from src/store/sql/browse.rs, each queue and state counted up to 10,001)
against the count of every such job it replaced, side by side.

For each size it empties workflow_status, writes that many finished jobs
over `--queues` queues (half dead, half cancelled), vacuums, then runs the
two counts alternately, `--runs` times each, with shardq's session
settings. Prints the median and the ratio per size, and checks that the
capped counts are the full ones cut at the cap. Usage, on one shard
`shardq migrate` set up (`shardq local up --shards 1`; it empties
workflow_status):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=shardq' \
      python3 bench/experiments/failed_counts.py --sizes 1000000,10000000
"""
import argparse, os, re, statistics, time
from pathlib import Path
import psycopg

ROOT = Path(__file__).resolve().parents[2]

# shardq's connections (src/shards.rs).
SESSION = ("-c plan_cache_mode=force_custom_plan -c enable_seqscan=off "
           "-c enable_hashjoin=off -c enable_mergejoin=off -c jit=off")

# What the overview read before the cap.
EVERY = ("SELECT queue, status AS state, count(*) FROM workflow_status "
         "WHERE status IN ('dead', 'failed', 'cancelled') GROUP BY 1, 2 ORDER BY 1, 2")

# The client's cap (OverviewOptions::failed_count_cap) and one more.
LIMIT = 10_001


def rust_const(name):
    text = (ROOT / "src/store/sql/browse.rs").read_text()
    body = re.search(r'pub const %s: &str = "(.*?)";' % name, text, re.S).group(1)
    return re.sub(r"\\\n\s*", "", body).replace("$1::bigint", "%(limit)s::bigint")


def timed(conn, sql, params=None):
    t = time.perf_counter()
    rows = conn.execute(sql, params).fetchall()
    return (time.perf_counter() - t) * 1000, rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--queues", type=int, default=10)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    capped = rust_const("FAILED_COUNTS")
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    with psycopg.connect(dsn, autocommit=True, options=SESSION) as conn:
        print(f"{'jobs kept':>10} {'pairs':>6} {'every job ms':>13} {'capped ms':>10} {'ratio':>7}")
        for size in [int(s) for s in args.sizes.split(",")]:
            conn.execute("TRUNCATE workflow_status CASCADE")
            conn.execute(
                "INSERT INTO workflow_status (shard_key, queue, handler, status, attempts, finished_at) "
                "SELECT g %% 65536, 'q' || (g %% %(q)s), 'noop', "
                "CASE WHEN (g / %(q)s) %% 2 = 0 THEN 'dead' ELSE 'cancelled' END, 1, now() "
                "FROM generate_series(1, %(n)s) g", {"q": args.queues, "n": size})
            conn.execute("VACUUM ANALYZE workflow_status")
            every_ms, capped_ms = [], []
            for _ in range(args.runs):
                ms, full = timed(conn, EVERY)
                every_ms.append(ms)
                ms, cut = timed(conn, capped, {"limit": LIMIT})
                capped_ms.append(ms)
            assert cut == [(q, s, min(n, LIMIT)) for q, s, n in full], (cut, full)
            e, c = statistics.median(every_ms), statistics.median(capped_ms)
            print(f"{size:>10} {len(full):>6} {e:>13.1f} {c:>10.1f} {e / c:>6.1f}x")


if __name__ == "__main__":
    main()
