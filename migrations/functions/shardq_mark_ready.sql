-- shardq_mark_ready: numbers a job without a group (plain or keyed) each
-- time it becomes ready (`ready_seq`, migrations 0027 and 0037) and makes
-- sure its queue and priority have ready floors (shardq_ensure_floors,
-- when shardq_ready_levels lacks them: its rows are never updated, so the
-- probe meets one row however long the horizon is held), as a trigger on every write that makes one ready (insert,
-- promotion, recovery, release, retry, a move's release, a dashboard
-- retry), so no writer can forget it: a ready job without a number, or
-- with one below its floor, would never be claimed.
--
-- It takes the transaction's id before the number: a floor passes a
-- number only once every transaction that could still write it has ended
-- (shardq_advance_ready_floors says why that needs this order).
--
-- It keeps one plan per connection (force_generic_plan): shardq's
-- connections plan every statement for its values, which for this
-- trigger's one probe, run for every job enqueued, was half the insert's
-- cost.
--
-- SECURITY DEFINER: a role that may write jobs needs no right on the
-- sequence or the floors (docs/least_privilege.sql). Every name in it,
-- operators included, is schema-qualified (resolved now, from
-- workflow_status, which is why it is created by a DO block), so a
-- caller's search_path cannot redirect it to code of its own, run with
-- the owner's rights.
DO $$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = 'workflow_status'::regclass);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION shardq_mark_ready() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET plan_cache_mode = force_generic_plan
        AS $b$
        BEGIN
            PERFORM pg_catalog.pg_current_xact_id();
            NEW.ready_seq := pg_catalog.nextval('%1$s.shardq_ready_seq');
            IF NOT EXISTS (SELECT 1 FROM %1$s.shardq_ready_levels l
                           WHERE l.queue OPERATOR(pg_catalog.=) NEW.queue
                             AND l.priority OPERATOR(pg_catalog.=) NEW.priority) THEN
                PERFORM %1$s.shardq_ensure_floors(ARRAY[NEW.queue], ARRAY[NEW.priority]);
            END IF;
            RETURN NEW;
        END
        $b$
    $f$, s);
END $$;

CREATE OR REPLACE TRIGGER shardq_ready_on_insert BEFORE INSERT ON workflow_status
    FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.job_group IS NULL)
    EXECUTE FUNCTION shardq_mark_ready();

CREATE OR REPLACE TRIGGER shardq_ready_on_update
    BEFORE UPDATE OF status, queue, priority, ordering_key, job_group ON workflow_status
    FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.job_group IS NULL
          AND (OLD.status <> 'queued' OR OLD.queue <> NEW.queue OR OLD.priority <> NEW.priority
               OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
               OR OLD.job_group IS NOT NULL))
    EXECUTE FUNCTION shardq_mark_ready();

-- Jobs that became ready without a number before these triggers numbered
-- their kind (keyed jobs during an upgrade to schema 38, plain ones during
-- one to 29, rows a claim held while migration 38 numbered): numbered now,
-- with floors for their queues and priorities. The triggers' replacement
-- above holds a lock that keeps every writer of jobs out until this
-- transaction commits, so none becomes ready unnumbered in between. Usually
-- there are none: two probes of the ready indexes.
SELECT shardq_ensure_floors(array_agg(d.queue), array_agg(d.priority)) FROM (
    SELECT DISTINCT queue, priority FROM workflow_status
    WHERE status = 'queued' AND job_group IS NULL AND ready_seq IS NULL) d;

UPDATE workflow_status SET ready_seq = nextval('shardq_ready_seq')
WHERE status = 'queued' AND job_group IS NULL AND ready_seq IS NULL;
