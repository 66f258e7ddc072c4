#!/usr/bin/env python3
"""How long the metrics exporter's scrape takes while a transaction holds a
shard's xmin horizon, against the same work without the hold.

Runs jobs through shardq's own claim and completion (storage_design.py's
drain: 1,000 a statement, one backend), in steps, then enqueues 1,000 ready
jobs and scrapes a `shardq metrics` process it starts (default deadline
per shard: 2 s), twice. First without a held snapshot, then with a
REPEATABLE READ snapshot taken before the first step and held to the end.
Prints per scrape: its wall time, the backlog read's time
(`shardq_shard_scrape_duration_seconds`), `shardq_shard_up`,
`shardq_invariant_check_up` and the ready jobs counted. With `--groups N`
the jobs are grouped (N groups), and after the scrapes it also times the
grouped ready count as the backlog read made it before schema 52 (from
the grouped index's start), alone. Before each scrape
it waits until no other statement runs on the server. Usage, on one shard
`shardq migrate` set up (`shardq local up --shards 1` and a shards.toml of
that one shard; `cargo build --release -p shardq-cli` first; it empties
workflow_status):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=shardq' \
  SHARDQ_CONFIG=one-shard.toml \
      python3 bench/experiments/held_scrape.py --steps 200000,800000,1000000
"""
import argparse, os, re, subprocess, sys, time, urllib.request
from pathlib import Path
import psycopg
import storage_design

ROOT = Path(__file__).resolve().parents[2]


def enqueue(admin, n, groups=0, keys=0):
    """`n` ready no-op jobs of queue `q`; in `groups` groups, or of `keys`
    ordering keys (each key's first job ready, the others waiting behind
    it, as the claims would park them), when above 0."""
    admin.execute("INSERT INTO workflow_status (shard_key, queue, handler, payload, job_group, "
                  "ordering_key, status) "
                  "SELECT g %% 1024, 'q', 'noop', '{}', "
                  "CASE WHEN %(groups)s > 0 THEN 'g' || (g %% greatest(%(groups)s, 1)) END, "
                  "CASE WHEN %(keys)s > 0 THEN 'k' || (g %% greatest(%(keys)s, 1)) END, "
                  "CASE WHEN %(keys)s > 0 AND g > %(keys)s THEN 'waiting' ELSE 'queued' END "
                  "FROM generate_series(1, %(n)s) g", dict(groups=groups, keys=keys, n=n))


# The grouped ready count of the backlog read before schema 52: from the
# start of the grouped index, however many jobs were claimed since a hold.
COUNT_GROUPED_FROM_START = """SELECT queue, priority, count(*), min(id) FROM workflow_status
    WHERE status = 'queued' AND job_group IS NOT NULL GROUP BY queue, priority"""
# The backlog's count of waiting jobs (the full read's; its bounded read
# leaves it out).
COUNT_WAITING = """SELECT queue, count(*) FROM workflow_status WHERE status = 'waiting'
    AND ordering_key IS NOT NULL AND hashtext(ordering_key) IS NOT NULL GROUP BY queue"""


def time_alone(admin, what, statement):
    """Prints the milliseconds of `statement`, alone (60 s at most)."""
    started = time.time()
    with admin.transaction():
        admin.execute("SET LOCAL statement_timeout = '60s'")
        admin.execute(statement).fetchall()
    ms = (time.time() - started) * 1000
    print(f"{'':<34} {what} alone {ms:>6.0f} ms", flush=True)


def time_grouped_from_start(admin):
    time_alone(admin, "the grouped count from the index's start", COUNT_GROUPED_FROM_START)


def gauge(body, name, extra=""):
    return re.findall(r"^%s\{[^}]*%s[^}]*\} (\S+)$" % (name, extra), body, re.M)


def settle(admin):
    """Waits (at most 60 s) until no other statement runs: a check the
    exporter gave up on at its deadline still runs on the server, and would
    share the two cores with the next scrape."""
    for _ in range(600):
        (busy,) = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchone()
        if busy == 0:
            return
        time.sleep(0.1)


def scrape(url, label):
    started = time.time()
    body = urllib.request.urlopen(url, timeout=60).read().decode()
    wall_ms = (time.time() - started) * 1000
    read_s = gauge(body, "shardq_shard_scrape_duration_seconds")
    ready = gauge(body, "shardq_queue_jobs", 'state="queued"')
    print(f"{label:<34} scrape {wall_ms:>6.0f} ms  backlog read "
          f"{1000 * float(read_s[0]) if read_s else float('nan'):>6.0f} ms  "
          f"shard_up {','.join(gauge(body, 'shardq_shard_up'))}  "
          f"check_up {','.join(gauge(body, 'shardq_invariant_check_up'))}  "
          f"bounded {','.join(gauge(body, 'shardq_shard_backlog_bounded')) or '-'}  "
          f"ready {','.join(ready) or '-'}",
          flush=True)


def phase(dsn, url, steps, held, groups):
    admin = psycopg.connect(dsn, autocommit=True)
    admin.execute("TRUNCATE workflow_status CASCADE")
    admin.execute("VACUUM ANALYZE workflow_status")
    holder = None
    if held:
        holder = psycopg.connect(dsn, autocommit=True)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1").fetchone()
    done = 0
    for step in steps:
        enqueue(admin, step, groups)
        ran, _, _ = storage_design.drain(dsn, "current", 1000)
        done += ran
        enqueue(admin, 1000, groups)
        label = f"{'held' if held else 'not held'}, {done:,} jobs run"
        settle(admin)
        scrape(url, label)
        settle(admin)
        scrape(url, label + " (again)")
        if groups:
            settle(admin)
            time_grouped_from_start(admin)
        admin.execute("DELETE FROM workflow_status WHERE status = 'queued'")
    if holder:
        holder.execute("ROLLBACK")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", default="200000,800000,1000000")
    p.add_argument("--listen", default="127.0.0.1:9477")
    p.add_argument("--shardq", default=str(ROOT / "target/release/shardq"))
    p.add_argument("--groups", type=int, default=0,
                   help="enqueue grouped jobs, in this many groups (0: no group)")
    args = p.parse_args()
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    steps = [int(s) for s in args.steps.split(",")]
    exporter = subprocess.Popen([args.shardq, "metrics", "--listen", args.listen],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        if exporter.poll() is not None:
            sys.exit(f"shardq metrics exited ({exporter.returncode}): is {args.listen} taken?")
        url = f"http://{args.listen}/metrics"
        for held in (False, True):
            phase(dsn, url, steps, held, args.groups)
    finally:
        exporter.terminate()


if __name__ == "__main__":
    sys.exit(main())
