"""The unkeyed claim statement alone, locked rows found again by primary key
(migration 0007) or by tuple id (migration 0011): CPU per job of one backend.
On a database `shardq migrate` set up (it empties workflow_status). Usage:
SHARDQ_EXPERIMENT_DSN=... python3 bench/experiments/claim_by_tid.py"""
import psycopg, time, os, sys
from pathlib import Path
dsn=os.environ["SHARDQ_EXPERIMENT_DSN"]
PK = """WITH picked AS MATERIALIZED (
    SELECT w.shard_key, w.id FROM workflow_status w
    WHERE w.queue = 'q' AND w.status = 'queued' AND w.ordering_key IS NULL
    ORDER BY w.priority, w.id LIMIT 1000 FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE workflow_status w SET status = 'running', owner = 'w',
        attempts = w.attempts + 1, fence = w.fence + 1, started_at = now(),
        lease_expires_at = now() + 30000 * interval '1 millisecond'
    FROM picked p WHERE w.shard_key = p.shard_key AND w.id = p.id
    RETURNING w.shard_key, w.id, w.handler, w.ordering_key, w.priority, w.payload, w.attempts, w.fence, w.queue, w.created_at
) SELECT * FROM claimed ORDER BY id"""
TID = PK.replace("SELECT w.shard_key, w.id FROM workflow_status w\n    WHERE", "SELECT w.ctid AS tid FROM workflow_status w\n    WHERE").replace("FROM picked p WHERE w.shard_key = p.shard_key AND w.id = p.id", "FROM picked p WHERE w.ctid = p.tid")
def cpu(pid):
    f=Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split(); return (int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK")
a=psycopg.connect(dsn, autocommit=True)
for rnd in range(2):
  for name, q in [("pk", PK), ("ctid", TID)]:
    a.execute("TRUNCATE workflow_status CASCADE")
    a.execute("INSERT INTO workflow_status (shard_key, queue, handler, payload) SELECT g % 1024, 'q', 'noop', '{\"n\": 1}' FROM generate_series(1, 100000) g")
    a.execute("VACUUM ANALYZE workflow_status"); a.execute("CHECKPOINT")
    c=psycopg.connect(dsn, autocommit=True)
    c.execute("SET enable_hashjoin=off; SET enable_mergejoin=off; SET enable_seqscan=off")
    if rnd==0 and name=="ctid":
        for r in c.execute("EXPLAIN "+q).fetchall(): print("   ", r[0])
    pid=c.execute("select pg_backend_pid()").fetchone()[0]
    c0=cpu(pid); t=time.time(); n=0
    while True:
        rows=c.execute(q).fetchall()
        if not rows: break
        n+=len(rows)
    print(f"round {rnd} {name:5} claimed {n} cpu {1e6*(cpu(pid)-c0)/n:.1f} us/job wall {1e6*(time.time()-t)/n:.1f} us/job")
    c.close()
