"""Offers single-job enqueues at a fixed rate to one shard (as shardq's client
does: INSERT ... RETURNING pg_notify), then reads back when each job's claim
started, and prints where the pickup time went:
  created -> commit returned  the enqueue's own statement and commit (client side)
  commit returned -> claim    notification, woken producer, claim statement start
  created -> claim start      both (database clocks)
Usage: SHARDQ_EXPERIMENT_DSN=... python3 enqueue_at_rate.py JOBS RATE
The queue `default` on that database must be served by running workers."""
import os, sys, time
import psycopg

n, rate = int(sys.argv[1]), float(sys.argv[2])
conn = psycopg.connect(os.environ["SHARDQ_EXPERIMENT_DSN"], autocommit=True)
cur = conn.cursor()
t0 = time.time()
sent = []
for i in range(n):
    delay = t0 + i / rate - time.time()
    if delay > 0:
        time.sleep(delay)
    row = cur.execute(
        "INSERT INTO workflow_status (shard_key, queue, handler, payload, status) "
        "VALUES (%s, 'default', 'noop', '{}', 'queued') "
        "RETURNING id, created_at, pg_notify('shardq_ready', 'default')", (i % 65536,)).fetchone()
    sent.append((row[0], row[1].timestamp(), time.time()))
time.sleep(1)
started = {r[0]: (float(r[1]), r[2] and float(r[2])) for r in cur.execute(
    "SELECT id, extract(epoch FROM created_at), extract(epoch FROM started_at) FROM workflow_status")}
parts = {"created -> commit returned": [], "commit returned -> claim start": [], "created -> claim start": []}
for job, created, returned in sent:
    _, claim = started[job]
    if claim is None:
        continue
    parts["created -> commit returned"].append((returned - created) * 1000)
    parts["commit returned -> claim start"].append((claim - returned) * 1000)
    parts["created -> claim start"].append((claim - created) * 1000)
if not parts["created -> claim start"]:
    sys.exit("no job was claimed: is a worker serving queue `default` on this database?")
for name, values in parts.items():
    values.sort()
    at = lambda p: values[int(p * (len(values) - 1))]
    print(f"{name:32s} p50 {at(.5):6.2f}  p90 {at(.9):6.2f}  p99 {at(.99):6.2f} ms")
