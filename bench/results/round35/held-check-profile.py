"""Round 35: a statement profile of one `shardq check` after N grouped
(or keyed) jobs ran under a held snapshot, with the lease floor past
every lease those jobs had. Round 33's script (held-check-profile.py
there), with the jobs of held_scrape.enqueue: `N GROUPS KEYS`. One shard
that `shardq migrate` set up, pg_stat_statements loaded; SHARDQ_CONFIG
names that one shard, and SHARDQ_EXPERIMENT_DSN its database. It empties
workflow_status."""
import os, psycopg, time, sys, subprocess
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / 'bench/experiments'))
import storage_design as sd
import held_scrape
dsn = os.environ['SHARDQ_EXPERIMENT_DSN']
shardq = str(ROOT / 'target/release/shardq')
n, groups, keys = (int(x) for x in sys.argv[1:4])
a = psycopg.connect(dsn, autocommit=True)
a.execute("TRUNCATE workflow_status CASCADE")
a.execute("VACUUM ANALYZE workflow_status")
a.execute("DELETE FROM shardq_lease_floor_moves")
holder = psycopg.connect(dsn)
holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
holder.execute("SELECT 1").fetchone()
held_scrape.enqueue(a, n, groups, keys)
sd.drain(dsn, "current", 1000)
a.execute("INSERT INTO shardq_lease_floor_moves (move_seq, floor_at, pending_at, pending_xid) "
          "VALUES (1, now() + interval '31 s', now() + interval '31 s', pg_current_xact_id())")
held_scrape.enqueue(a, 1000, groups, keys)
a.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
a.execute("SELECT pg_stat_statements_reset()")
t = time.time()
r = subprocess.run([shardq, 'check', '--shard-timeout-ms', '60000'], capture_output=True, text=True)
print("check took", round(time.time() - t, 2), "s, exit", r.returncode)
for row in a.execute("""SELECT round(total_exec_time::numeric,1) ms, calls, rows,
        left(regexp_replace(query,'\\s+',' ','g'),110) FROM pg_stat_statements
        WHERE query NOT LIKE '%%pg_stat_statements%%'
        ORDER BY total_exec_time DESC LIMIT 8""").fetchall():
    print(row)
holder.rollback()
a.execute("DELETE FROM shardq_lease_floor_moves")
