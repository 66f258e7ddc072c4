-- shardq:functions-with-this
-- The ready floors and the grouped rounds as rows that are only added and
-- deleted, never updated.
--
-- Each move of the floors (shardq_advance_ready_floors, up to 4 a second
-- while claims poll) rewrote every queue and priority's floor row whose
-- floor rose, idle ones too (their floor follows the sequence). While a
-- long transaction holds the horizon, none of those versions can be
-- removed, and a read of a row walks all of them: with 100 queues and
-- priorities, a move read every version of every floor, 135-157 ms after
-- 2,900 moves (12 minutes of polling claims) with a snapshot held, inside
-- the claim that made it, and growing (bench/experiments/floors_versions.py).
--
-- Now each move adds a row per floor that rose, numbered by the move
-- (move_seq: the number it takes from shardq_ready_seq), and deletes the
-- row it replaces, in the same statement. Each reader reads a floor's
-- newest row, first in a backward walk of the primary key; the rows it
-- replaced, deleted or not yet vacuumed, lie behind it. A floor without a
-- row is 0 (behind every number). Each grouped queue's rounds
-- (shardq_group_rounds, migration 0041: its round, floor and noted round,
-- moved by the same mover) were one row each rewritten the same way, idle
-- queues too: with 100 grouped queues a move took 427 ms after 1,460 moves
-- held. They get the same shape: shardq_group_round_moves, and the
-- never-updated shardq_group_queues for the queues.
--
-- shardq_ready_floors and shardq_group_rounds become views of the same
-- columns (and move_seq), so every read of them stays as it was. The roles
-- that could read the old tables may read the views, and those that could
-- update the floors (the worker's claim moved them) may add and delete the
-- new rows (the rounds' writers run with the owner's rights). The views
-- made here read the newest rows inline; the function files replace them
-- with views that read them through a function whose plan cannot read
-- every row (shardq_ready_floor_of, shardq_group_round_of say why).
--
-- The old functions that write the floors and rounds cannot run on the
-- views, so this run's functions commit with this migration (its first
-- line), not after a later migration of the run (run it under READ
-- COMMITTED, the default: the copies below read after the lock). The
-- movers' lock is taken
-- first: a mover of the old functions still running (it tries the lock
-- and goes on without moving) cannot commit a move between the copy and
-- the drop, which would be lost. The new tables and views get the old
-- tables' owner (the owner's functions run with its rights), and the
-- grants are copied: SELECT to the view; UPDATE of the floors (the worker's
-- claim moved them) to reading the view and adding and deleting rows.
SELECT pg_advisory_xact_lock(hashtext('shardq_ready_floors')::bigint);
-- The drops below wait at most this long for the tables' readers, and the
-- migration fails then (to be run again): behind a transaction that read
-- them and stays open (pg_dump holds every table it dumps), the waiting
-- drop would queue every claim of the shard behind it.
SET LOCAL lock_timeout = '2s';
CREATE TABLE shardq_ready_floor_moves (
    queue text NOT NULL,
    priority integer NOT NULL,
    move_seq bigint NOT NULL,
    floor_seq bigint NOT NULL,
    keyed_floor_seq bigint NOT NULL,
    PRIMARY KEY (queue, priority, move_seq)
);

INSERT INTO shardq_ready_levels (queue, priority)
SELECT queue, priority FROM shardq_ready_floors
ON CONFLICT DO NOTHING;

INSERT INTO shardq_ready_floor_moves (queue, priority, move_seq, floor_seq, keyed_floor_seq)
SELECT queue, priority, 0, floor_seq, keyed_floor_seq FROM shardq_ready_floors;

CREATE VIEW shardq_ready_floors_next AS
SELECT l.queue, l.priority,
       coalesce(m.floor_seq, 0) AS floor_seq,
       coalesce(m.keyed_floor_seq, 0) AS keyed_floor_seq,
       m.move_seq
FROM shardq_ready_levels l
LEFT JOIN LATERAL (
    SELECT f.floor_seq, f.keyed_floor_seq, f.move_seq
    FROM shardq_ready_floor_moves f
    WHERE f.queue = l.queue AND f.priority = l.priority
    ORDER BY f.move_seq DESC LIMIT 1) m ON true;

DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'shardq_ready_floors'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_ready_floor_moves OWNER TO %s', owner);
    EXECUTE format('ALTER VIEW shardq_ready_floors_next OWNER TO %s', owner);
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role,
                    a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'shardq_ready_floors'::regclass
               AND a.grantee <> c.relowner LOOP
        IF r.privilege_type = 'SELECT' THEN
            EXECUTE format('GRANT SELECT ON TABLE shardq_ready_floors_next TO %s', r.role);
        ELSIF r.privilege_type = 'UPDATE' THEN
            EXECUTE format('GRANT SELECT ON TABLE shardq_ready_floors_next TO %s', r.role);
            EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE shardq_ready_floor_moves TO %s',
                           r.role);
        END IF;
    END LOOP;
END $$;

DROP TABLE shardq_ready_floors;
ALTER VIEW shardq_ready_floors_next RENAME TO shardq_ready_floors;

CREATE TABLE shardq_group_queues (
    queue text PRIMARY KEY
);

CREATE TABLE shardq_group_round_moves (
    queue text NOT NULL,
    move_seq bigint NOT NULL,
    round bigint NOT NULL,
    floor_turn bigint NOT NULL,
    noted_round bigint,
    PRIMARY KEY (queue, move_seq)
);

INSERT INTO shardq_group_queues (queue) SELECT queue FROM shardq_group_rounds;

INSERT INTO shardq_group_round_moves (queue, move_seq, round, floor_turn, noted_round)
SELECT queue, 0, round, floor_turn, noted_round FROM shardq_group_rounds;

CREATE VIEW shardq_group_rounds_next AS
SELECT q.queue,
       coalesce(m.round, 0) AS round,
       coalesce(m.floor_turn, 0) AS floor_turn,
       m.noted_round,
       m.move_seq
FROM shardq_group_queues q
LEFT JOIN LATERAL (
    SELECT r.round, r.floor_turn, r.noted_round, r.move_seq
    FROM shardq_group_round_moves r
    WHERE r.queue = q.queue
    ORDER BY r.move_seq DESC LIMIT 1) m ON true;

DO $$
DECLARE
    owner text := (SELECT c.relowner::regrole::text FROM pg_class c
                   WHERE c.oid = 'shardq_group_rounds'::regclass);
    r record;
BEGIN
    EXECUTE format('ALTER TABLE shardq_group_queues OWNER TO %s', owner);
    EXECUTE format('ALTER TABLE shardq_group_round_moves OWNER TO %s', owner);
    EXECUTE format('ALTER VIEW shardq_group_rounds_next OWNER TO %s', owner);
    FOR r IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  ELSE a.grantee::regrole::text END AS role
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = 'shardq_group_rounds'::regclass
               AND a.grantee <> c.relowner AND a.privilege_type = 'SELECT' LOOP
        EXECUTE format('GRANT SELECT ON TABLE shardq_group_rounds_next TO %s', r.role);
    END LOOP;
END $$;

DROP TABLE shardq_group_rounds;
ALTER VIEW shardq_group_rounds_next RENAME TO shardq_group_rounds;
