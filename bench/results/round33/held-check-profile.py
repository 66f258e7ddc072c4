"""Round 33: a statement profile of one `shardq check` and one `shardq status`
after N jobs ran under a held snapshot, with the lease floor past every
lease those jobs had (as a worker's recovery passes leave it). One shard
that `shardq migrate` set up, pg_stat_statements loaded; SHARDQ_CONFIG
names that one shard, and SHARDQ_EXPERIMENT_DSN its database. It empties
workflow_status. Round 28's script, with the floor written."""
import os, psycopg, time, sys, subprocess
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / 'bench/experiments'))
import storage_design as sd
dsn=os.environ['SHARDQ_EXPERIMENT_DSN']
shardq=str(ROOT / 'target/release/shardq')
a=psycopg.connect(dsn, autocommit=True)
a.execute("TRUNCATE workflow_status CASCADE"); a.execute("VACUUM ANALYZE workflow_status")
a.execute("DELETE FROM shardq_lease_floor_moves")
holder=psycopg.connect(dsn); holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ"); holder.execute("SELECT 1").fetchone()
N=int(sys.argv[1])
a.execute("INSERT INTO workflow_status (shard_key, queue, handler, payload) SELECT g %% 1024, 'q', 'noop', '{}' FROM generate_series(1, %s) g", (N,))
sd.drain(dsn,"current",1000)
# No job runs now, and every lease the drain gave (30 s) ends before this:
# a floor a recovery pass could write once they have all expired.
a.execute("INSERT INTO shardq_lease_floor_moves (move_seq, floor_at, pending_at, pending_xid) "
          "VALUES (1, now() + interval '31 s', now() + interval '31 s', pg_current_xact_id())")
a.execute("INSERT INTO workflow_status (shard_key, queue, handler, payload) SELECT g % 1024, 'q', 'noop', '{}' FROM generate_series(1, 1000) g")
a.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
a.execute("SELECT pg_stat_statements_reset()")
t=time.time()
r=subprocess.run([shardq,'check','--shard-timeout-ms','60000'],capture_output=True,text=True)
print("check took", round(time.time()-t,2), "s, exit", r.returncode, r.stdout[-300:])
t=time.time()
r=subprocess.run([shardq,'status'],capture_output=True,text=True)
print("status took", round(time.time()-t,2), "s")
for row in a.execute("""SELECT round(total_exec_time::numeric,1) ms, calls, rows, left(regexp_replace(query,'\\s+',' ','g'),110) FROM pg_stat_statements WHERE query NOT LIKE '%%pg_stat_statements%%' ORDER BY total_exec_time DESC LIMIT 14""").fetchall(): print(row)
holder.rollback()
a.execute("DELETE FROM shardq_lease_floor_moves")
