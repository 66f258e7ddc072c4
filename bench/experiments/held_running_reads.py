#!/usr/bin/env python3
"""The exporter's scrape and `shardq check` while a transaction holds a
shard's xmin horizon, with the lease floor (migration 51) and without it,
side by side on the same rows.

Holds a REPEATABLE READ snapshot, then runs jobs through shardq's own
claim and completion (storage_design.py's drain: leases of 30 s) in
steps, with a `shardq worker` of an empty queue beside them, whose lease
recovery passes move the shard's lease floor. After each step it enqueues
1,000 ready jobs, waits until the floor has passed every lease the step
gave (30 s and the floor's margin), and then, alternating twice:

  floor:    scrapes a `shardq metrics` process (2 s per shard) and runs
            `shardq check`, as they run today;
  no floor: the same with the worker stopped (SIGSTOP) and the floor's
            rows deleted, so that every read of the running jobs walks
            the lease index from its start, as before migration 51; the
            rows are put back and the worker resumed after.

With `--before-shardq BINARY --before-rev REV` the alternate runs are
that binary's (built at REV: an exporter of its own, its `shardq
check`) instead, on the same rows with the floor kept, the worker
stopped and `shardq_functions` saying REV's function files for the
run (a binary refuses to judge a shard whose functions differ from its
own; the check reads no function).
`--check-ms` is `shardq check`'s deadline per shard (60,000 by default:
its full read; 5,000 is the command's own default). `--groups N` runs
grouped jobs (N groups) and also times, alone, the grouped ready count as
the backlog read made it before schema 52 (from the grouped index's
start); `--keys N` runs keyed jobs (N keys, the jobs behind each key's
first waiting) and also times the backlog's count of waiting jobs alone
(the full read's; the bounded one leaves it out); `--current-only` makes
no alternate runs.

Prints per run: the scrape's wall time, the backlog read's time
(`shardq_shard_scrape_duration_seconds`), `shardq_shard_up`,
`shardq_invariant_check_up`, and `shardq check`'s wall time. Before each
run it waits until no other statement runs on the server. Usage, on one
shard `shardq migrate` set up (`shardq local up --shards 1` and a
shards.toml of that one shard; `cargo build --release -p shardq-cli`
first; it empties workflow_status):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=shardq' \\
  SHARDQ_CONFIG=one-shard.toml \\
      python3 bench/experiments/held_running_reads.py --steps 1000000,2000000
"""
import argparse, datetime, hashlib, json, os, signal, subprocess, sys, time
from pathlib import Path
import psycopg
import held_scrape
import storage_design

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 30  # storage_design.CLAIM's lease


def wait_for_floor(admin, past, timeout_s=180):
    """Waits until the worker's passes put the floor past `past` (a
    database time)."""
    started = time.time()
    while time.time() - started < timeout_s:
        (passed,) = admin.execute("SELECT coalesce((SELECT floor_at FROM "
                                  "shardq_lease_floor_moves ORDER BY move_seq DESC "
                                  "LIMIT 1) >= %s, false)", (past,)).fetchone()
        if passed:
            return time.time() - started
        time.sleep(0.5)
    sys.exit(f"the lease floor did not pass {past} within {timeout_s} s: is the worker running?")


def function_hashes(rev):
    """Each function file's sha256 at `rev`: what that revision's binary
    expects `shardq_functions` to say."""
    hashes = {}
    for path in sorted((ROOT / "migrations/functions").glob("*.sql")):
        shown = subprocess.run(["git", "-C", str(ROOT), "show",
                                f"{rev}:migrations/functions/{path.name}"],
                               capture_output=True, check=True)
        hashes[path.stem] = hashlib.sha256(shown.stdout).hexdigest()
    return hashes


def as_of(admin, hashes):
    """Sets `shardq_functions` to `hashes`; returns what it said."""
    saved = dict(admin.execute("SELECT name, sha256 FROM shardq_functions").fetchall())
    with admin.cursor() as cur:
        cur.executemany("UPDATE shardq_functions SET sha256 = %s WHERE name = %s",
                        [(sha, name) for name, sha in hashes.items()])
    return saved


def check(shardq, check_ms):
    """`shardq check`'s wall time, exit code and whether its job-state
    read was bounded (`capped`)."""
    started = time.time()
    done = subprocess.run([shardq, "check", "--json", "--shard-timeout-ms", str(check_ms)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ms = (time.time() - started) * 1000
    try:
        shards = json.loads(done.stdout)["shards"]
        capped = [f["capped"] for s in shards for f in s.get("findings") or []
                  if f["invariant"] == "job_state"]
    except (ValueError, KeyError):
        capped = []
    return ms, done.returncode, capped


def run(admin, url, shardq, label, check_ms):
    held_scrape.settle(admin)
    held_scrape.scrape(url, label)
    held_scrape.settle(admin)
    ms, rc, capped = check(shardq, check_ms)
    print(f"{'':<34} shardq check {ms:>6.0f} ms (exit {rc}, job_state capped "
          f"{','.join(str(c).lower() for c in capped) or '-'})", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", default="1000000,2000000")
    p.add_argument("--listen", default="127.0.0.1:9478")
    p.add_argument("--shardq", default=str(ROOT / "target/release/shardq"))
    p.add_argument("--before-shardq", help="alternate with this binary instead of "
                   "deleting the floor's rows")
    p.add_argument("--before-rev", help="the revision --before-shardq was built at")
    p.add_argument("--before-listen", default="127.0.0.1:9479")
    p.add_argument("--check-ms", type=int, default=60000)
    p.add_argument("--groups", type=int, default=0,
                   help="run grouped jobs, in this many groups (0: no group)")
    p.add_argument("--keys", type=int, default=0,
                   help="run keyed jobs, of this many keys (0: no key)")
    p.add_argument("--current-only", action="store_true",
                   help="no alternate runs: this build's exporter and check only")
    args = p.parse_args()
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    steps = [int(s) for s in args.steps.split(",")]
    admin = psycopg.connect(dsn, autocommit=True)
    admin.execute("TRUNCATE workflow_status CASCADE")
    admin.execute("DELETE FROM shardq_lease_floor_moves")
    admin.execute("VACUUM ANALYZE workflow_status")
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    exporter = subprocess.Popen([args.shardq, "metrics", "--listen", args.listen], **quiet)
    worker = subprocess.Popen([args.shardq, "worker", "--queue", "held-running-reads-idle"],
                              **quiet)
    before = None
    if args.before_shardq:
        if not args.before_rev:
            sys.exit("--before-shardq needs --before-rev")
        before_hashes = function_hashes(args.before_rev)
        before = subprocess.Popen([args.before_shardq, "metrics", "--listen",
                                   args.before_listen], **quiet)
    holder = psycopg.connect(dsn, autocommit=True)
    try:
        time.sleep(2)
        for proc, name in ((exporter, "metrics"), (worker, "worker")):
            if proc.poll() is not None:
                sys.exit(f"shardq {name} exited ({proc.returncode})")
        url = f"http://{args.listen}/metrics"
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM workflow_status").fetchone()
        done = 0
        for step in steps:
            held_scrape.enqueue(admin, step, args.groups, args.keys)
            ran, _, _ = storage_design.drain(dsn, "current", 1000)
            done += ran
            (drained_at,) = admin.execute("SELECT now()").fetchone()
            held_scrape.enqueue(admin, 1000, args.groups, args.keys)
            waited = wait_for_floor(admin, drained_at + datetime.timedelta(seconds=LEASE_S))
            print(f"held, {done:,} jobs run; the floor passed their leases "
                  f"{waited:.0f} s later", flush=True)
            for round_ in (1, 2):
                run(admin, url, args.shardq, f"  floor, run {round_}", args.check_ms)
                if args.groups:
                    held_scrape.settle(admin)
                    held_scrape.time_grouped_from_start(admin)
                if args.keys:
                    held_scrape.settle(admin)
                    held_scrape.time_alone(admin, "the count of waiting jobs",
                                           held_scrape.COUNT_WAITING)
                if args.current_only:
                    continue
                if before is not None:
                    worker.send_signal(signal.SIGSTOP)
                    saved = as_of(admin, before_hashes)
                    try:
                        run(admin, f"http://{args.before_listen}/metrics",
                            args.before_shardq, f"  before, run {round_}", args.check_ms)
                    finally:
                        as_of(admin, saved)
                        worker.send_signal(signal.SIGCONT)
                    continue
                worker.send_signal(signal.SIGSTOP)
                try:
                    saved = admin.execute("SELECT move_seq, floor_at, pending_at, "
                                          "pending_xid, moved_at "
                                          "FROM shardq_lease_floor_moves").fetchall()
                    admin.execute("DELETE FROM shardq_lease_floor_moves")
                    run(admin, url, args.shardq, f"  no floor, run {round_}", args.check_ms)
                    with admin.cursor() as cur:
                        cur.executemany("INSERT INTO shardq_lease_floor_moves (move_seq, "
                                        "floor_at, pending_at, pending_xid, moved_at) "
                                        "VALUES (%s, %s, %s, %s, %s)", saved)
                finally:
                    worker.send_signal(signal.SIGCONT)
            admin.execute("DELETE FROM workflow_status WHERE status IN ('queued', 'waiting')")
        holder.execute("ROLLBACK")
    finally:
        for proc in (exporter, worker, before):
            if proc is None:
                continue
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
