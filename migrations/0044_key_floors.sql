-- Key floors: per-key reads that stay fast while a long transaction holds
-- the xmin horizon.
--
-- A keyed claim asks of each key it meets whether a job of the key runs or
-- waits for a retry, and reads the key's queued and waiting jobs; a
-- completion asks whether the key is free and queues its next job. Each
-- reads `workflow_status_key` (queue, ordering_key, status, id) from the
-- key's first id, so while vacuum can remove nothing it walks the dead
-- version of every job the key ran since the horizon was held: at 10,000
-- keys and 5,000 jobs/s the walks grew until claims fell behind for good
-- (docs/benchmarks.md, "Keyed jobs").
--
-- A key's floor is an id below which the key has no unfinished job that
-- those reads must see: they start there. Completions move it up now and
-- then (shardq_promote_keys); a job that comes back below it lowers it
-- (shardq_key_floor_lower, a trigger; a claim meeting a late job as its
-- key's head). A missing row is floor 0, so deleting a row is always safe:
-- maintenance deletes the rows of keys quiet for an hour.
--
-- fillfactor 50: room on each page for the next version of its rows.
CREATE TABLE shardq_key_floors (
    queue text NOT NULL,
    ordering_key text NOT NULL,
    floor_id bigint NOT NULL,
    set_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, ordering_key)
) WITH (fillfactor = 50);

-- Least-privilege roles (docs/least_privilege.sql), where they exist: every
-- keyed claim and every release of a key reads and writes the floors, so
-- without these grants they would fail from this migration until the file
-- is run again.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE shardq_key_floors TO shardq_worker;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_producer') THEN
        GRANT SELECT, INSERT, UPDATE ON TABLE shardq_key_floors TO shardq_producer;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_dashboard') THEN
        GRANT SELECT, INSERT, UPDATE ON TABLE shardq_key_floors TO shardq_dashboard;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_dashboard_ro') THEN
        GRANT SELECT ON TABLE shardq_key_floors TO shardq_dashboard_ro;
    END IF;
END $$;
