#!/usr/bin/env python3
"""What the ready floors' own row versions cost while a transaction holds a
shard's xmin horizon.

Every move of the ready floors (shardq_advance_ready_floors, at most every
250 ms while claims poll) writes the floor of each queue and priority
whose floor rises: an idle queue's every time (it follows the sequence).
Until schema 47 a floor was one row, updated: while the horizon is held
none of its versions can be removed, and every read of it walked them all.
Since 47 a move adds the floor's new row and deletes the one it replaces,
and reads meet the newest first.

This creates LEVELS queues (priority 0) with no job, takes a REPEATABLE
READ snapshot and holds it, then runs MOVES moves back to back (each in
its own transaction, the barrier's clock set back so each one moves, as
they would every 250 ms: 14,400 moves are an hour of polling claims). At
each checkpoint it times, as medians of 20: one move, one claim's read of
its own floor (the probe of shardq_lock_plain_ready) and the backlog
read's floors part (every floor, and its ready jobs). `--busy N` gives the
first N queues a ready job each, so their floors stay where they are;
`--grouped N` adds N idle grouped queues' rounds, which the same moves
write.

Usage, on a shard `shardq migrate` set up (`shardq local up --shards 1`;
it empties workflow_status and the floors):

  pip install 'psycopg[binary]'
  SHARDQ_EXPERIMENT_DSN='host=127.0.0.1 port=54330 user=postgres dbname=shardq' \
      python3 bench/experiments/floors_versions.py --levels 100 --moves 14400

With `--before REV` it first puts back, on that database, the floors and
the grouped rounds as schema 46 kept them (tables, a row per floor and per
grouped queue updated by each move) and REV's functions that write them:
the code before, beside the code after on another database of the same
server. With `--move-before REV` it puts back only REV's move of the floors
(before 3e4f0e3 it updated the barrier's one row in place, which runs on
the table as schema 48 left it, and deleted the replaced floors by a join).
"""
import argparse, os, statistics, subprocess, time
from pathlib import Path
import psycopg

ROOT = Path(__file__).resolve().parents[2]

# shardq's connections (src/shards.rs).
SESSION = ("-c plan_cache_mode=force_custom_plan -c enable_seqscan=off "
           "-c enable_hashjoin=off -c enable_mergejoin=off -c jit=off")

FLOOR_READ = ("SELECT floor_seq FROM shardq_ready_floors "
              "WHERE queue = 'q0' AND priority = 0")
BACKLOG_FLOORS = """SELECT count(*) FROM shardq_ready_floors f
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM workflow_status w
        WHERE w.status = 'queued' AND w.ordering_key IS NULL AND w.job_group IS NULL
          AND w.queue = f.queue AND w.priority = f.priority
          AND w.ready_seq >= f.floor_seq) k"""


def timed(conn, sql, n=20):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.execute(sql).fetchall()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def move(conn):
    conn.execute("UPDATE shardq_ready_barrier SET advanced_at = '-infinity'")
    t = time.perf_counter()
    conn.execute("SELECT shardq_advance_ready_floors()")
    return (time.perf_counter() - t) * 1000


def as_before(conn, rev):
    """The floors as schema 46 kept them, on this database: the table
    (from the view's values) and REV's functions that write it."""
    if conn.execute("SELECT 1 FROM pg_class WHERE relname = 'shardq_ready_floor_moves'").fetchone():
        conn.execute("""CREATE TABLE shardq_ready_floors_old AS
            SELECT queue, priority, floor_seq, keyed_floor_seq FROM shardq_ready_floors;
            DROP VIEW shardq_ready_floors; DROP TABLE shardq_ready_floor_moves;
            ALTER TABLE shardq_ready_floors_old RENAME TO shardq_ready_floors;
            ALTER TABLE shardq_ready_floors ADD PRIMARY KEY (queue, priority),
                ALTER floor_seq SET DEFAULT 0, ALTER keyed_floor_seq SET DEFAULT 0""")
    if conn.execute("SELECT 1 FROM pg_class WHERE relname = 'shardq_group_round_moves'").fetchone():
        conn.execute("""CREATE TABLE shardq_group_rounds_old AS
            SELECT queue, round, floor_turn, noted_round FROM shardq_group_rounds;
            DROP VIEW shardq_group_rounds;
            DROP TABLE shardq_group_round_moves, shardq_group_queues;
            ALTER TABLE shardq_group_rounds_old RENAME TO shardq_group_rounds;
            ALTER TABLE shardq_group_rounds ADD PRIMARY KEY (queue),
                ALTER round SET DEFAULT 0, ALTER floor_turn SET DEFAULT 0""")
    for name in ("shardq_advance_ready_floors", "shardq_ensure_floors",
                 "shardq_move_group_rounds", "shardq_group_floor"):
        apply_function(conn, rev, name)


def apply_function(conn, rev, name):
    """REV's text of the function `name`, applied on this database."""
    text = subprocess.run(["git", "show", f"{rev}:migrations/functions/{name}.sql"],
                          cwd=ROOT, check=True, capture_output=True, text=True).stdout
    conn.execute(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", type=int, default=100)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--grouped", type=int, default=0,
                    help="also this many grouped queues' rounds (shardq_group_rounds), idle")
    ap.add_argument("--moves", type=int, default=14400)
    ap.add_argument("--every", type=int, default=1440)
    ap.add_argument("--move-before", metavar="REV",
                    help="first put back REV's move of the floors (before 3e4f0e3: "
                         "the barrier's one row updated in place, the replaced "
                         "floors deleted by a join)")
    ap.add_argument("--before", metavar="REV",
                    help="first put back the floors' table and functions of REV "
                         "(schema 46: a row per floor, updated by each move)")
    args = ap.parse_args()
    dsn = os.environ["SHARDQ_EXPERIMENT_DSN"]
    conn = psycopg.connect(dsn, autocommit=True, options=SESSION)
    tables = [t for (t,) in conn.execute(
        "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname IN "
        "('shardq_ready_floors', 'shardq_ready_floor_moves')")]
    conn.execute(f"TRUNCATE workflow_status, shardq_ready_levels, {', '.join(tables)} CASCADE")
    if args.before:
        as_before(conn, args.before)
    if args.move_before:
        apply_function(conn, args.move_before, "shardq_advance_ready_floors")
    queues = [f"q{i}" for i in range(args.levels)]
    conn.execute("SELECT shardq_ensure_floors(%s, %s)", (queues, [0] * args.levels))
    if args.before:
        conn.execute("TRUNCATE shardq_group_rounds")
    grouped = [f"g{i}" for i in range(args.grouped)]
    if args.before:
        conn.execute("INSERT INTO shardq_group_rounds (queue) SELECT unnest(%s::text[])",
                     (grouped,))
    else:
        conn.execute("TRUNCATE shardq_group_round_moves, shardq_group_queues")
        conn.execute("INSERT INTO shardq_group_queues (queue) SELECT unnest(%s::text[])",
                     (grouped,))
    for q in queues[:args.busy]:
        conn.execute("INSERT INTO workflow_status (shard_key, queue, handler, payload) "
                     "VALUES (1, %s, 'noop', '{}')", (q,))
    held = psycopg.connect(dsn)
    held.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    held.execute("SELECT count(*) FROM shardq_ready_floors").fetchone()
    (schema,) = conn.execute("SELECT max(version) FROM shardq_migrations").fetchone()
    shape = f" with the floors of {args.before}" if args.before else ""
    if args.move_before:
        shape += f" with the move of {args.move_before}"
    print(f"schema {schema}{shape}, levels {args.levels}, busy {args.busy}, "
          f"grouped {args.grouped}, snapshot held")
    print("moves | floor versions | move ms | own floor read ms | backlog floors ms")
    done = 0
    while True:
        ms = statistics.median(move(conn) for _ in range(20))
        done += 20
        (versions,) = conn.execute(
            "SELECT sum(n_tup_upd + n_tup_ins) FROM pg_stat_user_tables "
            "WHERE relname IN ('shardq_ready_floors', 'shardq_ready_floor_moves')").fetchone()
        print(f"{done} | {versions} | {ms:.2f} | {timed(conn, FLOOR_READ):.3f} | "
              f"{timed(conn, BACKLOG_FLOORS):.2f}", flush=True)
        if done >= args.moves:
            break
        for _ in range(args.every - 20):
            move(conn)
        done += args.every - 20
    held.rollback()


if __name__ == "__main__":
    main()
