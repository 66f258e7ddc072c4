-- The schema of a shard migrated by this shardq, read from the catalog
-- (src/migrate/snapshot.rs). Generated; do not edit. A test fails when a
-- migration or a function file changes it; regenerate with:
--   SHARDQ_UPDATE_SCHEMA=1 cargo test -p shardq --lib migrate::upgrade_tests::a_fresh_shard

-- Applied migrations (shardq_migrations)
--      1 0001_init.sql
--      2 0002_key_order.sql
--      3 0003_lifecycle.sql
--      4 0004_key_exclusion.sql
--      5 0005_shard_map.sql
--      6 0006_queue_activity.sql
--      7 0007_pause.sql
--      8 0008_schedules.sql
--      9 0009_workers.sql
--     10 0010_fillfactor.sql
--     11 0011_claim_by_tid.sql
--     12 0012_claim_plans_once.sql
--     13 0013_primary_key_by_id.sql
--     14 0014_complete_plans_once.sql
--     15 0015_backoff_capped.sql
--     16 0016_retry_safe_writes.sql
--     17 0017_map_epochs.sql
--     18 0018_reshard_indexes.sql
--     19 0019_reshard.sql
--     20 0020_map_change_mark.sql
--     21 0021_queue_limits.sql
--     22 0022_job_groups.sql
--     23 0023_group_indexes.sql
--     24 0024_enqueue_group.sql
--     25 0025_failed_by_queue.sql
--     26 0026_worker_claim_time.sql
--     27 0027_ready_order.sql
--     28 0028_ready_order_index.sql
--     29 0029_ready_order_switch.sql
--     30 0030_claim_result.sql
--     31 0031_workflow_messages.sql
--     32 0032_workflow_events.sql
--     33 0033_child_workflows.sql
--     34 0034_debounce.sql
--     35 0035_parked_workflows.sql
--     36 0036_deadlines.sql
--     37 0037_keyed_ready_order.sql
--     38 0038_keyed_ready_index.sql
--     39 0039_relay_leases.sql
--     40 0040_cascades_owed.sql
--     41 0041_group_turns.sql
--     42 0042_group_turn_index.sql
--     43 0043_grouped_index_roles.sql
--     44 0044_key_floors.sql
--     45 0045_key_index_role.sql
--     46 0046_one_group_line_index.sql
--     47 0047_floors_and_rounds_as_moves.sql
--     48 0048_limits_as_moves.sql
--     49 0049_ready_barrier_as_moves.sql
--     50 0050_group_buckets_as_moves.sql
--     51 0051_lease_floor.sql
--     52 0052_group_rounds_readable.sql

TABLE shardq_cascades_owed
    shard_key integer NOT NULL
    id bigint NOT NULL
    generation bigint NOT NULL
    owed_since timestamp with time zone NOT NULL DEFAULT now()
    due_at timestamp with time zone NOT NULL
    CONSTRAINT shardq_cascades_owed_pkey PRIMARY KEY (shard_key, id)
    INDEX CREATE INDEX shardq_cascades_owed_due ON public.shardq_cascades_owed USING btree (due_at)
    INDEX CREATE INDEX shardq_cascades_owed_since ON public.shardq_cascades_owed USING btree (owed_since)
    INDEX CREATE UNIQUE INDEX shardq_cascades_owed_pkey ON public.shardq_cascades_owed USING btree (shard_key, id)

TABLE shardq_functions
    name text NOT NULL
    sha256 text NOT NULL
    applied_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_functions_pkey PRIMARY KEY (name)
    INDEX CREATE UNIQUE INDEX shardq_functions_pkey ON public.shardq_functions USING btree (name)
    GRANT PUBLIC SELECT

TABLE shardq_group_buckets
    queue text NOT NULL
    job_group text NOT NULL
    take_seq bigint NOT NULL
    tokens double precision NOT NULL
    tokens_at timestamp with time zone NOT NULL
    CONSTRAINT shardq_group_buckets_pkey PRIMARY KEY (queue, job_group, take_seq)
    INDEX CREATE UNIQUE INDEX shardq_group_buckets_pkey ON public.shardq_group_buckets USING btree (queue, job_group, take_seq)

TABLE shardq_group_queues
    queue text NOT NULL
    CONSTRAINT shardq_group_queues_pkey PRIMARY KEY (queue)
    INDEX CREATE UNIQUE INDEX shardq_group_queues_pkey ON public.shardq_group_queues USING btree (queue)

TABLE shardq_group_round_moves
    queue text NOT NULL
    move_seq bigint NOT NULL
    round bigint NOT NULL
    floor_turn bigint NOT NULL
    noted_round bigint
    CONSTRAINT shardq_group_round_moves_pkey PRIMARY KEY (queue, move_seq)
    INDEX CREATE UNIQUE INDEX shardq_group_round_moves_pkey ON public.shardq_group_round_moves USING btree (queue, move_seq)

TABLE shardq_key_floors WITH (fillfactor=50)
    queue text NOT NULL
    ordering_key text NOT NULL
    floor_id bigint NOT NULL
    set_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_key_floors_pkey PRIMARY KEY (queue, ordering_key)
    INDEX CREATE UNIQUE INDEX shardq_key_floors_pkey ON public.shardq_key_floors USING btree (queue, ordering_key)

TABLE shardq_lease_floor_moves
    move_seq bigint NOT NULL
    floor_at timestamp with time zone
    pending_at timestamp with time zone NOT NULL
    pending_xid xid8 NOT NULL
    moved_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_lease_floor_moves_pkey PRIMARY KEY (move_seq)
    INDEX CREATE UNIQUE INDEX shardq_lease_floor_moves_pkey ON public.shardq_lease_floor_moves USING btree (move_seq)

TABLE shardq_limit_holders
    queue text NOT NULL
    holder text NOT NULL
    CONSTRAINT shardq_limit_holders_pkey PRIMARY KEY (queue, holder)
    INDEX CREATE UNIQUE INDEX shardq_limit_holders_pkey ON public.shardq_limit_holders USING btree (queue, holder)

TABLE shardq_limit_lease_moves
    queue text NOT NULL
    holder text NOT NULL
    renewal_seq bigint NOT NULL
    permits integer NOT NULL
    expires_at timestamp with time zone NOT NULL
    CONSTRAINT shardq_limit_lease_moves_permits_check CHECK ((permits >= 0))
    CONSTRAINT shardq_limit_lease_moves_pkey PRIMARY KEY (queue, holder, renewal_seq)
    INDEX CREATE UNIQUE INDEX shardq_limit_lease_moves_pkey ON public.shardq_limit_lease_moves USING btree (queue, holder, renewal_seq)

TABLE shardq_map_epochs
    epoch integer NOT NULL
    shard_count integer NOT NULL
    recorded_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_map_epochs_epoch_check CHECK ((epoch >= 1))
    CONSTRAINT shardq_map_epochs_pkey PRIMARY KEY (epoch)
    CONSTRAINT shardq_map_epochs_shard_count_check CHECK ((shard_count >= 1))
    INDEX CREATE UNIQUE INDEX shardq_map_epochs_pkey ON public.shardq_map_epochs USING btree (epoch)
    GRANT PUBLIC SELECT

TABLE shardq_map_moves
    epoch integer NOT NULL
    first_key integer NOT NULL
    end_key integer NOT NULL
    from_index integer NOT NULL
    to_index integer NOT NULL
    state text NOT NULL
    ids_from bigint NOT NULL DEFAULT 0
    CONSTRAINT shardq_map_moves_check CHECK (((0 <= first_key) AND (first_key < end_key) AND (end_key <= 65536)))
    CONSTRAINT shardq_map_moves_epoch_fkey FOREIGN KEY (epoch) REFERENCES shardq_map_epochs(epoch)
    CONSTRAINT shardq_map_moves_from_index_check CHECK ((from_index >= 0))
    CONSTRAINT shardq_map_moves_pkey PRIMARY KEY (epoch, first_key)
    CONSTRAINT shardq_map_moves_state_check CHECK ((state = ANY (ARRAY['closed'::text, 'holding'::text, 'released'::text])))
    CONSTRAINT shardq_map_moves_to_index_check CHECK ((to_index >= 0))
    INDEX CREATE UNIQUE INDEX shardq_map_moves_pkey ON public.shardq_map_moves USING btree (epoch, first_key)
    GRANT PUBLIC SELECT

TABLE shardq_map_ranges
    epoch integer NOT NULL
    first_key integer NOT NULL
    end_key integer NOT NULL
    shard_index integer NOT NULL
    CONSTRAINT shardq_map_ranges_check CHECK (((0 <= first_key) AND (first_key < end_key) AND (end_key <= 65536)))
    CONSTRAINT shardq_map_ranges_epoch_fkey FOREIGN KEY (epoch) REFERENCES shardq_map_epochs(epoch)
    CONSTRAINT shardq_map_ranges_pkey PRIMARY KEY (epoch, first_key)
    CONSTRAINT shardq_map_ranges_shard_index_check CHECK ((shard_index >= 0))
    INDEX CREATE UNIQUE INDEX shardq_map_ranges_pkey ON public.shardq_map_ranges USING btree (epoch, first_key)
    GRANT PUBLIC SELECT

TABLE shardq_migrations
    version integer NOT NULL
    name text NOT NULL
    applied_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_migrations_pkey PRIMARY KEY (version)
    INDEX CREATE UNIQUE INDEX shardq_migrations_pkey ON public.shardq_migrations USING btree (version)

TABLE shardq_paused_queues
    queue text NOT NULL
    paused_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_paused_queues_pkey PRIMARY KEY (queue)
    INDEX CREATE UNIQUE INDEX shardq_paused_queues_pkey ON public.shardq_paused_queues USING btree (queue)

TABLE shardq_queue_limits
    queue text NOT NULL
    concurrency integer
    rate_count integer
    rate_period_ms integer
    revision bigint NOT NULL
    updated_at timestamp with time zone NOT NULL DEFAULT now()
    tokens double precision NOT NULL DEFAULT 0
    tokens_at timestamp with time zone NOT NULL DEFAULT clock_timestamp()
    group_concurrency integer
    group_rate_count integer
    group_rate_period_ms integer
    CONSTRAINT shardq_queue_limits_check CHECK (((rate_count IS NULL) = (rate_period_ms IS NULL)))
    CONSTRAINT shardq_queue_limits_concurrency_check CHECK ((concurrency > 0))
    CONSTRAINT shardq_queue_limits_group_check CHECK (((group_concurrency > 0) AND (group_rate_count > 0) AND (group_rate_period_ms > 0) AND ((group_rate_count IS NULL) = (group_rate_period_ms IS NULL))))
    CONSTRAINT shardq_queue_limits_pkey PRIMARY KEY (queue)
    CONSTRAINT shardq_queue_limits_rate_count_check CHECK ((rate_count > 0))
    CONSTRAINT shardq_queue_limits_rate_period_ms_check CHECK ((rate_period_ms > 0))
    INDEX CREATE UNIQUE INDEX shardq_queue_limits_pkey ON public.shardq_queue_limits USING btree (queue)
    TRIGGER CREATE TRIGGER shardq_refuse_old_bucket BEFORE UPDATE OF tokens, tokens_at ON public.shardq_queue_limits FOR EACH ROW EXECUTE FUNCTION shardq_refuse_old_limits_write()

TABLE shardq_rate_buckets
    queue text NOT NULL
    take_seq bigint NOT NULL
    tokens double precision NOT NULL
    tokens_at timestamp with time zone NOT NULL
    CONSTRAINT shardq_rate_buckets_pkey PRIMARY KEY (queue, take_seq)
    INDEX CREATE UNIQUE INDEX shardq_rate_buckets_pkey ON public.shardq_rate_buckets USING btree (queue, take_seq)

TABLE shardq_ready_barrier
    pending_seq bigint NOT NULL
    pending_xid xid8
    advanced_at timestamp with time zone NOT NULL DEFAULT '-infinity'::timestamp with time zone
    CONSTRAINT shardq_ready_barrier_pkey PRIMARY KEY (pending_seq)
    INDEX CREATE UNIQUE INDEX shardq_ready_barrier_pkey ON public.shardq_ready_barrier USING btree (pending_seq)

TABLE shardq_ready_floor_moves
    queue text NOT NULL
    priority integer NOT NULL
    move_seq bigint NOT NULL
    floor_seq bigint NOT NULL
    keyed_floor_seq bigint NOT NULL
    CONSTRAINT shardq_ready_floor_moves_pkey PRIMARY KEY (queue, priority, move_seq)
    INDEX CREATE UNIQUE INDEX shardq_ready_floor_moves_pkey ON public.shardq_ready_floor_moves USING btree (queue, priority, move_seq)

TABLE shardq_ready_levels
    queue text NOT NULL
    priority integer NOT NULL
    CONSTRAINT shardq_ready_levels_pkey PRIMARY KEY (queue, priority)
    INDEX CREATE UNIQUE INDEX shardq_ready_levels_pkey ON public.shardq_ready_levels USING btree (queue, priority)

TABLE shardq_relay_leases
    to_index integer NOT NULL
    holder text NOT NULL
    until timestamp with time zone NOT NULL
    CONSTRAINT shardq_relay_leases_pkey PRIMARY KEY (to_index)
    INDEX CREATE UNIQUE INDEX shardq_relay_leases_pkey ON public.shardq_relay_leases USING btree (to_index)

TABLE shardq_schedules
    name text NOT NULL
    last_tick timestamp with time zone NOT NULL
    updated_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_schedules_pkey PRIMARY KEY (name)
    INDEX CREATE UNIQUE INDEX shardq_schedules_pkey ON public.shardq_schedules USING btree (name)

TABLE shardq_shard_map
    one_row boolean NOT NULL DEFAULT true
    shard_count integer NOT NULL
    shard_index integer NOT NULL
    recorded_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT shardq_shard_map_check CHECK (((shard_index >= 0) AND (shard_index < shard_count)))
    CONSTRAINT shardq_shard_map_one_row_check CHECK (one_row)
    CONSTRAINT shardq_shard_map_pkey PRIMARY KEY (one_row)
    CONSTRAINT shardq_shard_map_shard_count_check CHECK ((shard_count >= 1))
    INDEX CREATE UNIQUE INDEX shardq_shard_map_pkey ON public.shardq_shard_map USING btree (one_row)
    GRANT PUBLIC SELECT

TABLE shardq_workers
    worker_id text NOT NULL
    host text NOT NULL
    pid integer NOT NULL
    queues text[] NOT NULL
    started_at timestamp with time zone NOT NULL
    heartbeat_at timestamp with time zone NOT NULL DEFAULT now()
    claims bigint NOT NULL DEFAULT 0
    claimed bigint NOT NULL DEFAULT 0
    busy bigint NOT NULL DEFAULT 0
    empty bigint NOT NULL DEFAULT 0
    errors bigint NOT NULL DEFAULT 0
    completed bigint NOT NULL DEFAULT 0
    claim_us bigint NOT NULL DEFAULT 0
    CONSTRAINT shardq_workers_pkey PRIMARY KEY (worker_id)
    INDEX CREATE UNIQUE INDEX shardq_workers_pkey ON public.shardq_workers USING btree (worker_id)

TABLE workflow_events WITH (vacuum_truncate=false)
    shard_key integer NOT NULL
    workflow_id bigint NOT NULL
    key text NOT NULL
    value jsonb NOT NULL
    updated_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT workflow_events_pkey PRIMARY KEY (shard_key, workflow_id, key)
    CONSTRAINT workflow_events_shard_key_workflow_id_fkey FOREIGN KEY (shard_key, workflow_id) REFERENCES workflow_status(shard_key, id) ON DELETE CASCADE
    INDEX CREATE UNIQUE INDEX workflow_events_pkey ON public.workflow_events USING btree (shard_key, workflow_id, key)

TABLE workflow_messages WITH (vacuum_truncate=false)
    shard_key integer NOT NULL
    workflow_id bigint NOT NULL
    seq bigint NOT NULL GENERATED ALWAYS AS IDENTITY
    topic text NOT NULL
    message jsonb NOT NULL
    idempotency_key text
    received_by_step text
    created_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT workflow_messages_pkey PRIMARY KEY (shard_key, workflow_id, seq)
    CONSTRAINT workflow_messages_shard_key_workflow_id_fkey FOREIGN KEY (shard_key, workflow_id) REFERENCES workflow_status(shard_key, id) ON DELETE CASCADE
    INDEX CREATE INDEX workflow_messages_unreceived ON public.workflow_messages USING btree (shard_key, workflow_id, topic, seq) WHERE (received_by_step IS NULL)
    INDEX CREATE UNIQUE INDEX workflow_messages_idempotency ON public.workflow_messages USING btree (shard_key, workflow_id, idempotency_key) WHERE (idempotency_key IS NOT NULL)
    INDEX CREATE UNIQUE INDEX workflow_messages_pkey ON public.workflow_messages USING btree (shard_key, workflow_id, seq)

TABLE workflow_status WITH (vacuum_truncate=false, autovacuum_vacuum_scale_factor=0.01, autovacuum_vacuum_insert_scale_factor=0.05, fillfactor=40)
    shard_key integer NOT NULL
    id bigint NOT NULL GENERATED ALWAYS AS IDENTITY
    queue text NOT NULL
    handler text NOT NULL
    ordering_key text
    priority integer NOT NULL DEFAULT 0
    status text NOT NULL DEFAULT 'queued'::text
    payload jsonb NOT NULL DEFAULT '{}'::jsonb
    output jsonb
    error text
    attempts integer NOT NULL DEFAULT 0
    owner text
    lease_expires_at timestamp with time zone
    created_at timestamp with time zone NOT NULL DEFAULT now()
    started_at timestamp with time zone
    finished_at timestamp with time zone
    run_at timestamp with time zone NOT NULL DEFAULT now()
    max_attempts integer NOT NULL DEFAULT 20
    dedup_id text
    cancel_requested boolean NOT NULL DEFAULT false
    fence bigint NOT NULL DEFAULT 0
    held_status text
    job_group text
    ready_seq bigint
    parent_shard_key integer
    parent_id bigint
    parent_wake boolean
    abandon_on_parent_cancel boolean
    debounce_key text
    debounce_until timestamp with time zone
    parked boolean NOT NULL DEFAULT false
    deadline_at timestamp with time zone
    turn bigint
    CONSTRAINT workflow_status_key_or_group CHECK (((ordering_key IS NULL) OR (job_group IS NULL)))
    CONSTRAINT workflow_status_max_attempts_check CHECK ((max_attempts >= 1))
    CONSTRAINT workflow_status_pkey PRIMARY KEY (id, shard_key)
    CONSTRAINT workflow_status_shard_key_check CHECK (((shard_key >= 0) AND (shard_key <= 65535)))
    CONSTRAINT workflow_status_status_check CHECK ((status = ANY (ARRAY['waiting'::text, 'scheduled'::text, 'queued'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'dead'::text, 'cancelled'::text, 'held'::text]))) NOT VALID
    INDEX CREATE INDEX workflow_status_children ON public.workflow_status USING btree (parent_shard_key, parent_id) WHERE (parent_id IS NOT NULL)
    INDEX CREATE INDEX workflow_status_deadline ON public.workflow_status USING btree (deadline_at) WHERE ((deadline_at IS NOT NULL) AND (NOT cancel_requested) AND (status = ANY (ARRAY['waiting'::text, 'scheduled'::text, 'queued'::text, 'running'::text])))
    INDEX CREATE INDEX workflow_status_dequeue_keyed ON public.workflow_status USING btree (queue, priority, id) WHERE ((status = 'queued'::text) AND (ordering_key IS NOT NULL))
    INDEX CREATE INDEX workflow_status_dequeue_plain ON public.workflow_status USING btree (queue, priority, id) WHERE ((status = 'queued'::text) AND (ordering_key IS NULL) AND (job_group IS NULL))
    INDEX CREATE INDEX workflow_status_failed ON public.workflow_status USING btree (finished_at, id) WHERE (status = ANY (ARRAY['dead'::text, 'failed'::text, 'cancelled'::text]))
    INDEX CREATE INDEX workflow_status_failed_queue ON public.workflow_status USING btree (status, queue) WHERE (status = ANY (ARRAY['dead'::text, 'failed'::text, 'cancelled'::text]))
    INDEX CREATE INDEX workflow_status_finished ON public.workflow_status USING btree (finished_at) WHERE (status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'dead'::text, 'cancelled'::text]))
    INDEX CREATE INDEX workflow_status_group_lines ON public.workflow_status USING btree (queue, hashtext(job_group), job_group, priority, turn, id) WHERE ((status >= 'queued'::text) AND (status <= 'queued'::text) AND (job_group IS NOT NULL) AND (hashtext(job_group) IS NOT NULL))
    INDEX CREATE INDEX workflow_status_held ON public.workflow_status USING btree (shard_key) WHERE (status = 'held'::text)
    INDEX CREATE INDEX workflow_status_key ON public.workflow_status USING btree (queue, ordering_key, status, id) WHERE ((ordering_key IS NOT NULL) AND (status = ANY (ARRAY['waiting'::text, 'queued'::text, 'running'::text, 'scheduled'::text])) AND (hashtext(ordering_key) IS NOT NULL))
    INDEX CREATE INDEX workflow_status_lease ON public.workflow_status USING btree (lease_expires_at) WHERE (status = 'running'::text)
    INDEX CREATE INDEX workflow_status_parent_wakes ON public.workflow_status USING btree (shard_key, id) WHERE parent_wake
    INDEX CREATE INDEX workflow_status_ready_grouped ON public.workflow_status USING btree (queue, turn, priority, id) WHERE ((status = 'queued'::text) AND (job_group IS NOT NULL))
    INDEX CREATE INDEX workflow_status_ready_keyed ON public.workflow_status USING btree (queue, priority, ready_seq) WHERE ((status = 'queued'::text) AND (ordering_key IS NOT NULL))
    INDEX CREATE INDEX workflow_status_ready_plain ON public.workflow_status USING btree (queue, priority, ready_seq) WHERE ((status = 'queued'::text) AND (ordering_key IS NULL) AND (job_group IS NULL))
    INDEX CREATE INDEX workflow_status_running_grouped ON public.workflow_status USING btree (queue, job_group) WHERE ((status = 'running'::text) AND (job_group IS NOT NULL))
    INDEX CREATE INDEX workflow_status_scheduled ON public.workflow_status USING btree (run_at) WHERE (status = 'scheduled'::text)
    INDEX CREATE INDEX workflow_status_scheduled_by_kind ON public.workflow_status USING btree (queue, attempts, parked) WHERE (status = 'scheduled'::text)
    INDEX CREATE UNIQUE INDEX workflow_status_debounce ON public.workflow_status USING btree (queue, debounce_key) WHERE ((debounce_until IS NOT NULL) AND (status = ANY (ARRAY['scheduled'::text, 'held'::text])) AND (NOT cancel_requested))
    INDEX CREATE UNIQUE INDEX workflow_status_dedup_held ON public.workflow_status USING btree (queue, dedup_id) WHERE ((dedup_id IS NOT NULL) AND (status = ANY (ARRAY['scheduled'::text, 'queued'::text, 'running'::text, 'held'::text])))
    INDEX CREATE UNIQUE INDEX workflow_status_pkey ON public.workflow_status USING btree (id, shard_key)
    TRIGGER CREATE TRIGGER shardq_ready_on_insert BEFORE INSERT ON public.workflow_status FOR EACH ROW WHEN (((new.status = 'queued'::text) AND (new.job_group IS NULL))) EXECUTE FUNCTION shardq_mark_ready()
    TRIGGER CREATE TRIGGER shardq_ready_on_update BEFORE UPDATE OF status, queue, priority, ordering_key, job_group ON public.workflow_status FOR EACH ROW WHEN (((new.status = 'queued'::text) AND (new.job_group IS NULL) AND ((old.status <> 'queued'::text) OR (old.queue <> new.queue) OR (old.priority <> new.priority) OR (old.ordering_key IS DISTINCT FROM new.ordering_key) OR (old.job_group IS NOT NULL)))) EXECUTE FUNCTION shardq_mark_ready()
    TRIGGER CREATE TRIGGER shardq_turn_on_insert BEFORE INSERT ON public.workflow_status FOR EACH ROW WHEN (((new.status = 'queued'::text) AND (new.job_group IS NOT NULL))) EXECUTE FUNCTION shardq_take_turn()
    TRIGGER CREATE TRIGGER shardq_turn_on_update BEFORE UPDATE OF status, queue, priority, job_group ON public.workflow_status FOR EACH ROW WHEN (((new.status = 'queued'::text) AND (new.job_group IS NOT NULL) AND ((old.status <> 'queued'::text) OR (old.queue <> new.queue) OR (old.priority <> new.priority) OR (old.job_group IS DISTINCT FROM new.job_group)))) EXECUTE FUNCTION shardq_take_turn()
    TRIGGER CREATE TRIGGER workflow_status_child_finished BEFORE UPDATE OF status ON public.workflow_status FOR EACH ROW WHEN (((new.parent_id IS NOT NULL) AND (new.status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'dead'::text, 'cancelled'::text])) AND (old.status <> ALL (ARRAY['succeeded'::text, 'failed'::text, 'dead'::text, 'cancelled'::text])))) EXECUTE FUNCTION shardq_child_finished()
    TRIGGER CREATE TRIGGER workflow_status_key_floor_on_insert AFTER INSERT ON public.workflow_status FOR EACH ROW WHEN (((new.ordering_key IS NOT NULL) AND (new.status = ANY (ARRAY['waiting'::text, 'running'::text])))) EXECUTE FUNCTION shardq_key_floor_lower()
    TRIGGER CREATE TRIGGER workflow_status_key_floor_on_update AFTER UPDATE OF status, queue, ordering_key ON public.workflow_status FOR EACH ROW WHEN (((new.ordering_key IS NOT NULL) AND (new.status = ANY (ARRAY['waiting'::text, 'queued'::text, 'running'::text, 'scheduled'::text])) AND ((old.status <> ALL (ARRAY['waiting'::text, 'queued'::text, 'running'::text, 'scheduled'::text])) OR (old.queue IS DISTINCT FROM new.queue) OR (old.ordering_key IS DISTINCT FROM new.ordering_key)))) EXECUTE FUNCTION shardq_key_floor_lower()

TABLE workflow_steps WITH (vacuum_truncate=false, fillfactor=100)
    shard_key integer NOT NULL
    workflow_id bigint NOT NULL
    step_name text NOT NULL
    output jsonb
    error text
    created_at timestamp with time zone NOT NULL DEFAULT now()
    CONSTRAINT workflow_steps_pkey PRIMARY KEY (shard_key, workflow_id, step_name)
    CONSTRAINT workflow_steps_shard_key_workflow_id_fkey FOREIGN KEY (shard_key, workflow_id) REFERENCES workflow_status(shard_key, id) ON DELETE CASCADE
    INDEX CREATE UNIQUE INDEX workflow_steps_pkey ON public.workflow_steps USING btree (shard_key, workflow_id, step_name)

SEQUENCE shardq_cascades_owed_generation
SEQUENCE shardq_group_bucket_seq
SEQUENCE shardq_limit_lease_seq
SEQUENCE shardq_map_change_xid
SEQUENCE shardq_ready_seq
SEQUENCE workflow_messages_seq_seq
SEQUENCE workflow_status_id_seq

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_advance_ready_floors()
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        DECLARE
            every constant interval := interval '250 milliseconds';
            b record;
            s bigint;
            x xid8;
            passed boolean;
        BEGIN
            IF pg_current_xact_id_if_assigned() IS NOT NULL
               OR NOT pg_try_advisory_xact_lock(hashtext('shardq_ready_floors')::bigint) THEN
                RETURN;
            END IF;
            -- The barrier's newest row (migration 0049: a move replaces the row it
            -- read by a new one; under a held horizon the replaced ones lie behind
            -- it in this backward walk of the primary key, never read).
            SELECT r.pending_seq, r.pending_xid, r.advanced_at INTO b
                FROM public.shardq_ready_barrier r ORDER BY r.pending_seq DESC LIMIT 1;
            IF NOT FOUND OR b.advanced_at > clock_timestamp() - every THEN
                RETURN;
            END IF;
            -- The number, then the id: two statements, in this order.
            s := nextval('public.shardq_ready_seq');
            x := pg_current_xact_id();
            passed := b.pending_xid IS NOT NULL
                AND pg_snapshot_xmin(pg_current_snapshot()) > b.pending_xid;
            -- Each floor that rises gets a new row, numbered by this move, and
            -- loses the one it replaces, in one statement (migration 0047: no
            -- floor's row is ever updated, so reading one never walks versions).
            IF passed THEN
                WITH moved AS (
                    SELECT fl.queue, fl.priority, fl.move_seq, fl.floor_seq, fl.keyed_floor_seq,
                           greatest(fl.floor_seq, LEAST(b.pending_seq,
                               (SELECT w.ready_seq FROM public.workflow_status w
                                WHERE w.queue = fl.queue AND w.priority = fl.priority
                                  AND w.status = 'queued' AND w.ordering_key IS NULL
                                  AND w.job_group IS NULL AND w.ready_seq >= fl.floor_seq
                                ORDER BY w.ready_seq LIMIT 1))) AS new_floor_seq,
                           greatest(fl.keyed_floor_seq, LEAST(b.pending_seq,
                               (SELECT w.ready_seq FROM public.workflow_status w
                                WHERE w.queue = fl.queue AND w.priority = fl.priority
                                  AND w.status = 'queued' AND w.ordering_key IS NOT NULL
                                  AND w.ready_seq >= fl.keyed_floor_seq
                                ORDER BY w.ready_seq LIMIT 1))) AS new_keyed_floor_seq
                    FROM public.shardq_ready_floors fl
                ), risen AS MATERIALIZED (
                    SELECT * FROM moved
                    WHERE new_floor_seq > floor_seq OR new_keyed_floor_seq > keyed_floor_seq
                ), added AS (
                    INSERT INTO public.shardq_ready_floor_moves
                        (queue, priority, move_seq, floor_seq, keyed_floor_seq)
                    SELECT r.queue, r.priority, s, r.new_floor_seq, r.new_keyed_floor_seq FROM risen r
                )
                -- Each replaced row found by its key: joined to the rows to delete,
                -- the planner walked the whole key, every row a hold keeps, once
                -- statistics showed few live rows.
                DELETE FROM public.shardq_ready_floor_moves d
                WHERE d.ctid = ANY (ARRAY(
                    SELECT (SELECT f.ctid FROM public.shardq_ready_floor_moves f
                            WHERE f.queue = r.queue AND f.priority = r.priority
                              AND f.move_seq = r.move_seq)
                    FROM risen r));
            END IF;
            -- The grouped rounds, behind the same barrier (migration 0041).
            PERFORM public.shardq_move_group_rounds(s, passed);
            -- Deleted, then added: this text also runs on the table as migration
            -- 0047 left it (one_row its key; pending_seq NULL before any move),
            -- between the migration whose transaction applies the functions (0047,
            -- or 0048 on a shard at 47) and 0049.
            IF b.pending_seq IS NULL THEN
                DELETE FROM public.shardq_ready_barrier r WHERE r.pending_seq IS NULL;
            ELSE
                DELETE FROM public.shardq_ready_barrier r WHERE r.pending_seq = b.pending_seq;
            END IF;
            INSERT INTO public.shardq_ready_barrier (pending_seq, pending_xid, advanced_at)
                VALUES (s, x, clock_timestamp());
        END
        $function$

-- EXECUTE: 
CREATE OR REPLACE FUNCTION public.shardq_cascades_paid(p_keys integer[], p_ids bigint[], p_generations bigint[])
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
            WITH paid AS (
                DELETE FROM public.shardq_cascades_owed o
                USING unnest(p_keys, p_ids, p_generations) AS p(k, i, g)
                WHERE o.shard_key = p.k AND o.id = p.i AND o.generation <= p.g
                RETURNING 1)
            SELECT count(*) FROM paid;
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_check_route(p_epoch integer, VARIADIC p_shard_keys integer[])
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    current_epoch int;
    my_index int;
    held int4multirange;
    stray int;
    stray_index int;
BEGIN
    -- (maintenance_class(), MAP_SLOT): -1457378061 is the low 32 bits of
    -- FNV-1a 64 of 'shardq:maintenance' (src/store/locks.rs).
    PERFORM pg_advisory_xact_lock_shared(-1457378061, 3);
    PERFORM shardq_refuse_stale_snapshot();
    SELECT max(e.epoch) INTO current_epoch FROM shardq_map_epochs e;
    SELECT m.shard_index INTO my_index FROM shardq_shard_map m;
    IF current_epoch IS NULL OR my_index IS NULL THEN
        RAISE EXCEPTION 'this shard records no shard map' USING ERRCODE = 'SQ002',
            HINT = 'run `shardq migrate` with the full shard list first';
    END IF;
    IF p_epoch IS NOT NULL AND p_epoch <> current_epoch THEN
        RAISE EXCEPTION 'stale shard map: the write was routed by epoch %, this shard is at epoch %; nothing was written',
            p_epoch, current_epoch
            USING ERRCODE = 'SQ004',
                  DETAIL = format('epoch=%s', current_epoch),
                  HINT = 'reload the shard map (shardq_route, or shardq_map_ranges at the highest '
                         'epoch) and route the job again';
    END IF;
    -- This shard's keys as one multirange: each key's test is a binary
    -- search in memory, not an index probe (a 5,000-row insert checks
    -- 5,000 keys).
    SELECT COALESCE(range_agg(int4range(r.first_key, r.end_key)), '{}'::int4multirange)
        INTO held FROM shardq_map_ranges r
        WHERE r.epoch = current_epoch AND r.shard_index = my_index;
    SELECT k INTO stray FROM unnest(p_shard_keys) AS k WHERE NOT held @> k LIMIT 1;
    IF stray IS NOT NULL THEN
        SELECT r.shard_index INTO stray_index FROM shardq_map_ranges r
            WHERE r.epoch = current_epoch AND r.first_key <= stray AND stray < r.end_key;
        RAISE EXCEPTION 'shard_key % is on shard % at epoch %, not on this shard (%); nothing was written',
            stray, stray_index, current_epoch, my_index
            USING ERRCODE = 'SQ001',
                  DETAIL = format('shard_key=%s shard_index=%s epoch=%s', stray, stray_index,
                                  current_epoch),
                  HINT = format('enqueue it on shard %s', stray_index);
    END IF;
    RETURN true;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_child_finished()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    NEW.parent_wake := true;
    RETURN NEW;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_child_intent(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint, p_step text, p_child_shard_key integer, p_child_id bigint)
 RETURNS TABLE(state text, child_shard_key integer, child_id bigint, parent_deadline timestamp with time zone)
 LANGUAGE sql
AS $function$
    SELECT * FROM shardq_child_intent(p_shard_key, p_id, p_owner, p_fence, p_step,
        p_child_shard_key, p_child_id, NULL::text, NULL::text);
$function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_child_intent(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint, p_step text, p_child_shard_key integer, p_child_id bigint, p_queue text, p_handler text)
 RETURNS TABLE(state text, child_shard_key integer, child_id bigint, parent_deadline timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    owned boolean;
    cancelled boolean;
    deadline timestamptz;
    recorded jsonb;
BEGIN
    SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence AND w.status = 'running',
            w.cancel_requested, w.deadline_at
        INTO owned, cancelled, deadline
        FROM workflow_status w WHERE w.shard_key = p_shard_key AND w.id = p_id FOR SHARE;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step;
    IF recorded IS NOT NULL THEN
        RETURN QUERY SELECT 'started'::text, (recorded->>'child_shard_key')::int,
            (recorded->>'child_id')::bigint, deadline;
        RETURN;
    END IF;
    IF cancelled THEN
        RETURN QUERY SELECT 'cancelled'::text, NULL::int, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF owned IS NOT TRUE THEN
        RETURN QUERY SELECT 'not_held'::text, NULL::int, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
    VALUES (p_shard_key, p_id, p_step || ':id',
            jsonb_build_object('child_shard_key', p_child_shard_key, 'child_id', p_child_id,
                       'queue', p_queue, 'handler', p_handler))
    ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step || ':id';
    RETURN QUERY SELECT 'reserved'::text, (recorded->>'child_shard_key')::int,
        (recorded->>'child_id')::bigint, deadline;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_child_result(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint, p_name text, p_child_shard_key integer, p_child_id bigint, p_recheck_ms bigint)
 RETURNS TABLE(owned boolean, cancel_requested boolean, output jsonb, found boolean, until timestamp with time zone, wait_recorded bigint)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    held record;
BEGIN
    SELECT * INTO held FROM shardq_hold_workflow(p_shard_key, p_id, p_owner, p_fence);
    IF held.cancel_requested IS TRUE OR held.owned IS NOT TRUE THEN
        RETURN QUERY SELECT coalesce(held.owned, false), coalesce(held.cancel_requested, false),
            NULL::jsonb, NULL::boolean, NULL::timestamptz, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, false, d.output, d.found, d.until, d.wait_recorded
        FROM shardq_child_result_decide(p_shard_key, p_id, p_name, p_child_shard_key,
                                        p_child_id, p_recheck_ms) d;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_child_result_decide(p_shard_key integer, p_id bigint, p_name text, p_child_shard_key integer, p_child_id bigint, p_recheck_ms bigint)
 RETURNS TABLE(output jsonb, found boolean, until timestamp with time zone, wait_recorded bigint)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH recorded AS MATERIALIZED (
        SELECT s.output FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name
    ), child AS MATERIALIZED (
        SELECT c.status, c.output, c.error FROM workflow_status c
        WHERE c.shard_key = p_child_shard_key AND c.id = p_child_id
            AND NOT EXISTS (SELECT 1 FROM recorded)
            AND NOT (c.status = 'held' AND c.held_status = 'running')
    ), finished AS MATERIALIZED (
        SELECT jsonb_build_object('status', c.status, 'output', c.output, 'error', c.error)
            AS output
        FROM child c WHERE c.status IN ('succeeded', 'failed', 'dead', 'cancelled')
    ), written AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, f.output FROM finished f
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING workflow_steps.output
    ), waiting AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name || ':wait',
            jsonb_build_object('child_shard_key', p_child_shard_key, 'child_id', p_child_id)
        WHERE EXISTS (SELECT 1 FROM child) AND NOT EXISTS (SELECT 1 FROM finished)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING 1
    ), park AS MATERIALIZED (
        UPDATE workflow_status w SET run_at = now() + p_recheck_ms * interval '1 millisecond'
        WHERE w.shard_key = p_shard_key AND w.id = p_id
            AND EXISTS (SELECT 1 FROM child) AND NOT EXISTS (SELECT 1 FROM finished)
        RETURNING w.run_at
    )
    SELECT coalesce((SELECT r.output FROM recorded r), (SELECT x.output FROM written x)),
        EXISTS (SELECT 1 FROM recorded) OR EXISTS (SELECT 1 FROM child),
        (SELECT k.run_at FROM park k), (SELECT count(*) FROM waiting);
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_child_wait(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint, p_name text, p_child_shard_key integer, p_child_id bigint, p_recheck_ms bigint)
 RETURNS TABLE(owned boolean, cancel_requested boolean, output jsonb)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    held record;
    recorded jsonb;
BEGIN
    SELECT * INTO held FROM shardq_hold_workflow(p_shard_key, p_id, p_owner, p_fence);
    IF held.cancel_requested IS TRUE OR held.owned IS NOT TRUE THEN
        RETURN QUERY SELECT coalesce(held.owned, false), coalesce(held.cancel_requested, false),
            NULL::jsonb;
        RETURN;
    END IF;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name;
    IF recorded IS NULL THEN
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        VALUES (p_shard_key, p_id, p_name || ':wait',
                jsonb_build_object('child_shard_key', p_child_shard_key, 'child_id', p_child_id))
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING;
        -- Pushed out only while no wake came in this run (a wake sets
        -- run_at to its now(), after the claim's started_at; so does a
        -- push by an earlier call of this run, which stands): a second
        -- result() of the run must not undo a wake already delivered.
        UPDATE workflow_status w SET run_at = now() + p_recheck_ms * interval '1 millisecond'
            WHERE w.shard_key = p_shard_key AND w.id = p_id AND w.run_at <= w.started_at;
    END IF;
    RETURN QUERY SELECT true, false, recorded;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_claim(p_lock_class integer, p_slots integer, p_queue text, p_limit integer, p_owner text, p_lease_ms bigint)
 RETURNS SETOF shardq_claimed
 LANGUAGE plpgsql
 SET enable_hashjoin TO 'on'
 SET enable_mergejoin TO 'on'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    keyed_ready boolean;
BEGIN
    -- A paused queue answers "empty" before any lock is tried: one probe of
    -- a table of a few rows per claim statement.
    IF EXISTS (SELECT 1 FROM shardq_paused_queues p WHERE p.queue = p_queue) THEN
        RETURN QUERY SELECT * FROM shardq_take('{}', p_owner, p_lease_ms, 1);
        RETURN;
    END IF;
    IF p_slots > 0 AND NOT EXISTS (
            SELECT 1 FROM generate_series(0, p_slots - 1) AS s
            WHERE pg_try_advisory_xact_lock(p_lock_class, s)) THEN
        RETURN QUERY SELECT * FROM shardq_take('{}', p_owner, p_lease_ms, 0);
        RETURN;
    END IF;
    keyed_ready := shardq_queue_has_ready(p_queue, p_plain => false, p_grouped => false);
    -- Grouped jobs ready: the groups take turns (shardq_claim_grouped, whose
    -- walk starts at the first ready turn found here). A queue that also
    -- has keyed jobs ready gives every other claim, at random, to its keyed
    -- jobs.
    IF shardq_grouped_ready_turn(p_queue) IS NOT NULL
       AND (random() < 0.5 OR NOT keyed_ready) THEN
        RETURN QUERY SELECT * FROM shardq_claim_grouped(p_queue, p_limit, p_owner, p_lease_ms);
    ELSIF keyed_ready THEN
        RETURN QUERY SELECT * FROM shardq_claim_keyed(p_queue, p_limit, p_owner, p_lease_ms);
    ELSE
        -- No keyed job ready: unkeyed jobs have no order to keep, so they
        -- are locked from their ready floors and taken.
        RETURN QUERY SELECT * FROM shardq_take(shardq_lock_plain_ready(p_queue, p_limit),
                                               p_owner, p_lease_ms, 1);
    END IF;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_claim_grouped(p_queue text, p_limit integer, p_owner text, p_lease_ms bigint)
 RETURNS SETOF shardq_claimed
 LANGUAGE plpgsql
 SET enable_hashjoin TO 'on'
 SET enable_mergejoin TO 'on'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    lim shardq_queue_limits%ROWTYPE;
    limited boolean;
    held_back boolean;
    start int := (floor(random() * 4294967296) - 2147483648)::int;
    g_name text[]; g_tid tid[];               -- groups met, and their heads
    more_name text[]; more_tid tid[];
    g_allowed int[];                          -- jobs each may start now (limited)
    a_name text[]; a_allowed int[]; a_tokens float8[]; a_seq bigint[];
    b_name text[]; b_seq bigint[]; b_tokens float8[]; b_at timestamptz[];
    has_plain boolean;
    plain_tids tid[];        -- ready jobs without a group, locked here
    plain_pos float8;
    per_group int;
    c_tid tid[]; c_sk int[]; c_id bigint[]; c_group text[]; c_pos float8[]; c_rn bigint[];
    t_tid tid[]; t_group text[];
    at timestamptz;
    walk_from bigint;                         -- without limits: where the walk starts
    line_from bigint;                         -- with limits: where each group's run starts
    groups_met bigint;                        -- and the groups it met
    plain_share float8;                       -- the ungrouped jobs' share
BEGIN
    SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = p_queue;
    limited := lim.group_concurrency IS NOT NULL OR lim.group_rate_count IS NOT NULL;

    IF NOT limited THEN
        -- The floors and rounds move before any job is locked (the move
        -- needs a transaction without an id yet).
        PERFORM shardq_advance_ready_floors();
        walk_from := shardq_group_floor(p_queue);
        -- Past the floor: the first ready turn the claim's choice of path
        -- found in this transaction (shardq_grouped_ready_turn), read once.
        IF current_setting('shardq.grouped_from_queue', true) = p_queue AND p_queue <> '' THEN
            walk_from := greatest(walk_from, nullif(
                current_setting('shardq.grouped_from_turn', true), '')::bigint);
        END IF;
        PERFORM set_config('shardq.grouped_from_queue', '', true);
        SELECT coalesce(array_agg(t.tid ORDER BY t.turn, t.priority, t.id), '{}'),
               count(DISTINCT t.job_group)
        INTO g_tid, groups_met
        FROM (SELECT w.ctid AS tid, w.job_group, w.turn, w.priority, w.id
              FROM workflow_status w
              WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                AND w.turn >= walk_from
              ORDER BY w.turn, w.priority, w.id LIMIT p_limit
              FOR UPDATE SKIP LOCKED) t;
        -- Their share, p_limit / (groups + 1), rounded up or down at random
        -- in proportion (a claim of 1 with one group met: half the time).
        plain_share := p_limit::float8 / (groups_met + 1);
        plain_tids := shardq_lock_plain_ready(p_queue, greatest(
            floor(plain_share)::int + (random() < plain_share - floor(plain_share))::int,
            p_limit - cardinality(g_tid)));
        t_tid := g_tid[1:p_limit - cardinality(plain_tids)] || plain_tids;
        -- Fewer than asked: the walk reached the end of the numbered
        -- grouped jobs it could see, and locked every one no other
        -- transaction held, so only the other kinds and grouped jobs
        -- without a turn are probed (probing the grouped index again would
        -- walk its dead entries twice under a held horizon). As for jobs
        -- without a group, a grouped job committed after the walk announces
        -- itself, and one a transaction held and let go waits for the next
        -- claim of the queue.
        held_back := cardinality(t_tid) < p_limit
            AND (shardq_queue_has_ready(p_queue, p_grouped => false, p_taking => t_tid)
                 OR EXISTS (SELECT 1 FROM workflow_status w
                            WHERE w.queue = p_queue AND w.status = 'queued'
                              AND w.job_group IS NOT NULL AND w.turn IS NULL));
        RETURN QUERY SELECT * FROM shardq_take(t_tid, p_owner, p_lease_ms,
                                               CASE WHEN held_back THEN 2 ELSE 1 END);
        RETURN;
    END IF;

    SELECT g.names, g.heads INTO g_name, g_tid
        FROM shardq_group_heads(p_queue, start, 2147483648, p_limit) g;
    IF cardinality(g_name) < p_limit THEN
        SELECT g.names, g.heads INTO more_name, more_tid
            FROM shardq_group_heads(p_queue, -2147483648, start, p_limit - cardinality(g_name)) g;
        g_name := g_name || more_name;
        g_tid := g_tid || more_tid;
    END IF;

    -- Group limits: each group's lock, tried once (the walk met each name once).
    SELECT coalesce(array_agg(l.g), '{}') INTO a_name
    FROM unnest(g_name) AS l(g)
    WHERE pg_try_advisory_xact_lock(shardq_key_lock(p_queue, chr(30) || l.g));
    -- New statements: their snapshots see all that was done under the
    -- group locks. Buckets only with a group rate (a queue without one
    -- reads none); each refilled at the rate up to its burst.
    IF lim.group_rate_count IS NOT NULL THEN
        SELECT array_agg(b.job_group), array_agg(b.take_seq), array_agg(b.tokens),
               array_agg(b.tokens_at)
        INTO b_name, b_seq, b_tokens, b_at
        FROM shardq_group_buckets_of(p_queue, a_name) b;
    END IF;
    at := clock_timestamp();
    SELECT coalesce(array_agg(a.g), '{}'), coalesce(array_agg(a.allowed), '{}'),
           coalesce(array_agg(a.tokens), '{}'), coalesce(array_agg(a.seq), '{}')
    INTO a_name, a_allowed, a_tokens, a_seq FROM (
        SELECT l.g, t.tokens, t.seq, least(p_limit,
            CASE WHEN lim.group_concurrency IS NULL THEN p_limit
                 ELSE greatest(0, lim.group_concurrency - (
                     SELECT count(*) FROM workflow_status r
                     WHERE r.queue = p_queue AND r.job_group = l.g
                       AND r.status = 'running')) END,
            CASE WHEN lim.group_rate_count IS NULL THEN p_limit
                 ELSE floor(t.tokens) END)::int AS allowed
        FROM unnest(a_name) AS l(g)
        CROSS JOIN LATERAL (
            SELECT least(greatest(1.0, lim.group_rate_count * 50.0 / lim.group_rate_period_ms),
                         coalesce(b.tokens + extract(epoch FROM at - b.tokens_at) * 1000.0
                                  * lim.group_rate_count / lim.group_rate_period_ms,
                                  greatest(1.0, lim.group_rate_count * 50.0
                                                / lim.group_rate_period_ms))) AS tokens,
                   b.seq
            FROM (SELECT 1) AS one
            LEFT JOIN unnest(b_name, b_seq, b_tokens, b_at) AS b(g, seq, tokens, tokens_at)
                ON b.g = l.g) t
    ) a;
    -- Only the groups that may start something now, in walk order.
    SELECT coalesce(array_agg(w.g ORDER BY w.pos), '{}'),
           coalesce(array_agg(w.head ORDER BY w.pos), '{}'),
           coalesce(array_agg(a.allowed ORDER BY w.pos), '{}')
    INTO g_name, g_tid, g_allowed
    FROM unnest(g_name, g_tid) WITH ORDINALITY AS w(g, head, pos)
    JOIN unnest(a_name, a_allowed) AS a(g, allowed) ON a.g = w.g
    WHERE a.allowed > 0;

    plain_tids := shardq_lock_plain_ready(p_queue, p_limit);
    -- The queue's rounds row (made by its first claim): the moves of the
    -- rounds number the grouped jobs left without a turn only in queues
    -- that have one. Its floor bounds the runs below (no ready job's turn
    -- is under it), as it bounds the heads' walk.
    line_from := shardq_group_floor(p_queue);
    has_plain := cardinality(plain_tids) > 0;
    per_group := ceil(p_limit::numeric / greatest(1, cardinality(g_name) + has_plain::int));
    plain_pos := random() * (cardinality(g_name) + 1) + 0.5;

    -- One job of each group: the heads the walk found, locked by tuple id
    -- (the outer statement's snapshot keeps every version it might meet
    -- from being removed), then checked: a head taken or changed since is
    -- left (the lock returns the row's newest version, taken: no longer
    -- queued; changed and still queued: a new tuple id, not among the
    -- heads). Only the ids bound the scan (OFFSET 0 keeps the checks out
    -- of it): with them in it, the plan the connection keeps (made with
    -- the statistics of a small queue) walked every ready job of the queue
    -- instead, 14-28 ms a claim with 20,000 ready until autovacuum's next
    -- analyze. No sequential scan (as on shardq's own connections): a plan
    -- made while the table had a few pages would keep one; no bitmap scan
    -- either: a group's run read as one reads every ready job of the group
    -- and sorts them, where an index scan stops at the run's length. More: each
    -- group's first per_group jobs, no more than it may start. The jobs
    -- without a group fill what the groups leave, after their turn.
    WITH heads_only AS MATERIALIZED (
        SELECT h.pos::float8 AS pos, h.tid, h.shard_key, h.id, h.job_group, h.priority, h.turn
        FROM (SELECT w.ctid AS tid, w.shard_key, w.id, w.job_group, w.priority, w.turn,
                     w.status, w.queue, array_position(g_tid, w.ctid) AS pos
              FROM workflow_status w
              WHERE per_group = 1 AND w.ctid = ANY (g_tid)
              FOR UPDATE OF w SKIP LOCKED OFFSET 0) h
        WHERE h.pos IS NOT NULL AND h.status = 'queued' AND h.queue = p_queue
          AND h.job_group IS NOT NULL
    ), runs AS MATERIALIZED (
        SELECT g.pos::float8 AS pos, c.tid, c.shard_key, c.id, c.job_group, c.priority, c.turn
        FROM unnest(g_name, coalesce(g_allowed, '{}')) WITH ORDINALITY AS g(name, allowed, pos)
        CROSS JOIN LATERAL (
            SELECT w.ctid AS tid, w.shard_key, w.id, w.job_group, w.priority, w.turn
            FROM workflow_status w
            WHERE per_group > 1 AND w.queue = p_queue
              AND w.status >= 'queued' AND w.status <= 'queued'
              AND w.job_group IS NOT NULL AND hashtext(w.job_group) = hashtext(g.name)
              AND w.job_group = g.name AND w.turn >= line_from
            ORDER BY w.priority, w.turn, w.id
            LIMIT least(per_group, coalesce(g.allowed, per_group))
            FOR UPDATE SKIP LOCKED) c
    ), plain AS MATERIALIZED (
        SELECT w.ctid AS tid, w.shard_key, w.id, w.priority FROM workflow_status w
        WHERE w.ctid = ANY (plain_tids)
    ), met AS (
        SELECT g.pos, g.tid, g.shard_key, g.id, g.job_group,
               row_number() OVER (PARTITION BY g.pos ORDER BY g.priority, g.turn, g.id) AS rn
        FROM (SELECT * FROM heads_only UNION ALL SELECT * FROM runs) g
        UNION ALL
        SELECT plain_pos, p.tid, p.shard_key, p.id, NULL,
               row_number() OVER (ORDER BY p.priority, p.id) FROM plain p
    )
    SELECT coalesce(array_agg(m.tid), '{}'), coalesce(array_agg(m.job_group), '{}')
    INTO t_tid, t_group FROM (SELECT * FROM met ORDER BY rn, pos LIMIT p_limit) m;

    IF lim.group_rate_count IS NOT NULL THEN
        -- What each group took comes off its bucket (groups that took
        -- nothing keep theirs: its refill needs no write): a new row each,
        -- the one read deleted.
        PERFORM shardq_group_buckets_write(p_queue, array_agg(a.g), array_agg(a.seq),
                                           array_agg(a.tokens - n.taken), at)
        FROM unnest(a_name, a_tokens, a_seq) AS a(g, tokens, seq)
        JOIN (SELECT t.g, count(*) AS taken FROM unnest(t_group) AS t(g)
              WHERE t.g IS NOT NULL GROUP BY t.g) n ON n.g = a.g
        HAVING count(*) > 0;
    END IF;

    -- Fewer than asked while jobs of the queue stay ready besides those
    -- taken now (held back by limits, heads a concurrent claim had, or
    -- keyed jobs this path does not take): got_slot 2, so the worker asks
    -- again soon instead of taking the queue for caught up and waiting for
    -- a wake-up. (A new statement: its snapshot sees what other claims
    -- took while this one ran.)
    held_back := cardinality(t_tid) < p_limit
        AND shardq_queue_has_ready(p_queue, p_taking => t_tid);

    RETURN QUERY SELECT * FROM shardq_take(t_tid, p_owner, p_lease_ms,
                                           CASE WHEN held_back THEN 2 ELSE 1 END);
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_claim_keyed(p_queue text, p_limit integer, p_owner text, p_lease_ms bigint)
 RETURNS SETOF shardq_claimed
 LANGUAGE plpgsql
 SET enable_hashjoin TO 'on'
 SET enable_mergejoin TO 'on'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    c_tid tid[]; c_key text[]; c_id bigint[]; -- ready jobs met, in dequeue order
    l_key text[]; l_pos bigint[];             -- keys locked here, and their head's position
    l_head bigint[];                          -- ... and their lowest head's id
    l_floor bigint[];                         -- ... and their floor
    l_from bigint[];                          -- ... and the id their reads start at
    f_key text[]; f_pos bigint[]; f_from bigint[]; -- locked keys nothing holds
    t_tid tid[] := '{}';                      -- jobs to claim
    blocked text[];                           -- locked keys something else holds
    held text[];                              -- keys held once this claim commits
    parked int;
    round int := 0;
    plain_tids tid[];                         -- ready unkeyed jobs locked here
    head_tids tid[];                          -- ready keyed jobs locked here
BEGIN
    LOOP
        round := round + 1;
        plain_tids := shardq_lock_plain_ready(p_queue, p_limit);
        head_tids := shardq_lock_keyed_ready(p_queue, p_limit);
        WITH met AS MATERIALIZED (
            SELECT w.ctid AS tid, w.ready_seq, w.priority, w.ordering_key, w.id
            FROM workflow_status w
            WHERE w.ctid = ANY (plain_tids || head_tids)
        )
        SELECT coalesce(array_agg(m.tid ORDER BY m.priority, m.ready_seq), '{}'),
               coalesce(array_agg(m.ordering_key ORDER BY m.priority, m.ready_seq), '{}'),
               coalesce(array_agg(m.id ORDER BY m.priority, m.ready_seq), '{}')
        INTO c_tid, c_key, c_id FROM met m;

        SELECT coalesce(array_agg(d.k ORDER BY d.pos), '{}'),
               coalesce(array_agg(d.pos ORDER BY d.pos), '{}'),
               coalesce(array_agg(d.head ORDER BY d.pos), '{}')
        INTO l_key, l_pos, l_head FROM (
            SELECT t.k, min(t.pos) AS pos, min(t.id) AS head
            FROM unnest(c_key, c_id) WITH ORDINALITY AS t(k, id, pos)
            WHERE t.k IS NOT NULL GROUP BY t.k) d
        WHERE pg_try_advisory_xact_lock(shardq_key_lock(p_queue, d.k));

        -- New statements: their snapshots see all that was done under the
        -- key locks. Each key's floor is probed by its key (a scalar
        -- subquery; joined, a plan made while the floors were few read them
        -- all, every key's row and its versions, on every claim). A head
        -- below its key's floor (a late job) lowers the floor, one key at a
        -- time: rare, and an update by the whole key stays on its index.
        SELECT coalesce(array_agg(coalesce(
                   (SELECT f.floor_id FROM shardq_key_floors f
                    WHERE f.queue = p_queue AND f.ordering_key = l.k), 0) ORDER BY l.pos), '{}')
        INTO l_floor FROM unnest(l_key, l_pos) AS l(k, pos);
        FOR i IN 1 .. cardinality(l_key) LOOP
            IF l_head[i] < l_floor[i] THEN
                UPDATE shardq_key_floors f SET floor_id = l_head[i], set_at = now()
                WHERE f.queue = p_queue AND f.ordering_key = l_key[i]
                  AND f.floor_id > l_head[i];
            END IF;
        END LOOP;

        WITH bounded AS (
            SELECT l.k, l.pos, least(l.head, l.floor) AS from_id
            FROM unnest(l_key, l_pos, l_head, l_floor) AS l(k, pos, head, floor)
        ), checked AS MATERIALIZED (
            -- One status per probe (shardq_key_jobs_from): each walks its
            -- key's entries of that status from the id on.
            SELECT b.k, b.pos, b.from_id, EXISTS (
                    SELECT 1 FROM workflow_status a
                    WHERE a.queue = p_queue AND a.ordering_key = b.k
                      AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'running', b.from_id))
                OR EXISTS (
                    SELECT 1 FROM workflow_status a
                    WHERE a.queue = p_queue AND a.ordering_key = b.k
                      AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'scheduled', b.from_id)) AS busy
            FROM bounded b
        )
        SELECT coalesce(array_agg(t.k ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.pos ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.from_id ORDER BY t.pos) FILTER (WHERE NOT t.busy), '{}'),
               coalesce(array_agg(t.k) FILTER (WHERE t.busy), '{}'),
               coalesce(array_agg(t.from_id ORDER BY t.pos), '{}')
        INTO f_key, f_pos, f_from, blocked, l_from FROM checked t;

        -- The free keys' runs, read and locked key by key in dequeue
        -- order: each key's queued and waiting jobs in id order, each
        -- locked by its primary key, the run cut at its first job not
        -- locked here (another transaction holds it, or it is no longer
        -- queued or waiting). The reading stops once a claim's worth of
        -- jobs that can be taken was met (the outer LIMIT ends the nested
        -- loop): a claim that read and locked every met key's backlog
        -- cost twenty times what it took when each key had twenty jobs
        -- queued. The last run read may be cut by it; if the take reaches
        -- it, the key is held and its other queued jobs are parked below
        -- (the rest when a later claim meets them); if not, nothing of it
        -- changes. Each key's jobs are numbered and cut within its own
        -- read, whatever order the keys come in.
        WITH runs AS MATERIALIZED (
            SELECT f.k, f.pos, x.rn, x.tid
            FROM unnest(f_key, f_pos, f_from) AS f(k, pos, from_id) CROSS JOIN LATERAL (
                SELECT y.rn, y.tid FROM (
                    SELECT row_number() OVER run AS rn, l.tid,
                           count(*) FILTER (WHERE l.tid IS NULL) OVER run AS gaps
                    FROM (
                        SELECT v.shard_key, v.id FROM (
                            (SELECT w.shard_key, w.id FROM workflow_status w
                             WHERE w.queue = p_queue AND w.ordering_key = f.k
                               AND shardq_key_jobs_from(w.ordering_key, w.status, w.id, 'queued', f.from_id)
                             ORDER BY w.status, w.id LIMIT p_limit)
                            UNION ALL
                            (SELECT w.shard_key, w.id FROM workflow_status w
                             WHERE w.queue = p_queue AND w.ordering_key = f.k
                               AND shardq_key_jobs_from(w.ordering_key, w.status, w.id, 'waiting', f.from_id)
                             ORDER BY w.status, w.id LIMIT p_limit)) v
                        ORDER BY v.id LIMIT p_limit) u
                    LEFT JOIN LATERAL (
                        SELECT w.ctid AS tid FROM workflow_status w
                        WHERE w.shard_key = u.shard_key AND w.id = u.id
                          AND w.status IN ('queued', 'waiting')
                        FOR UPDATE SKIP LOCKED) l ON true
                    -- Row by row: a frame of peers would read (and lock)
                    -- one row ahead.
                    WINDOW run AS (ORDER BY u.id ROWS UNBOUNDED PRECEDING)) y
                WHERE y.gaps = 0) x
            LIMIT p_limit
        ), offered AS (
            SELECT t.tid, NULL::text AS k, t.pos, 0::bigint AS rn
            FROM unnest(c_tid, c_key) WITH ORDINALITY AS t(tid, k, pos)
            WHERE t.k IS NULL
            UNION ALL
            SELECT r.tid, r.k, r.pos, r.rn FROM runs r
        ), take AS (
            SELECT * FROM offered o ORDER BY o.pos, o.rn LIMIT p_limit
        )
        SELECT coalesce(array_agg(x.tid), '{}'),
               coalesce(array_agg(DISTINCT x.k) FILTER (WHERE x.k IS NOT NULL), '{}')
        INTO t_tid, held FROM take x;

        -- Taken before the keys are parked below: a row parked would move
        -- (a new tuple id) and the take would miss it. Got_slot 2 when
        -- fewer than asked while grouped jobs of the queue are ready (a
        -- queue of keys and groups: the next claim may take those).
        IF cardinality(t_tid) > 0 THEN
            RETURN QUERY SELECT * FROM shardq_take(t_tid, p_owner, p_lease_ms,
                CASE WHEN cardinality(t_tid) < p_limit
                          AND shardq_queue_has_ready(p_queue, p_plain => false,
                                                     p_keyed => false)
                     THEN 2 ELSE 1 END);
        END IF;

        -- Park the queued jobs of the keys held now: those this claim took,
        -- and the locked ones something else holds (bounded per claim).
        UPDATE workflow_status w SET status = 'waiting'
        FROM (
            SELECT q.shard_key, q.id FROM workflow_status q
            WHERE (q.shard_key, q.id) IN (
                SELECT n.shard_key, n.id FROM unnest(l_key, l_from) AS h(k, from_id)
                CROSS JOIN LATERAL (
                    SELECT w2.shard_key, w2.id FROM workflow_status w2
                    WHERE w2.queue = p_queue AND w2.ordering_key = h.k
                      AND shardq_key_jobs_from(w2.ordering_key, w2.status, w2.id, 'queued', h.from_id)
                    ORDER BY w2.status, w2.id LIMIT p_limit) n
                WHERE h.k = ANY (held || blocked)
                LIMIT 4 * p_limit)
              AND q.status = 'queued'
            FOR UPDATE SKIP LOCKED) p
        WHERE w.shard_key = p.shard_key AND w.id = p.id;
        GET DIAGNOSTICS parked = ROW_COUNT;

        EXIT WHEN cardinality(t_tid) > 0 OR parked = 0 OR round >= 4;
    END LOOP;
    IF cardinality(t_tid) = 0 THEN
        RETURN QUERY SELECT * FROM shardq_take('{}', p_owner, p_lease_ms,
            CASE WHEN shardq_queue_has_ready(p_queue, p_plain => false, p_keyed => false)
                 THEN 2 ELSE 1 END);
    END IF;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_complete_many(p_shard_keys integer[], p_ids bigint[], p_fences bigint[], p_statuses text[], p_outputs jsonb[], p_owner text, p_errors text[], p_backoff_min_ms double precision, p_backoff_max_ms double precision)
 RETURNS TABLE(succeeded bigint, retrying bigint, dead bigint, cancelled bigint, released bigint, already bigint)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    d_succeeded bigint; d_retrying bigint; d_dead bigint; d_cancelled bigint;
    d_released bigint; d_all bigint; d_wakes bigint;
    a_succeeded bigint := 0; a_retrying bigint := 0; a_dead bigint := 0;
    a_cancelled bigint := 0; a_released bigint := 0; a_all bigint := 0;
BEGIN
    WITH batch AS MATERIALIZED (
        SELECT c.*, p_owner AS owner
        FROM unnest(p_shard_keys, p_ids, p_fences, p_statuses, p_outputs, p_errors)
            AS c(shard_key, id, fence, status, output, error)
    ), done AS (
        UPDATE workflow_status w SET
            status = CASE
                WHEN c.status = 'succeeded' THEN 'succeeded'
                WHEN w.cancel_requested THEN 'cancelled'
                WHEN c.status = 'released' THEN
                    CASE WHEN w.ordering_key IS NULL THEN 'queued' ELSE 'waiting' END
                WHEN c.status = 'parked' THEN 'scheduled'
                WHEN c.status = 'dead' OR w.attempts >= w.max_attempts THEN 'dead'
                ELSE 'scheduled' END,
            attempts = CASE WHEN c.status IN ('released', 'parked') THEN w.attempts - 1
                ELSE w.attempts END,
            started_at = CASE WHEN c.status IN ('released', 'parked') THEN NULL
                ELSE w.started_at END,
            run_at = CASE WHEN c.status = 'failed' AND NOT w.cancel_requested
                    AND w.attempts < w.max_attempts
                THEN now() + least(p_backoff_max_ms, p_backoff_min_ms
                    * power(2::float8, least(greatest(w.attempts - 1, 0), 62)))
                    * (0.5 + random() * 0.5) * interval '1 millisecond'
                ELSE w.run_at END,
            finished_at = CASE WHEN c.status IN ('succeeded', 'dead') OR w.cancel_requested
                    OR (c.status = 'failed' AND w.attempts >= w.max_attempts) THEN now() END,
            output = CASE WHEN c.status IN ('released', 'parked') THEN w.output ELSE c.output END,
            error = CASE WHEN w.cancel_requested AND c.status <> 'succeeded'
                    AND w.deadline_at <= now() AND w.error LIKE 'deadline passed at %'
                    THEN w.error
                WHEN c.status = 'released' AND w.cancel_requested
                    THEN 'cancelled before it started'
                WHEN c.status = 'released' THEN w.error
                WHEN c.status = 'parked' AND w.cancel_requested THEN 'cancelled while it waited'
                WHEN c.status = 'parked' THEN w.error ELSE c.error END,
            parked = c.status = 'parked' AND NOT w.cancel_requested,
            owner = NULL, lease_expires_at = NULL
        FROM batch c
        WHERE w.shard_key = c.shard_key AND w.id = c.id
            AND w.owner = c.owner AND w.fence = c.fence
        RETURNING w.status, w.parent_wake
    )
    SELECT count(*) FILTER (WHERE d.status = 'succeeded'),
        count(*) FILTER (WHERE d.status = 'scheduled'),
        count(*) FILTER (WHERE d.status = 'dead'),
        count(*) FILTER (WHERE d.status = 'cancelled'),
        count(*) FILTER (WHERE d.status IN ('queued', 'waiting')),
        count(*), count(*) FILTER (WHERE d.parent_wake)
    INTO d_succeeded, d_retrying, d_dead, d_cancelled, d_released, d_all, d_wakes
    FROM done d;
    IF d_wakes > 0 THEN
        -- Children of this batch that ended: wake their parents now, in a
        -- statement of its own (the trigger only flagged them; a parent may
        -- be a row the update above wrote). A parent whose row another
        -- transaction holds keeps the flag, for the promotion's pass.
        UPDATE workflow_status c SET parent_wake = NULL
        FROM unnest(p_shard_keys, p_ids) AS b(shard_key, id)
        WHERE c.shard_key = b.shard_key AND c.id = b.id AND c.parent_wake
            AND shardq_wake_parent(c.parent_shard_key, c.parent_id, c.shard_key, c.id);
        IF EXISTS (SELECT 1 FROM unnest(p_shard_keys, p_ids) AS b(shard_key, id)
                   JOIN workflow_status c ON c.shard_key = b.shard_key AND c.id = b.id
                   WHERE c.parent_wake) THEN
            -- Wakes left: parents on other shards (or rows locked now).
            -- The empty payload (no queue's name) rings the relay of
            -- this shard in every listening worker at commit
            -- (src/worker/wake_relay.rs), instead of its timer.
            PERFORM pg_notify('shardq_ready', '');
        END IF;
    END IF;
    IF d_all < cardinality(p_ids) THEN
        -- A statement of its own, so a snapshot of its own: it sees an
        -- earlier try that committed while the UPDATE waited for its row
        -- locks. Rows this transaction wrote just now are left out by xmin.
        SELECT count(*) FILTER (WHERE w.status = 'succeeded'),
            count(*) FILTER (WHERE w.status = 'scheduled'),
            count(*) FILTER (WHERE w.status = 'dead'),
            count(*) FILTER (WHERE w.status = 'cancelled'),
            count(*) FILTER (WHERE w.status IN ('queued', 'waiting')),
            count(*)
        INTO a_succeeded, a_retrying, a_dead, a_cancelled, a_released, a_all
        FROM unnest(p_shard_keys, p_ids, p_fences, p_statuses)
            AS c(shard_key, id, fence, status)
        JOIN workflow_status w
            ON w.shard_key = c.shard_key AND w.id = c.id AND w.fence = c.fence
            AND w.owner IS NULL
            AND (c.status = 'succeeded') = (w.status = 'succeeded')
            AND w.xmin IS DISTINCT FROM pg_current_xact_id_if_assigned()::xid;
    END IF;
    RETURN QUERY SELECT d_succeeded + a_succeeded, d_retrying + a_retrying, d_dead + a_dead,
        d_cancelled + a_cancelled, d_released + a_released, a_all;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_enqueue(p_queue text, p_handler text, p_payload jsonb DEFAULT '{}'::jsonb, p_ordering_key text DEFAULT NULL::text, p_dedup_id text DEFAULT NULL::text, p_run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, p_priority integer DEFAULT 0, p_max_attempts integer DEFAULT NULL::integer, p_epoch integer DEFAULT NULL::integer, p_group text DEFAULT NULL::text)
 RETURNS TABLE(job_id text, shard_key integer, id bigint, is_new boolean)
 LANGUAGE sql
AS $function$
    SELECT * FROM shardq_enqueue_row('', p_queue, p_handler, p_payload, p_ordering_key,
                                     p_dedup_id, p_run_at, p_priority, p_max_attempts, p_epoch,
                                     p_group)
$function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_enqueue_many(p_jobs jsonb, p_epoch integer DEFAULT NULL::integer)
 RETURNS TABLE(job_index integer, job_id text, shard_key integer, id bigint, is_new boolean)
 LANGUAGE plpgsql
AS $function$
DECLARE
    bad text;
    j record;
BEGIN
    IF jsonb_typeof(p_jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'shardq_enqueue_many takes a jsonb array of jobs, not %',
            COALESCE(jsonb_typeof(p_jobs), 'NULL') USING ERRCODE = '22023';
    END IF;
    SELECT format('job %s: %s', e.ord - 1, CASE WHEN jsonb_typeof(e.job) <> 'object'
               THEN 'a job is a JSON object, not ' || jsonb_typeof(e.job)
               ELSE format('unknown field `%s`', k.key) END)
        INTO bad
        FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS e(job, ord)
        LEFT JOIN LATERAL (
            SELECT key FROM jsonb_object_keys(CASE WHEN jsonb_typeof(e.job) = 'object'
                                                   THEN e.job ELSE '{}' END) AS key
            WHERE key NOT IN ('queue', 'handler', 'payload', 'ordering_key', 'dedup_id',
                              'run_at', 'priority', 'max_attempts', 'group')) k ON true
        WHERE jsonb_typeof(e.job) <> 'object' OR k.key IS NOT NULL
        ORDER BY e.ord LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION '%', bad USING ERRCODE = '22023',
            HINT = 'a job''s fields: queue, handler, payload, ordering_key, dedup_id, run_at, '
                   'priority, max_attempts, group';
    END IF;
    FOR j IN SELECT * FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (queue text,
                 handler text, payload jsonb, ordering_key text, dedup_id text,
                 run_at timestamptz, priority int, max_attempts int, "group" text))
                 WITH ORDINALITY
                 AS t(queue, handler, payload, ordering_key, dedup_id, run_at, priority,
                      max_attempts, job_group, ord)
             ORDER BY t.ord
    LOOP
        RETURN QUERY SELECT (j.ord - 1)::int, r.job_id, r.shard_key, r.id, r.is_new
            FROM shardq_enqueue_row(format('job %s: ', j.ord - 1), j.queue, j.handler,
                                    j.payload, j.ordering_key, j.dedup_id, j.run_at,
                                    j.priority, j.max_attempts, p_epoch, j.job_group) r;
    END LOOP;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_enqueue_row(p_at text, p_queue text, p_handler text, p_payload jsonb, p_ordering_key text, p_dedup_id text, p_run_at timestamp with time zone, p_priority integer, p_max_attempts integer, p_epoch integer, p_group text)
 RETURNS TABLE(job_id text, shard_key integer, id bigint, is_new boolean)
 LANGUAGE plpgsql
AS $function$
DECLARE
    -- The Rust client's limits (src/job.rs).
    max_name_bytes constant int := 255;
    max_key_bytes constant int := 1024;
    max_attempts_limit constant int := 1000;
    -- limits.max_payload_bytes and limits.default_max_attempts by default.
    default_payload_bytes constant int := 1048576;
    default_attempts constant int := 20;
    -- Tries of a deduplicated insert while holders of its id finish (as
    -- DEDUP_RACE_RETRIES in src/client/enqueue_once.rs).
    dedup_tries constant int := 3;
    payload jsonb := COALESCE(p_payload, '{}'::jsonb);
    max_payload int := COALESCE(NULLIF(current_setting('shardq.max_payload_bytes', true), '')::int,
                                default_payload_bytes);
    attempts int := COALESCE(p_max_attempts,
        NULLIF(current_setting('shardq.default_max_attempts', true), '')::int, default_attempts);
    routing text := COALESCE(p_ordering_key, p_group, p_dedup_id);
    size int;
    map_epoch int;
    map_count int;
    map_index int;
    k int;
    k_index int;
    keys_held int;
    run_at timestamptz := GREATEST(COALESCE(p_run_at, now()), now());
    status text;
    new_id bigint;
BEGIN
    IF p_queue IS NULL OR p_queue = '' THEN
        RAISE EXCEPTION '%queue name is empty', p_at USING ERRCODE = '22023',
            HINT = 'give the job the queue its workers take';
    END IF;
    IF p_handler IS NULL OR p_handler = '' THEN
        RAISE EXCEPTION '%handler name is empty', p_at USING ERRCODE = '22023',
            HINT = 'give the job the name of a handler registered on the workers';
    END IF;
    FOR i IN 1..5 LOOP
        size := octet_length(CASE i WHEN 1 THEN p_queue WHEN 2 THEN p_handler
                                    WHEN 3 THEN p_ordering_key WHEN 4 THEN p_dedup_id
                                    ELSE p_group END);
        IF size > (CASE WHEN i <= 2 THEN max_name_bytes ELSE max_key_bytes END) THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
                '%s%s is %s bytes, over the limit of %s bytes; shorten it (a long key or id can be hashed)',
                p_at, (ARRAY['queue', 'handler', 'ordering key', 'deduplication id', 'group'])[i], size,
                CASE WHEN i <= 2 THEN max_name_bytes ELSE max_key_bytes END);
        END IF;
    END LOOP;
    size := octet_length(payload::text);
    IF size > max_payload THEN
        RAISE EXCEPTION '%payload is % bytes, over limits.max_payload_bytes = %', p_at, size, max_payload
            USING ERRCODE = '22023',
                  HINT = 'send a smaller payload (or a reference to the data), or raise the '
                         'limit with ALTER DATABASE ... SET shardq.max_payload_bytes';
    END IF;
    IF p_ordering_key IS NOT NULL AND p_dedup_id IS NOT NULL THEN
        RAISE EXCEPTION '%a job cannot have both an ordering key and a deduplication id: the ordering key chooses the shard, so the deduplication id could not be checked across all shards; drop one of them', p_at
            USING ERRCODE = '22023';
    END IF;
    IF p_ordering_key IS NOT NULL AND p_group IS NOT NULL THEN
        RAISE EXCEPTION '%a job cannot have both an ordering key and a group: a key already runs its jobs one at a time in order, and both would choose the shard; drop one of them (a group of a key''s jobs is their key)', p_at
            USING ERRCODE = '22023';
    END IF;
    IF p_group = '' THEN
        RAISE EXCEPTION '%group is empty', p_at USING ERRCODE = '22023',
            HINT = 'give a group name, or NULL for none';
    END IF;
    IF attempts < 1 OR attempts > max_attempts_limit THEN
        RAISE EXCEPTION '%max_attempts is %; it must be at least 1 and at most %', p_at, attempts, max_attempts_limit
            USING ERRCODE = '22023';
    END IF;

    -- The epoch first (SQ004 before SQ001), with the map's lock.
    PERFORM shardq_check_route(p_epoch, VARIADIC ARRAY[]::int[]);
    SELECT e.epoch, e.shard_count INTO map_epoch, map_count FROM shardq_map_epochs e
        ORDER BY e.epoch DESC LIMIT 1;
    SELECT m.shard_index INTO map_index FROM shardq_shard_map m;
    IF routing IS NULL THEN
        -- A uniformly random key among this shard's ranges: the pick-th of
        -- its keys, counting range by range.
        SELECT sum(r.end_key - r.first_key) INTO keys_held FROM shardq_map_ranges r
            WHERE r.epoch = map_epoch AND r.shard_index = map_index;
        IF keys_held IS NULL THEN
            RAISE EXCEPTION '%this shard holds no shard keys at map epoch %; enqueue on another shard',
                p_at, map_epoch USING ERRCODE = 'SQ001', DETAIL = format('epoch=%s', map_epoch);
        END IF;
        SELECT t.first_key + (t.pick - t.before)::int INTO k FROM (
            SELECT r.first_key, r.end_key, p.pick,
                   sum(r.end_key - r.first_key) OVER (ORDER BY r.first_key)
                       - (r.end_key - r.first_key) AS before
            FROM shardq_map_ranges r, (SELECT floor(random() * keys_held)::int AS pick) p
            WHERE r.epoch = map_epoch AND r.shard_index = map_index) t
        WHERE t.pick >= t.before AND t.pick < t.before + (t.end_key - t.first_key);
    ELSE
        k := shardq_shard_key(routing);
        SELECT r.shard_index INTO k_index FROM shardq_map_ranges r
            WHERE r.epoch = map_epoch AND r.first_key <= k AND k < r.end_key;
        IF k_index IS DISTINCT FROM map_index THEN
            RAISE EXCEPTION '%the job''s % routes to shard_key %, which is on shard % of %, not on this shard (%); nothing was written',
                p_at, CASE WHEN p_ordering_key IS NOT NULL THEN 'ordering key'
                           WHEN p_group IS NOT NULL THEN 'group' ELSE 'deduplication id' END,
                k, k_index, map_count, map_index
                USING ERRCODE = 'SQ001',
                      DETAIL = format('shard_key=%s shard_index=%s shard_count=%s epoch=%s',
                                      k, k_index, map_count, map_epoch),
                      HINT = format('enqueue it on shard %s (shardq_route names a key''s shard); '
                                    'this call wrote nothing, so sending it there writes it once',
                                    k_index);
        END IF;
    END IF;

    status := CASE WHEN run_at > now() THEN 'scheduled' ELSE 'queued' END;
    IF p_dedup_id IS NULL THEN
        INSERT INTO workflow_status AS w
            (shard_key, queue, handler, ordering_key, priority, payload, status, run_at, max_attempts,
             job_group)
        VALUES (k, p_queue, p_handler, p_ordering_key, COALESCE(p_priority, 0), payload, status,
                run_at, attempts, p_group)
        RETURNING w.id INTO new_id;
    ELSE
        FOR attempt IN 1..dedup_tries LOOP
            INSERT INTO workflow_status AS w
                (shard_key, queue, handler, ordering_key, priority, payload, status, run_at,
                 max_attempts, dedup_id, job_group)
            VALUES (k, p_queue, p_handler, NULL, COALESCE(p_priority, 0), payload, status,
                    run_at, attempts, p_dedup_id, p_group)
            ON CONFLICT DO NOTHING
            RETURNING w.id INTO new_id;
            EXIT WHEN new_id IS NOT NULL;
            RETURN QUERY SELECT w.shard_key || '-' || w.id, w.shard_key, w.id, false
                FROM workflow_status w
                WHERE w.queue = p_queue AND w.dedup_id = p_dedup_id
                  AND w.status IN ('scheduled', 'queued', 'running', 'held');
            IF FOUND THEN
                RETURN;
            END IF;
        END LOOP;
        IF new_id IS NULL THEN
            RAISE EXCEPTION '%deduplication id `%` kept changing hands; try again', p_at, p_dedup_id
                USING ERRCODE = 'SQ003';
        END IF;
    END IF;
    IF status = 'queued' THEN
        PERFORM pg_notify('shardq_ready', p_queue);
    END IF;
    RETURN QUERY SELECT k || '-' || new_id, k, new_id, true;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_ensure_floors(p_queues text[], p_priorities integer[])
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
            INSERT INTO public.shardq_ready_levels (queue, priority)
            SELECT q, p FROM unnest(p_queues, p_priorities) AS t(q, p)
            ON CONFLICT DO NOTHING;
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_get_event(p_shard_key integer, p_workflow_id bigint, p_key text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    event_value jsonb;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workflow_status w
            WHERE w.shard_key = p_shard_key AND w.id = p_workflow_id
              AND NOT (w.status = 'held' AND w.held_status = 'running')) THEN
        PERFORM shardq_check_route(NULL, p_shard_key);
        RAISE EXCEPTION 'no workflow %-% on this shard', p_shard_key, p_workflow_id
            USING ERRCODE = 'SQ006',
                  HINT = 'check the id (`shardq job show`); while `shardq reshard` moves its '
                         'range, a running workflow stays on the shard that held it before';
    END IF;
    SELECT e.value INTO event_value FROM workflow_events e
        WHERE e.shard_key = p_shard_key AND e.workflow_id = p_workflow_id AND e.key = p_key;
    RETURN event_value;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_group_buckets_of(p_queue text, p_groups text[])
 RETURNS TABLE(job_group text, take_seq bigint, tokens double precision, tokens_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
    RETURN QUERY
    SELECT l.g, b.take_seq, b.tokens, b.tokens_at
    FROM unnest(p_groups) AS l(g)
    CROSS JOIN LATERAL (
        SELECT x.take_seq, x.tokens, x.tokens_at FROM shardq_group_buckets x
        WHERE x.queue = p_queue AND x.job_group = l.g
        ORDER BY x.take_seq DESC LIMIT 1) b;
END
$function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_group_buckets_write(p_queue text, p_groups text[], p_read_seqs bigint[], p_tokens double precision[], p_at timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
    INSERT INTO shardq_group_buckets (queue, job_group, take_seq, tokens, tokens_at)
    SELECT p_queue, w.g, nextval('shardq_group_bucket_seq'), w.tokens, p_at
    FROM unnest(p_groups, p_tokens) AS w(g, tokens);
    DELETE FROM shardq_group_buckets b WHERE b.ctid = ANY (ARRAY(
        SELECT (SELECT x.ctid FROM shardq_group_buckets x
                WHERE x.queue = p_queue AND x.job_group = r.g AND x.take_seq = r.seq)
        FROM unnest(p_groups, p_read_seqs) AS r(g, seq)
        WHERE r.seq IS NOT NULL));
END
$function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_group_floor(p_queue text)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        DECLARE
            floor_now bigint;
        BEGIN
            SELECT g.floor_turn INTO floor_now FROM public.shardq_group_rounds g
            WHERE g.queue = p_queue;
            IF NOT FOUND THEN
                IF pg_try_advisory_xact_lock(
                        hashtextextended('shardq_group_rounds' || chr(31) || p_queue, 8)) THEN
                    INSERT INTO public.shardq_group_queues (queue) VALUES (p_queue)
                    ON CONFLICT DO NOTHING;
                END IF;
                RETURN 0;
            END IF;
            RETURN floor_now;
        END
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_group_heads(p_queue text, p_from integer, p_below bigint, p_max integer, OUT names text[], OUT heads tid[])
 RETURNS record
 LANGUAGE plpgsql
 STABLE
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    from_turn bigint := coalesce((SELECT r.floor_turn FROM shardq_group_rounds r
                                  WHERE r.queue = p_queue), 0);
BEGIN
    WITH RECURSIVE walk(h, g, head, n) AS (
        (SELECT hashtext(w.job_group), w.job_group, w.ctid, 1 FROM workflow_status w
         WHERE w.queue = p_queue AND w.status >= 'queued' AND w.status <= 'queued'
           AND w.job_group IS NOT NULL
           AND hashtext(w.job_group) >= p_from AND hashtext(w.job_group) < p_below
           AND w.turn >= from_turn
         ORDER BY hashtext(w.job_group), w.job_group, w.priority, w.turn, w.id LIMIT 1)
        UNION ALL
        SELECT x.h, x.g, x.head, v.n + 1 FROM walk v CROSS JOIN LATERAL (
            SELECT hashtext(w.job_group) AS h, w.job_group AS g, w.ctid AS head
            FROM workflow_status w
            WHERE w.queue = p_queue AND w.status >= 'queued' AND w.status <= 'queued'
              AND w.job_group IS NOT NULL
              AND (hashtext(w.job_group), w.job_group) > (v.h, v.g)
              AND hashtext(w.job_group) < p_below
              AND w.turn >= from_turn
            ORDER BY hashtext(w.job_group), w.job_group, w.priority, w.turn, w.id LIMIT 1) x
        WHERE v.n < p_max
    )
    SELECT coalesce(array_agg(g ORDER BY n), '{}'), coalesce(array_agg(head ORDER BY n), '{}')
    INTO names, heads
    FROM walk;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_group_round_of(p_queue text, OUT round bigint, OUT floor_turn bigint, OUT noted_round bigint, OUT move_seq bigint)
 RETURNS record
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            SELECT r.round, r.floor_turn, r.noted_round, r.move_seq
            INTO round, floor_turn, noted_round, move_seq
            FROM public.shardq_group_round_moves r
            WHERE r.queue = p_queue
            ORDER BY r.move_seq DESC LIMIT 1;
        END
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_grouped_ready_turn(p_queue text)
 RETURNS bigint
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    grouped_floor bigint;
    first_turn bigint;
BEGIN
    grouped_floor := coalesce((SELECT r.floor_turn FROM shardq_group_rounds r
                               WHERE r.queue = p_queue), 0);
    first_turn := (SELECT w.turn FROM workflow_status w
                   WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                     AND w.turn >= grouped_floor
                   ORDER BY w.turn LIMIT 1);
    IF first_turn IS NULL AND EXISTS (
            SELECT 1 FROM workflow_status w
            WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
              AND w.turn IS NULL) THEN
        first_turn := grouped_floor;
    END IF;
    PERFORM set_config('shardq.grouped_from_queue', p_queue, true);
    PERFORM set_config('shardq.grouped_from_turn', coalesce(first_turn::text, ''), true);
    RETURN first_turn;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_hold_moving()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    piece_state text;
    first_id bigint;
    current_epoch int;
BEGIN
    IF NEW.status = 'held' THEN
        RETURN NEW;
    END IF;
    -- (maintenance_class(), MAP_SLOT) and (maintenance_class(), MOVE_SLOT):
    -- src/store/locks.rs.
    PERFORM pg_advisory_xact_lock_shared(-1457378061, 3);
    SELECT max(e.epoch) INTO current_epoch FROM shardq_map_epochs e;
    SELECT m.state, m.ids_from INTO piece_state, first_id FROM shardq_map_moves m
        WHERE m.epoch = current_epoch
          AND m.to_index = (SELECT s.shard_index FROM shardq_shard_map s)
          AND m.first_key <= NEW.shard_key AND NEW.shard_key < m.end_key;
    IF piece_state IS NULL OR piece_state = 'released' THEN
        RETURN NEW;
    END IF;
    -- An id taken before this shard's ids were raised for the move (a
    -- client reserves ids, then inserts): it would sort before the jobs
    -- copied from the old shard. The client takes new ids and routes again.
    IF NEW.id < first_id THEN
        RAISE EXCEPTION 'job id % was taken before shard_key % began moving to this shard; '
            'nothing was written', NEW.id, NEW.shard_key
            USING ERRCODE = 'SQ004',
                  DETAIL = format('epoch=%s', current_epoch),
                  HINT = 'take new ids (shardq_reserve_ids) and enqueue again';
    END IF;
    IF piece_state = 'closed' THEN
        PERFORM pg_advisory_xact_lock_shared(-1457378061, 4);
        SELECT m.state INTO piece_state FROM shardq_map_moves m
            WHERE m.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
              AND m.first_key <= NEW.shard_key AND NEW.shard_key < m.end_key;
    END IF;
    -- A snapshot taken before the map's last change (REPEATABLE READ,
    -- SERIALIZABLE) reads the range's state as it was: an opened range as
    -- closed, a released one as moving (written held, the job would stay
    -- held for good). Under READ COMMITTED each statement here reads after
    -- the locks above, so this never refuses there.
    PERFORM shardq_refuse_stale_snapshot();
    IF piece_state = 'closed' THEN
        RAISE EXCEPTION 'shard_key % is in a range moving to this shard, and the move stopped '
            'before it opened the range; nothing was written', NEW.shard_key
            USING ERRCODE = 'SQ005',
                  HINT = 'run `shardq reshard` again to finish the move, then retry';
    END IF;
    NEW.held_status := NEW.status;
    NEW.status := 'held';
    RETURN NEW;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_hold_workflow(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint)
 RETURNS TABLE(owned boolean, cancel_requested boolean)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
BEGIN
    RETURN QUERY
    SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence AND w.status = 'running',
        w.cancel_requested
    FROM workflow_status w WHERE w.shard_key = p_shard_key AND w.id = p_id FOR UPDATE;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_key_floor_lower()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
        BEGIN
            INSERT INTO public.shardq_key_floors AS f (queue, ordering_key, floor_id)
            VALUES (NEW.queue, NEW.ordering_key, 0)
            ON CONFLICT (queue, ordering_key) DO UPDATE
                SET floor_id = least(f.floor_id, NEW.id),
                    set_at = pg_catalog.now();
            RETURN NULL;
        END
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_key_jobs_from(p_key text, p_status text, p_id bigint, p_want text, p_from bigint)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT (p_status, p_id) >= (p_want, p_from) AND p_status <= p_want
             AND p_status IN ('waiting', 'queued', 'running', 'scheduled')
             AND hashtext(p_key) IS NOT NULL $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_key_lock(p_queue text, p_key text)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT hashtextextended(p_queue || chr(31) || p_key, 7) $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_lease_permits(holder text, queues text[], wants integer[], lease_ms integer)
 RETURNS TABLE(queue text, concurrency integer, granted integer, rate_count integer, rate_period_ms integer)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    i integer;
    q text;
    lim shardq_queue_limits%ROWTYPE;
    other record;
    own_known boolean;
    own_seq bigint;
    l_seq bigint;
    l_permits integer;
    l_expires timestamptz;
    others integer;
    give integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(queues, 1), 0) LOOP
        q := queues[i];
        lim := NULL;
        SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = q FOR UPDATE;
        queue := q;
        rate_count := lim.rate_count;
        rate_period_ms := lim.rate_period_ms;
        concurrency := lim.concurrency;
        -- Every holder's newest lease row; lapsed ones go with their holder.
        others := 0;
        own_known := false;
        own_seq := NULL;
        FOR other IN SELECT h.holder FROM shardq_limit_holders h WHERE h.queue = q LOOP
            SELECT e.renewal_seq, e.permits, e.expires_at INTO l_seq, l_permits, l_expires
                FROM shardq_limit_lease_moves e
                WHERE e.queue = q AND e.holder = other.holder
                ORDER BY e.renewal_seq DESC LIMIT 1;
            IF other.holder = shardq_lease_permits.holder AND lim.concurrency IS NOT NULL THEN
                own_known := true;
                own_seq := l_seq;
            ELSIF other.holder = shardq_lease_permits.holder OR l_seq IS NULL
                  OR l_expires <= now() THEN
                DELETE FROM shardq_limit_lease_moves e
                    WHERE e.queue = q AND e.holder = other.holder AND e.renewal_seq = l_seq;
                DELETE FROM shardq_limit_holders h
                    WHERE h.queue = q AND h.holder = other.holder;
            ELSE
                others := others + l_permits;
            END IF;
        END LOOP;
        IF lim.concurrency IS NULL THEN
            granted := wants[i];
            RETURN NEXT;
            CONTINUE;
        END IF;
        give := greatest(0, least(wants[i], lim.concurrency - others));
        IF NOT own_known THEN
            INSERT INTO shardq_limit_holders (queue, holder)
                VALUES (q, shardq_lease_permits.holder);
        END IF;
        INSERT INTO shardq_limit_lease_moves (queue, holder, renewal_seq, permits, expires_at)
            VALUES (q, shardq_lease_permits.holder, nextval('shardq_limit_lease_seq'), give,
                    now() + lease_ms * interval '1 millisecond');
        IF own_seq IS NOT NULL THEN
            DELETE FROM shardq_limit_lease_moves e
                WHERE e.queue = q AND e.holder = shardq_lease_permits.holder
                  AND e.renewal_seq = own_seq;
        END IF;
        granted := give;
        RETURN NEXT;
    END LOOP;
END
$function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_lock_keyed_ready(p_queue text, p_limit integer)
 RETURNS tid[]
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    f record;
    tids tid[] := '{}';
BEGIN
    FOR f IN SELECT fl.priority, fl.keyed_floor_seq FROM shardq_ready_floors fl
             WHERE fl.queue = p_queue ORDER BY fl.priority LOOP
        tids := tids || ARRAY(
            SELECT t.tid FROM (
                SELECT w.ctid AS tid FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NOT NULL
                  AND w.ready_seq >= f.keyed_floor_seq
                ORDER BY w.ready_seq LIMIT p_limit - cardinality(tids)
                FOR UPDATE SKIP LOCKED) t);
        EXIT WHEN cardinality(tids) >= p_limit;
    END LOOP;
    RETURN tids;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_lock_keys(p_sk integer[], p_id bigint[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_advisory_xact_lock(l) FROM (
        SELECT DISTINCT shardq_key_lock(w.queue, w.ordering_key) AS l
        FROM unnest(p_sk, p_id) AS j(shard_key, id)
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id
        WHERE w.ordering_key IS NOT NULL
        ORDER BY 1) sorted;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_lock_plain_ready(p_queue text, p_limit integer)
 RETURNS tid[]
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    f record;
    tids tid[] := '{}';
BEGIN
    PERFORM shardq_advance_ready_floors();
    FOR f IN SELECT fl.priority, fl.floor_seq FROM shardq_ready_floors fl
             WHERE fl.queue = p_queue ORDER BY fl.priority LOOP
        tids := tids || ARRAY(
            SELECT t.tid FROM (
                SELECT w.ctid AS tid FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NULL
                  AND w.job_group IS NULL AND w.ready_seq >= f.floor_seq
                ORDER BY w.ready_seq LIMIT p_limit - cardinality(tids)
                FOR UPDATE SKIP LOCKED) t);
        EXIT WHEN cardinality(tids) >= p_limit;
    END LOOP;
    RETURN tids;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_mark_ready()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            PERFORM pg_catalog.pg_current_xact_id();
            NEW.ready_seq := pg_catalog.nextval('public.shardq_ready_seq');
            IF NOT EXISTS (SELECT 1 FROM public.shardq_ready_levels l
                           WHERE l.queue OPERATOR(pg_catalog.=) NEW.queue
                             AND l.priority OPERATOR(pg_catalog.=) NEW.priority) THEN
                PERFORM public.shardq_ensure_floors(ARRAY[NEW.queue], ARRAY[NEW.priority]);
            END IF;
            RETURN NEW;
        END
        $function$

-- EXECUTE: 
CREATE OR REPLACE FUNCTION public.shardq_move_group_rounds(p_fresh bigint, p_passed boolean)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM public.shardq_group_queues) THEN
                RETURN;                        -- no grouped claim on this shard yet
            END IF;
            -- 1 and 2 in one statement: each queue whose rounds change gets
            -- a new row, numbered by this move, and loses the one it
            -- replaces (migration 0047: no row is ever updated). One probe
            -- of the first ready turn serves both: the floor rises to at
            -- most that turn, so the first ready turn at or past the new
            -- floor is the same one.
            WITH probed AS (
                SELECT r.queue, r.move_seq, r.round, r.floor_turn, r.noted_round,
                       (SELECT w.turn FROM public.workflow_status w
                        WHERE w.queue = r.queue AND w.status = 'queued'
                          AND w.job_group IS NOT NULL AND w.turn >= r.floor_turn
                        ORDER BY w.turn LIMIT 1) AS turn
                FROM public.shardq_group_rounds r
            ), moved AS MATERIALIZED (
                SELECT p.queue, p.move_seq, p.round AS noted_round,
                       CASE WHEN p_passed AND p.noted_round IS NOT NULL
                            THEN greatest(p.floor_turn,
                                          least(p.noted_round, coalesce(p.turn, p.noted_round)))
                            ELSE p.floor_turn END AS floor_turn,
                       greatest(p.round, coalesce(p.turn, p_fresh)) AS round
                FROM probed p
                WHERE (p_passed AND p.noted_round IS NOT NULL
                       AND least(p.noted_round, coalesce(p.turn, p.noted_round)) > p.floor_turn)
                   OR p.noted_round IS DISTINCT FROM p.round
                   OR p.round < coalesce(p.turn, p_fresh)
            ), added AS (
                INSERT INTO public.shardq_group_round_moves
                    (queue, move_seq, round, floor_turn, noted_round)
                SELECT m.queue, p_fresh, m.round, m.floor_turn, m.noted_round FROM moved m
            )
            -- Each replaced row found by its key (as the floors' move does:
            -- a join walked every row a hold keeps).
            DELETE FROM public.shardq_group_round_moves d
            WHERE d.ctid = ANY (ARRAY(
                SELECT (SELECT o.ctid FROM public.shardq_group_round_moves o
                        WHERE o.queue = m.queue AND o.move_seq = m.move_seq)
                FROM moved m));
            IF NOT EXISTS (
                    SELECT 1 FROM public.shardq_group_queues q
                    CROSS JOIN LATERAL (
                        SELECT 1 FROM public.workflow_status x
                        WHERE x.queue = q.queue AND x.status = 'queued'
                          AND x.job_group IS NOT NULL AND x.turn IS NULL
                        LIMIT 1) u) THEN
                RETURN;
            END IF;
            UPDATE public.workflow_status w SET turn = g.round
            FROM public.shardq_group_rounds g
            WHERE w.queue = g.queue AND w.ctid = ANY (ARRAY(
                SELECT u.ctid FROM public.shardq_group_queues q
                CROSS JOIN LATERAL (
                    SELECT x.ctid FROM public.workflow_status x
                    WHERE x.queue = q.queue AND x.status = 'queued'
                      AND x.job_group IS NOT NULL AND x.turn IS NULL
                    FOR UPDATE OF x SKIP LOCKED) u));
        END
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_owe_cascades(p_keys integer[], p_ids bigint[])
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
            WITH written AS (
                INSERT INTO public.shardq_cascades_owed AS o (shard_key, id, generation, due_at)
                SELECT t.k, t.i, nextval('public.shardq_cascades_owed_generation'),
                       now() + interval '10 seconds'
                FROM unnest(p_keys, p_ids) AS t(k, i)
                ON CONFLICT (shard_key, id) DO UPDATE
                    SET generation = EXCLUDED.generation,
                        due_at = least(o.due_at, EXCLUDED.due_at)
                RETURNING generation)
            SELECT coalesce(max(generation), 0) FROM written;
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_owns_key(p_shard_key integer)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(-1457378061, 3);
    RETURN EXISTS (SELECT 1 FROM shardq_map_ranges r
            WHERE r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
              AND r.shard_index = (SELECT m.shard_index FROM shardq_shard_map m)
              AND r.first_key <= p_shard_key AND p_shard_key < r.end_key)
        AND NOT EXISTS (SELECT 1 FROM shardq_map_moves v
            WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
              AND v.state = 'closed' AND v.first_key <= p_shard_key
              AND p_shard_key < v.end_key);
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_permits_in_use()
 RETURNS TABLE(queue text, permits bigint, holders bigint)
 LANGUAGE plpgsql
 STABLE
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
    RETURN QUERY
    SELECT h.queue, coalesce(sum(e.permits), 0)::int8,
           count(*) FILTER (WHERE e.permits > 0)
    FROM shardq_limit_holders h
    CROSS JOIN LATERAL (
        SELECT m.permits, m.expires_at FROM shardq_limit_lease_moves m
        WHERE m.queue = h.queue AND m.holder = h.holder
        ORDER BY m.renewal_seq DESC LIMIT 1) e
    WHERE e.expires_at > now()
    GROUP BY h.queue;
END
$function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_promote_keys(p_sk integer[], p_id bigint[])
 RETURNS integer
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    promoted integer;
    mv_queue text[]; mv_key text[]; mv_floor bigint[]; mv_xmin xid[];  -- floors to move
    every_setting text := current_setting('shardq.key_floor_every', true);
    every float8 := CASE
        WHEN current_setting('transaction_isolation') <> 'read committed' THEN 'infinity'
        WHEN every_setting ~ '^[1-9][0-9]{0,8}$' THEN every_setting::float8
        ELSE 8 END;
BEGIN
    WITH keys AS (
        SELECT DISTINCT w.queue, w.ordering_key
        FROM unnest(p_sk, p_id) AS j(shard_key, id)
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id
        WHERE w.ordering_key IS NOT NULL
    ), bounded AS MATERIALIZED (
        -- Each floor probed by its key (a scalar subquery): joined, a plan
        -- made while the floors were few read them all, every key's row
        -- and its versions.
        SELECT k.queue, k.ordering_key, coalesce(
            (SELECT f.floor_id FROM shardq_key_floors f
             WHERE f.queue = k.queue AND f.ordering_key = k.ordering_key), 0) AS floor_id
        FROM keys k
    ), released AS (
        -- One status per probe (shardq_key_jobs_from): each walks its
        -- key's entries of that status from the floor on. Scalar
        -- subqueries, not NOT EXISTS: the planner turned those into anti
        -- joins whose inner scan walked every running job of the index.
        SELECT k.queue, k.ordering_key, k.floor_id FROM bounded k
        WHERE (SELECT 1 FROM workflow_status a
               WHERE a.queue = k.queue AND a.ordering_key = k.ordering_key
                 AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'running', k.floor_id)
               LIMIT 1) IS NULL
          AND (SELECT 1 FROM workflow_status a
               WHERE a.queue = k.queue AND a.ordering_key = k.ordering_key
                 AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'scheduled', k.floor_id)
               LIMIT 1) IS NULL
          AND (SELECT 1 FROM workflow_status a
               WHERE a.queue = k.queue AND a.ordering_key = k.ordering_key
                 AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'queued', k.floor_id)
               LIMIT 1) IS NULL
    ), heads AS (
        SELECT n.shard_key, n.id FROM released k CROSS JOIN LATERAL (
            SELECT w.shard_key, w.id FROM workflow_status w
            WHERE w.queue = k.queue AND w.ordering_key = k.ordering_key
              AND shardq_key_jobs_from(w.ordering_key, w.status, w.id, 'waiting', k.floor_id)
            ORDER BY w.status, w.id LIMIT 1) n
    )
    UPDATE workflow_status w SET status = 'queued'
    FROM heads h
    WHERE w.shard_key = h.shard_key AND w.id = h.id AND w.status = 'waiting';
    GET DIAGNOSTICS promoted = ROW_COUNT;

    -- Move the floors of some of these keys up (a statement of its own: it
    -- sees the job just queued), then write them one key at a time (an
    -- update or insert by the whole key stays on its index).
    WITH keys AS MATERIALIZED (
        SELECT w.queue, w.ordering_key, max(w.id) AS last_id
        FROM unnest(p_sk, p_id) AS j(shard_key, id)
        JOIN workflow_status w ON w.shard_key = j.shard_key AND w.id = j.id
        WHERE w.ordering_key IS NOT NULL
        GROUP BY w.queue, w.ordering_key
        HAVING random() * every < 1
    ), bounded AS MATERIALIZED (
        SELECT k.queue, k.ordering_key, k.last_id, coalesce(f.floor_id, 0) AS floor_id,
               f.row_xmin
        FROM keys k LEFT JOIN LATERAL (
            SELECT r.floor_id, r.xmin AS row_xmin FROM shardq_key_floors r
            WHERE r.queue = k.queue AND r.ordering_key = k.ordering_key
            LIMIT 1) f ON true
    ), moved AS (
        SELECT b.queue, b.ordering_key, b.row_xmin, b.floor_id AS was,
            least(
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'running', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'scheduled', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'queued', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                (SELECT a.id FROM workflow_status a
                 WHERE a.queue = b.queue AND a.ordering_key = b.ordering_key
                   AND shardq_key_jobs_from(a.ordering_key, a.status, a.id, 'waiting', b.floor_id)
                 ORDER BY a.status, a.id LIMIT 1),
                b.last_id + 1) AS floor_id
        FROM bounded b
    )
    SELECT coalesce(array_agg(m.queue), '{}'), coalesce(array_agg(m.ordering_key), '{}'),
           coalesce(array_agg(m.floor_id), '{}'), coalesce(array_agg(m.row_xmin), '{}')
    INTO mv_queue, mv_key, mv_floor, mv_xmin
    FROM moved m WHERE m.floor_id > m.was;
    FOR i IN 1 .. cardinality(mv_key) LOOP
        IF mv_xmin[i] IS NULL THEN
            INSERT INTO shardq_key_floors (queue, ordering_key, floor_id)
            VALUES (mv_queue[i], mv_key[i], mv_floor[i])
            ON CONFLICT DO NOTHING;
        ELSE
            UPDATE shardq_key_floors f SET floor_id = mv_floor[i], set_at = now()
            WHERE f.queue = mv_queue[i] AND f.ordering_key = mv_key[i]
              AND f.xmin = mv_xmin[i];
        END IF;
    END LOOP;
    RETURN promoted;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_queue_has_ready(p_queue text, p_plain boolean DEFAULT true, p_keyed boolean DEFAULT true, p_grouped boolean DEFAULT true, p_taking tid[] DEFAULT '{}'::tid[])
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    f record;
    grouped_floor bigint;
BEGIN
    IF p_grouped THEN
        grouped_floor := coalesce((SELECT r.floor_turn FROM shardq_group_rounds r
                                   WHERE r.queue = p_queue), 0);
        IF EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                  AND w.turn >= grouped_floor AND w.ctid <> ALL (p_taking))
           OR EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.status = 'queued' AND w.job_group IS NOT NULL
                  AND w.turn IS NULL AND w.ctid <> ALL (p_taking)) THEN
            RETURN true;
        END IF;
    END IF;
    -- A loop, each probe with its floor as a value: as one statement
    -- (floors semi-joined to the jobs, with hash joins off) the planner may
    -- read the jobs first, from the start of the index.
    IF NOT (p_plain OR p_keyed) THEN
        RETURN false;
    END IF;
    FOR f IN SELECT fl.priority, fl.floor_seq, fl.keyed_floor_seq
             FROM shardq_ready_floors fl WHERE fl.queue = p_queue LOOP
        IF p_keyed AND EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NOT NULL
                  AND w.ready_seq >= f.keyed_floor_seq
                  AND w.ctid <> ALL (p_taking)) THEN
            RETURN true;
        END IF;
        IF p_plain AND EXISTS (
                SELECT 1 FROM workflow_status w
                WHERE w.queue = p_queue AND w.priority = f.priority
                  AND w.status = 'queued' AND w.ordering_key IS NULL
                  AND w.job_group IS NULL AND w.ready_seq >= f.floor_seq
                  AND w.ctid <> ALL (p_taking)) THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_ready_floor_of(p_queue text, p_priority integer, OUT floor_seq bigint, OUT keyed_floor_seq bigint, OUT move_seq bigint)
 RETURNS record
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            SELECT f.floor_seq, f.keyed_floor_seq, f.move_seq
            INTO floor_seq, keyed_floor_seq, move_seq
            FROM public.shardq_ready_floor_moves f
            WHERE f.queue = p_queue AND f.priority = p_priority
            ORDER BY f.move_seq DESC LIMIT 1;
        END
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_recv(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint, p_name text, p_topic text, p_micros bigint)
 RETURNS TABLE(owned boolean, cancel_requested boolean, output jsonb, wait_recorded bigint, parked bigint)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    held record;
BEGIN
    SELECT * INTO held FROM shardq_hold_workflow(p_shard_key, p_id, p_owner, p_fence);
    IF held.cancel_requested IS TRUE OR held.owned IS NOT TRUE THEN
        RETURN QUERY SELECT coalesce(held.owned, false), coalesce(held.cancel_requested, false),
            NULL::jsonb, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, false, t.output, t.wait_recorded, t.parked
        FROM shardq_recv_take(p_shard_key, p_id, p_name, p_topic, p_micros) t;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_recv_take(p_shard_key integer, p_id bigint, p_name text, p_topic text, p_micros bigint)
 RETURNS TABLE(output jsonb, wait_recorded bigint, parked bigint)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH recorded AS MATERIALIZED (
        SELECT s.output FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name
    ), waited AS MATERIALIZED (
        SELECT s.output FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id
            AND s.step_name = p_name || ':wait'
    ), pending AS MATERIALIZED (
        SELECT coalesce((SELECT w.output FROM waited w), jsonb_build_object('topic', p_topic,
            'deadline', statement_timestamp() + p_micros * interval '1 microsecond')) AS wait
        WHERE NOT EXISTS (SELECT 1 FROM recorded)
    ), oldest AS MATERIALIZED (
        SELECT m.seq FROM workflow_messages m
        WHERE m.shard_key = p_shard_key AND m.workflow_id = p_id AND m.topic = p_topic
            AND m.received_by_step IS NULL AND EXISTS (SELECT 1 FROM pending)
        ORDER BY m.seq LIMIT 1
    ), taken AS MATERIALIZED (
        UPDATE workflow_messages m SET received_by_step = p_name FROM oldest o
        WHERE m.shard_key = p_shard_key AND m.workflow_id = p_id AND m.seq = o.seq
        RETURNING m.seq, m.message
    ), decided AS MATERIALIZED (
        SELECT CASE
            WHEN t.seq IS NOT NULL THEN
                jsonb_build_object('topic', p_topic, 'message', t.message, 'seq', t.seq)
            WHEN (p.wait->>'deadline')::timestamptz <= clock_timestamp() THEN
                jsonb_build_object('topic', p_topic, 'timed_out', true)
            END AS output, p.wait
        FROM pending p LEFT JOIN taken t ON true
    ), written AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, d.output FROM decided d WHERE d.output IS NOT NULL
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING workflow_steps.output
    ), waiting AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name || ':wait', d.wait FROM decided d
        WHERE d.output IS NULL AND NOT EXISTS (SELECT 1 FROM waited)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING workflow_steps.output
    ), park AS MATERIALIZED (
        UPDATE workflow_status w SET run_at = (d.wait->>'deadline')::timestamptz
        FROM decided d
        WHERE w.shard_key = p_shard_key AND w.id = p_id AND d.output IS NULL
        RETURNING 1
    )
    SELECT coalesce((SELECT r.output FROM recorded r), (SELECT x.output FROM written x),
            (SELECT d.wait FROM decided d)),
        (SELECT count(*) FROM waiting), (SELECT count(*) FROM park);
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_refuse_old_limits_write()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'shardq: % no longer keeps the permit leases or the '
        'rate buckets (migration 48); call again', TG_TABLE_NAME
        USING ERRCODE = '40001';
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_refuse_stale_snapshot()
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        RETURN;
    END IF;
    IF NOT pg_visible_in_snapshot(
            (SELECT c.last_value FROM shardq_map_change_xid c)::text::xid8,
            pg_current_snapshot()) THEN
        RAISE EXCEPTION 'the shard map changed after this transaction''s snapshot was taken; '
            'nothing was written'
            USING ERRCODE = '40001',
                  HINT = 'run the transaction again';
    END IF;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_reserve_ids(p_n integer)
 RETURNS bigint[]
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
        BEGIN
            RETURN ARRAY(SELECT pg_catalog.nextval('public.workflow_status_id_seq'::pg_catalog.regclass)
                         FROM pg_catalog.generate_series(1, p_n));
        END
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_route(p_routing_key text)
 RETURNS TABLE(shard_key integer, shard_index integer, shard_count integer, epoch integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    k int;
    current_epoch int;
    n int;
BEGIN
    SELECT e.epoch, e.shard_count INTO current_epoch, n FROM shardq_map_epochs e
        ORDER BY e.epoch DESC LIMIT 1;
    IF current_epoch IS NULL THEN
        RAISE EXCEPTION 'this shard records no shard map'
            USING ERRCODE = 'SQ002',
                  HINT = 'run `shardq migrate` with the full shard list first';
    END IF;
    k := CASE WHEN p_routing_key IS NULL THEN floor(random() * 65536)::int
              ELSE shardq_shard_key(p_routing_key) END;
    RETURN QUERY SELECT k, r.shard_index, n, current_epoch FROM shardq_map_ranges r
        WHERE r.epoch = current_epoch AND r.first_key <= k AND k < r.end_key;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_send(p_shard_key integer, p_workflow_id bigint, p_topic text, p_message jsonb, p_idempotency_key text DEFAULT NULL::text)
 RETURNS TABLE(written boolean, woken boolean)
 LANGUAGE plpgsql
AS $function$
DECLARE
    -- The Rust client's limits (src/job.rs: MAX_QUEUE_BYTES, MAX_DEDUP_ID_BYTES).
    max_topic_bytes constant int := 255;
    max_key_bytes constant int := 1024;
    -- limits.max_payload_bytes by default.
    default_payload_bytes constant int := 1048576;
    max_payload int := COALESCE(NULLIF(current_setting('shardq.max_payload_bytes', true), '')::int,
                                default_payload_bytes);
    size int;
    sent record;
BEGIN
    IF p_topic IS NULL OR p_topic = '' THEN
        RAISE EXCEPTION 'topic name is empty' USING ERRCODE = '22023',
            HINT = 'give the topic the workflow''s recv waits on';
    END IF;
    IF octet_length(p_topic) > max_topic_bytes THEN
        RAISE EXCEPTION 'topic is % bytes, over the limit of % bytes; shorten it',
            octet_length(p_topic), max_topic_bytes USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_idempotency_key) > max_key_bytes THEN
        RAISE EXCEPTION 'idempotency key is % bytes, over the limit of % bytes; shorten it (a long key can be hashed)',
            octet_length(p_idempotency_key), max_key_bytes USING ERRCODE = '22023';
    END IF;
    IF p_message IS NULL THEN
        RAISE EXCEPTION 'message is NULL' USING ERRCODE = '22023',
            HINT = 'send a JSON value (the JSON null is ''null''::jsonb)';
    END IF;
    size := octet_length(p_message::text);
    IF size > max_payload THEN
        RAISE EXCEPTION 'message is % bytes, over limits.max_payload_bytes = %', size, max_payload
            USING ERRCODE = '22023',
                  HINT = 'send a smaller message (or a reference to the data), or raise the '
                         'limit with ALTER DATABASE ... SET shardq.max_payload_bytes';
    END IF;
    SELECT * INTO sent FROM shardq_send_row(p_shard_key, p_workflow_id, p_topic, p_message,
                                            p_idempotency_key);
    IF sent.status IS NULL THEN
        -- SQ001 naming the key's shard when it is not this one.
        PERFORM shardq_check_route(NULL, p_shard_key);
        RAISE EXCEPTION 'no workflow %-% on this shard; nothing was written', p_shard_key, p_workflow_id
            USING ERRCODE = 'SQ006',
                  HINT = 'check the id (`shardq job show`); while `shardq reshard` moves its '
                         'range, a running workflow stays on the shard that held it before';
    END IF;
    IF sent.status NOT IN ('waiting', 'scheduled', 'queued', 'running')
       AND p_idempotency_key IS NOT NULL
       AND EXISTS (SELECT 1 FROM workflow_messages m
                   WHERE m.shard_key = p_shard_key AND m.workflow_id = p_workflow_id
                     AND m.idempotency_key = p_idempotency_key) THEN
        RETURN QUERY SELECT false, false;
        RETURN;
    END IF;
    IF sent.status NOT IN ('waiting', 'scheduled', 'queued', 'running') THEN
        RAISE EXCEPTION 'workflow %-% is %, it takes no messages; nothing was written',
            p_shard_key, p_workflow_id, sent.status
            USING ERRCODE = 'SQ007',
                  DETAIL = format('status=%s', sent.status),
                  HINT = CASE WHEN sent.status = 'held'
                              THEN 'it is moving between shards: send again after the move'
                              ELSE 'a finished workflow receives nothing' END;
    END IF;
    RETURN QUERY SELECT sent.written, sent.woken;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_send_row(p_shard_key integer, p_workflow_id bigint, p_topic text, p_message jsonb, p_idempotency_key text)
 RETURNS TABLE(status text, written boolean, woken boolean)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    found_status text;
    was_written boolean;
    woken_status text;
    woken_queue text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'shardq_send needs READ COMMITTED, this transaction is %; nothing was written',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = '25000',
                  HINT = 'call it on its own or in a READ COMMITTED transaction: under a '
                         'transaction snapshot it could miss a recv waiting for the message '
                         'and leave the workflow asleep until its timeout';
    END IF;
    SELECT w.status INTO found_status FROM workflow_status w
        WHERE w.shard_key = p_shard_key AND w.id = p_workflow_id
          AND NOT (w.status = 'held' AND w.held_status = 'running')
        FOR NO KEY UPDATE;
    IF found_status IS NULL OR found_status NOT IN ('waiting', 'scheduled', 'queued', 'running') THEN
        RETURN QUERY SELECT found_status, false, false;
        RETURN;
    END IF;
    -- The status read under the lock cannot change before commit: the
    -- message goes in without looking again.
    WITH inserted AS MATERIALIZED (
        INSERT INTO workflow_messages (shard_key, workflow_id, topic, message, idempotency_key)
        VALUES (p_shard_key, p_workflow_id, p_topic, p_message, p_idempotency_key)
        ON CONFLICT (shard_key, workflow_id, idempotency_key)
            WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING seq
    ), waiting AS MATERIALIZED (
        SELECT 1 FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_workflow_id
            AND s.step_name LIKE 'shardq:recv:%:wait'
            AND s.output->>'topic' = p_topic AND EXISTS (SELECT 1 FROM inserted)
            AND NOT EXISTS (SELECT 1 FROM workflow_steps d
                WHERE d.shard_key = p_shard_key AND d.workflow_id = p_workflow_id
                    AND d.step_name = left(s.step_name, -length(':wait')))
        LIMIT 1
    ), woken AS MATERIALIZED (
        UPDATE workflow_status w SET run_at = now(),
            status = CASE WHEN w.status = 'scheduled' AND (w.ordering_key IS NULL
                    OR pg_try_advisory_xact_lock(shardq_key_lock(w.queue, w.ordering_key)))
                THEN 'queued' ELSE w.status END
        WHERE w.shard_key = p_shard_key AND w.id = p_workflow_id AND EXISTS (SELECT 1 FROM waiting)
            AND w.status IN ('scheduled', 'running') AND NOT w.cancel_requested
        RETURNING w.status, w.queue
    )
    SELECT EXISTS (SELECT 1 FROM inserted), k.status, k.queue
        INTO was_written, woken_status, woken_queue
        FROM (SELECT 1) AS one LEFT JOIN woken k ON true;
    IF woken_status = 'queued' THEN
        PERFORM pg_notify('shardq_ready', woken_queue);
    END IF;
    RETURN QUERY SELECT found_status, was_written, woken_status IS NOT NULL;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_shard_key(p_key text)
 RETURNS integer
 LANGUAGE plpgsql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
DECLARE
    bytes bytea := convert_to(p_key, 'UTF8');
    h int := 8997; -- 0x2325
BEGIN
    FOR i IN 0 .. length(bytes) - 1 LOOP
        h := ((h # get_byte(bytes, i)) * 435) & 65535; -- 435 = 0x01b3
    END LOOP;
    RETURN h;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_start_child(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint, p_step text, p_queue text, p_handler text, p_payload jsonb, p_ordering_key text, p_group text, p_priority integer, p_delay_ms bigint, p_max_attempts integer, p_abandon boolean)
 RETURNS TABLE(state text, child_shard_key integer, child_id bigint, child_index integer)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    owned boolean;
    cancelled boolean;
    parent_deadline timestamptz;
    recorded jsonb;
    routing text := COALESCE(p_ordering_key, p_group);
    k int := p_shard_key;
    k_index int;
    run_at timestamptz := now() + p_delay_ms * interval '1 millisecond';
    new_status text := CASE WHEN p_delay_ms > 0 THEN 'scheduled' ELSE 'queued' END;
    new_id bigint;
BEGIN
    SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence AND w.status = 'running',
            w.cancel_requested, w.deadline_at
        INTO owned, cancelled, parent_deadline
        FROM workflow_status w WHERE w.shard_key = p_shard_key AND w.id = p_id FOR SHARE;
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step;
    IF recorded IS NOT NULL THEN
        RETURN QUERY SELECT 'recorded'::text, (recorded->>'child_shard_key')::int,
            (recorded->>'child_id')::bigint, NULL::int;
        RETURN;
    END IF;
    -- A start across shards reserved this child's identity first (step
    -- `p_step:id`, shardq_child_intent): it goes on that way, wherever the
    -- child's key lives now, so the call site keeps its one child.
    SELECT s.output INTO recorded FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_step || ':id';
    IF recorded IS NOT NULL THEN
        RETURN QUERY SELECT 'other_shard'::text, (recorded->>'child_shard_key')::int,
            NULL::bigint, NULL::int;
        RETURN;
    END IF;
    IF cancelled THEN
        RETURN QUERY SELECT 'cancelled'::text, NULL::int, NULL::bigint, NULL::int;
        RETURN;
    END IF;
    IF owned IS NOT TRUE THEN
        RETURN QUERY SELECT 'not_held'::text, NULL::int, NULL::bigint, NULL::int;
        RETURN;
    END IF;
    IF routing IS NOT NULL THEN
        k := shardq_shard_key(routing);
        IF NOT shardq_owns_key(k) THEN
            SELECT r.shard_index INTO k_index FROM shardq_map_ranges r
                WHERE r.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
                    AND r.first_key <= k AND k < r.end_key;
            RETURN QUERY SELECT 'other_shard'::text, k, NULL::bigint, k_index;
            RETURN;
        END IF;
    END IF;
    INSERT INTO workflow_status AS w
        (shard_key, queue, handler, ordering_key, priority, payload, status, run_at,
         max_attempts, job_group, parent_shard_key, parent_id, abandon_on_parent_cancel,
         deadline_at)
    VALUES (k, p_queue, p_handler, p_ordering_key, p_priority, p_payload, new_status, run_at,
            p_max_attempts, p_group, p_shard_key, p_id, NULLIF(p_abandon, false),
            CASE WHEN p_abandon THEN NULL ELSE parent_deadline END)
    RETURNING w.id INTO new_id;
    INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
    VALUES (p_shard_key, p_id, p_step,
            jsonb_build_object('child_shard_key', k, 'child_id', new_id));
    IF new_status = 'queued' THEN
        PERFORM pg_notify('shardq_ready', p_queue);
    END IF;
    RETURN QUERY SELECT 'started'::text, k, new_id, NULL::int;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_step_log(p_shard_key integer, p_id bigint, p_owner text, p_fence bigint)
 RETURNS TABLE(step_name text, output jsonb, held boolean, lease_left_us bigint)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT s.step_name, s.output, w.held, w.lease_left_us
    FROM (SELECT owner IS NOT DISTINCT FROM p_owner AND fence = p_fence AND status = 'running' AS held,
                 greatest(0, extract(epoch FROM lease_expires_at - clock_timestamp())
                     * 1000000)::bigint AS lease_left_us
          FROM workflow_status WHERE shard_key = p_shard_key AND id = p_id) w
    LEFT JOIN workflow_steps s ON s.shard_key = p_shard_key AND s.workflow_id = p_id;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_step_record(p_shard_key integer, p_id bigint, p_name text, p_output jsonb, p_owner text, p_fence bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    recorded boolean;
BEGIN
    WITH owned AS MATERIALIZED (
        SELECT 1 FROM workflow_status
        WHERE shard_key = p_shard_key AND id = p_id
            AND owner = p_owner AND fence = p_fence AND NOT cancel_requested
        FOR SHARE
    ), inserted AS (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, p_output WHERE EXISTS (SELECT 1 FROM owned)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM inserted)
        OR EXISTS (SELECT 1 FROM workflow_steps
                   WHERE shard_key = p_shard_key AND workflow_id = p_id AND step_name = p_name
                     AND EXISTS (SELECT 1 FROM owned))
    INTO recorded;
    RETURN recorded;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_step_sleep(p_shard_key integer, p_id bigint, p_name text, p_owner text, p_fence bigint, p_micros bigint, p_until timestamp with time zone)
 RETURNS TABLE(wake_at timestamp with time zone, due boolean, owned boolean, parked bigint, cancelled boolean)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH recorded AS MATERIALIZED (
        SELECT (s.output->>'wake_at')::timestamptz AS wake_at FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_id AND s.step_name = p_name
    ), replay AS MATERIALIZED (
        SELECT 1 FROM recorded r WHERE r.wake_at <= clock_timestamp()
    ), seen AS MATERIALIZED (
        SELECT w.owner IS NOT DISTINCT FROM p_owner AND w.fence = p_fence
                AND w.status = 'running' AS held,
            w.cancel_requested FROM workflow_status w
        WHERE w.shard_key = p_shard_key AND w.id = p_id
    ), lock AS MATERIALIZED (
        SELECT 1 FROM workflow_status w
        WHERE w.shard_key = p_shard_key AND w.id = p_id
            AND w.owner = p_owner AND w.fence = p_fence AND NOT w.cancel_requested
            AND NOT EXISTS (SELECT 1 FROM replay)
        FOR UPDATE
    ), inserted AS MATERIALIZED (
        INSERT INTO workflow_steps (shard_key, workflow_id, step_name, output)
        SELECT p_shard_key, p_id, p_name, jsonb_build_object('wake_at',
            coalesce(p_until, now() + p_micros * interval '1 microsecond'))
        WHERE EXISTS (SELECT 1 FROM lock) AND NOT EXISTS (SELECT 1 FROM recorded)
        ON CONFLICT (shard_key, workflow_id, step_name) DO NOTHING
        RETURNING (workflow_steps.output->>'wake_at')::timestamptz AS wake_at
    ), wake AS MATERIALIZED (
        SELECT r.wake_at FROM recorded r UNION ALL SELECT i.wake_at FROM inserted i
    ), park AS (
        UPDATE workflow_status w SET run_at = wake.wake_at FROM wake
        WHERE w.shard_key = p_shard_key AND w.id = p_id AND EXISTS (SELECT 1 FROM lock)
            AND wake.wake_at > clock_timestamp()
        RETURNING 1
    )
    SELECT wake.wake_at, coalesce(wake.wake_at <= clock_timestamp(), false),
        EXISTS (SELECT 1 FROM lock)
            OR (EXISTS (SELECT 1 FROM replay)
                AND coalesce((SELECT s.held AND NOT s.cancel_requested FROM seen s), false)),
        (SELECT count(*) FROM park),
        coalesce((SELECT s.cancel_requested FROM seen s), false)
    FROM (SELECT 1) AS one LEFT JOIN wake ON true;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_take(p_tids tid[], p_owner text, p_lease_ms bigint, p_got_slot integer)
 RETURNS SETOF shardq_claimed
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    started timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH taken AS (
        UPDATE workflow_status w SET status = 'running', owner = p_owner,
            attempts = w.attempts + 1, fence = w.fence + 1, started_at = started,
            lease_expires_at = started + p_lease_ms * interval '1 millisecond'
        WHERE w.ctid = ANY (p_tids)
        RETURNING w.shard_key, w.id, w.handler, w.ordering_key, w.priority, w.payload,
            w.attempts, w.fence, w.queue, w.created_at
    )
    SELECT p_got_slot, t.shard_key, t.id, t.handler, t.ordering_key, t.priority, t.payload,
           t.attempts, t.fence, t.queue, t.created_at
    FROM (SELECT 1) AS one LEFT JOIN taken t ON true
    ORDER BY t.id;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_take_starts(q text, want integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    lim shardq_queue_limits%ROWTYPE;
    locked boolean := false;
    b_seq bigint;
    b_tokens double precision;
    b_tokens_at timestamptz;
    burst double precision;
    left_tokens double precision;
    give integer;
    at timestamptz;
BEGIN
    LOOP
        IF locked THEN
            SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = q FOR UPDATE;
        ELSE
            SELECT * INTO lim FROM shardq_queue_limits l WHERE l.queue = q;
        END IF;
        IF lim.rate_count IS NULL THEN
            RETURN NULL;
        END IF;
        -- Under the lock this reads the row the taker before left.
        SELECT b.take_seq, b.tokens, b.tokens_at INTO b_seq, b_tokens, b_tokens_at
            FROM shardq_rate_buckets b WHERE b.queue = q
            ORDER BY b.take_seq DESC LIMIT 1;
        IF b_seq IS NULL THEN
            b_tokens := lim.tokens;
            b_tokens_at := lim.tokens_at;
        END IF;
        -- Read once (under the lock when taking): two readings would lose
        -- the time between them on every call, and one taken before the
        -- lock could be older than the mark the previous holder left.
        at := clock_timestamp();
        burst := greatest(1.0, lim.rate_count * 50.0 / lim.rate_period_ms);
        -- Accrual is the same however often it is computed: a read that
        -- takes nothing need not write it.
        left_tokens := least(burst, b_tokens
            + extract(epoch FROM at - b_tokens_at) * 1000.0
              * lim.rate_count / lim.rate_period_ms);
        IF want >= 0 AND left_tokens < greatest(1.0, least(want, floor(burst / 2))) THEN
            RETURN 0;
        END IF;
        EXIT WHEN locked;
        locked := true;
    END LOOP;
    IF want < 0 THEN
        -- Taken and unused: back in full (past the burst too), so the
        -- starts used still never outrun the rate plus its burst.
        give := want;
        left_tokens := left_tokens - want;
    ELSE
        give := least(want, floor(left_tokens)::integer);
        left_tokens := left_tokens - give;
    END IF;
    INSERT INTO shardq_rate_buckets (queue, take_seq, tokens, tokens_at)
        VALUES (q, coalesce(b_seq, 0) + 1, left_tokens, at);
    IF b_seq IS NOT NULL THEN
        DELETE FROM shardq_rate_buckets b WHERE b.queue = q AND b.take_seq = b_seq;
    END IF;
    RETURN give;
END
$function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_take_turn()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
AS $function$
        DECLARE
            round_now bigint;
        BEGIN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                NEW.turn := NULL;
                RETURN NEW;
            END IF;
            PERFORM pg_current_xact_id();
            PERFORM nextval('public.shardq_ready_seq');
            IF current_setting('shardq.group_round_queue', true) = NEW.queue
               AND NEW.queue <> '' THEN
                round_now := nullif(current_setting('shardq.group_round', true), '')::bigint;
            ELSE
                round_now := (SELECT r.round FROM public.shardq_group_rounds r
                              WHERE r.queue = NEW.queue);
                PERFORM set_config('shardq.group_round_queue', NEW.queue, true);
                PERFORM set_config('shardq.group_round', coalesce(round_now::text, ''), true);
            END IF;
            NEW.turn := greatest(0,
                (SELECT w.turn + 1 FROM public.workflow_status w
                 WHERE w.queue = NEW.queue AND hashtext(w.job_group) = hashtext(NEW.job_group)
                   AND w.job_group = NEW.job_group AND w.priority = NEW.priority
                   AND w.status >= 'queued' AND w.status <= 'queued'
                   AND w.turn > coalesce(round_now, -1)
                 ORDER BY w.turn DESC LIMIT 1),
                round_now + 1);
            RETURN NEW;
        END
        $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_wake_parent(p_shard_key integer, p_parent_id bigint, p_child_shard_key integer, p_child_id bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    got boolean;
    notifies bigint;
BEGIN
    SELECT true INTO got FROM workflow_status
        WHERE shard_key = p_shard_key AND id = p_parent_id AND status <> 'held'
        FOR NO KEY UPDATE SKIP LOCKED;
    IF got IS NULL THEN
        -- Locked, or held by a move of its range (it is woken after the
        -- move, from the flag): left to a later try. Missing: gone, or on
        -- another shard (a child started across shards, or a parent whose
        -- range moved, or has not come here yet while its range moves),
        -- where the relay wakes it (src/store/children_elsewhere.rs).
        RETURN NOT EXISTS (SELECT 1 FROM workflow_status
                WHERE shard_key = p_shard_key AND id = p_parent_id)
            AND shardq_owns_key(p_shard_key)
            AND NOT EXISTS (SELECT 1 FROM shardq_map_moves v
                WHERE v.epoch = (SELECT max(e.epoch) FROM shardq_map_epochs e)
                  AND v.state <> 'released'
                  AND v.first_key <= p_shard_key AND p_shard_key < v.end_key);
    END IF;
    WITH waiting AS MATERIALIZED (
        SELECT 1 FROM workflow_steps s
        WHERE s.shard_key = p_shard_key AND s.workflow_id = p_parent_id
            AND s.step_name LIKE 'shardq:child:%:wait'
            AND (s.output->>'child_id')::bigint = p_child_id
            AND (s.output->>'child_shard_key')::int = p_child_shard_key
            AND NOT EXISTS (SELECT 1 FROM workflow_steps d
                WHERE d.shard_key = p_shard_key AND d.workflow_id = p_parent_id
                    AND d.step_name = left(s.step_name, -length(':wait')))
        LIMIT 1
    ), woken AS MATERIALIZED (
        -- The clock at the update, after the row's lock: later than the
        -- claim of a running parent (shardq_child_wait relies on it).
        UPDATE workflow_status w SET run_at = clock_timestamp(),
            status = CASE WHEN w.status = 'scheduled' AND (w.ordering_key IS NULL
                    OR pg_try_advisory_xact_lock(shardq_key_lock(w.queue, w.ordering_key)))
                THEN 'queued' ELSE w.status END
        WHERE w.shard_key = p_shard_key AND w.id = p_parent_id
            AND EXISTS (SELECT 1 FROM waiting)
            AND w.status IN ('scheduled', 'running') AND NOT w.cancel_requested
        RETURNING w.status, w.queue
    ), notified AS MATERIALIZED (
        SELECT pg_notify('shardq_ready', queue) FROM woken WHERE status = 'queued'
    )
    SELECT count(*) INTO notifies FROM notified;
    RETURN true;
END $function$

-- EXECUTE: PUBLIC EXECUTE
CREATE OR REPLACE FUNCTION public.shardq_wake_parents(p_limit integer)
 RETURNS bigint
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    c record;
    settled bigint := 0;
BEGIN
    FOR c IN SELECT w.shard_key, w.id, w.parent_shard_key, w.parent_id FROM workflow_status w
            WHERE w.parent_wake AND shardq_owns_key(w.parent_shard_key)
            ORDER BY w.shard_key, w.id LIMIT p_limit
            FOR UPDATE SKIP LOCKED LOOP
        IF shardq_wake_parent(c.parent_shard_key, c.parent_id, c.shard_key, c.id) THEN
            UPDATE workflow_status SET parent_wake = NULL
                WHERE shard_key = c.shard_key AND id = c.id;
            settled := settled + 1;
        END IF;
    END LOOP;
    RETURN settled;
END $function$
