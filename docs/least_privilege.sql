-- Least-privilege roles for shardq: one for workers, one for producers.
--
-- Run this as the owner of shardq's tables (the role that ran `shardq migrate`),
-- in EVERY shard database, after migrating:
--
--     psql "postgres://owner@host:5432/shardq" -f docs/least_privilege.sql
--
-- It creates two group roles once per cluster and grants them, in this
-- database only, what they need and nothing else:
--   shardq_worker    `shardq worker` (claims, completions, steps, leases,
--                    recovery, retention) and everything a producer does;
--   shardq_producer  `shardq enqueue`, `shardq status`, `shardq job
--                    show|cancel|retry` and an embedded `shardq::Client`: it
--                    can neither delete jobs nor write step outputs;
--   shardq_dashboard_ro  `shardq dashboard --read-only`: reads only;
--   shardq_dashboard `shardq dashboard`: reads, and retries, cancels, pauses
--                    and resumes; it cannot enqueue, delete jobs or write steps.
-- Migrations (DDL) stay with the owner: run `shardq migrate` with the owner's
-- URL, everything else with a login role in one of the groups, e.g.
--
--     CREATE ROLE app_worker LOGIN PASSWORD '...' IN ROLE shardq_worker;
--     CREATE ROLE app_producer LOGIN PASSWORD '...' IN ROLE shardq_producer;
--
-- (give passwords through `password_file` or `password_env`, not in
-- shards.toml). The file can be run again; granting twice changes nothing. It
-- changes nothing outside shardq's own tables: no REVOKE from PUBLIC.

-- The group role holds the privileges; login roles are members of it. NOLOGIN:
-- nobody connects as the group itself. Roles are per cluster, so a second shard
-- database on the same server finds it already there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_worker') THEN
        CREATE ROLE shardq_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_producer') THEN
        CREATE ROLE shardq_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_dashboard_ro') THEN
        CREATE ROLE shardq_dashboard_ro NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_dashboard') THEN
        CREATE ROLE shardq_dashboard NOLOGIN IN ROLE shardq_dashboard_ro;
    END IF;
END
$$;

-- Connecting to this database. PUBLIC has it by default; a hardened server that
-- revoked it from PUBLIC still lets shardq's workers in.
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO shardq_worker, shardq_producer, '
                   'shardq_dashboard_ro', current_database());
END
$$;

-- Looking up shardq's tables in schema public. USAGE only: no CREATE, so
-- neither role can add tables nor shadow shardq's with its own. Since
-- PostgreSQL 15, PUBLIC has no CREATE on schema public; on an older server
-- every role may create tables there unless you revoke it from PUBLIC (a
-- database-wide change, so this file leaves it to you).
GRANT USAGE ON SCHEMA public TO shardq_worker, shardq_producer, shardq_dashboard_ro;

-- The jobs. SELECT: claims, status, inspection, the "is work left" check.
-- INSERT: enqueue (the id is an identity column, which needs no sequence
-- privilege). UPDATE: claiming (FOR UPDATE SKIP LOCKED needs it too),
-- completion, retries, lease extension and recovery, promotion of due jobs,
-- cancellation. DELETE: retention of finished jobs.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE workflow_status TO shardq_worker;
-- A producer: SELECT (status, inspection), INSERT (enqueue), UPDATE (cancel,
-- retry, and a debounced enqueue joining its key's pending run: INSERT ...
-- ON CONFLICT DO UPDATE). No DELETE.
GRANT SELECT, INSERT, UPDATE ON TABLE workflow_status TO shardq_producer;

-- Durable step outputs. SELECT: a replayed job reads its finished steps.
-- INSERT: a step records its output (ON CONFLICT DO NOTHING needs no more).
-- No UPDATE or DELETE for anyone: a recorded output is never changed
-- (retention deletes a job's steps through ON DELETE CASCADE, which runs
-- with the owner's rights). A producer only reads them.
GRANT SELECT, INSERT ON TABLE workflow_steps TO shardq_worker;
REVOKE UPDATE, DELETE ON TABLE workflow_steps FROM shardq_worker;  -- granted by older versions of this file
GRANT SELECT ON TABLE workflow_steps TO shardq_producer;

-- Workflow mailboxes (schema version 31). A worker: SELECT and UPDATE (a
-- recv takes a message, marking it received), INSERT (JobContext::send). A
-- producer: SELECT, INSERT (Client::send; it wakes the workflow through its
-- UPDATE on workflow_status). Deleted only with their job (cascade).
GRANT SELECT, INSERT, UPDATE ON TABLE workflow_messages TO shardq_worker;
GRANT SELECT, INSERT ON TABLE workflow_messages TO shardq_producer;

-- Workflow events (schema version 32). A worker: SELECT, INSERT, UPDATE
-- (JobContext::set_event upserts its workflow's event; get_event reads
-- another's). A producer: SELECT (Client::get_event, shardq_get_event).
-- Deleted only with their job (cascade).
GRANT SELECT, INSERT, UPDATE ON TABLE workflow_events TO shardq_worker;
GRANT SELECT ON TABLE workflow_events TO shardq_producer;

-- Functions run with the caller's rights and PUBLIC may execute them (the
-- PostgreSQL default), so the table grants above decide: shardq_send and
-- shardq_send_row need INSERT on workflow_messages, UPDATE on
-- workflow_status and SELECT on workflow_steps (a producer and a worker
-- have them; the dashboard roles cannot send); shardq_get_event needs
-- SELECT on workflow_status and workflow_events.
-- Child workflows (schema version 33) need no grant of their own: a child
-- is a workflow_status row started by its parent's worker (INSERT) with a
-- step (INSERT on workflow_steps), and the trigger that wakes a parent when
-- its child finishes runs with the rights of whoever writes that final
-- status (a worker's completion or recovery, a producer's or the
-- dashboard's cancel): it reads workflow_steps and updates workflow_status,
-- which each of them may.

-- The schema version: a worker refuses to run against a schema it does not
-- know, so it reads this table. Read only: recording a migration is the owner's.
GRANT SELECT ON TABLE shardq_migrations TO shardq_worker, shardq_producer;
-- Workers read which queues are paused (in the claim); producers (operators) pause and resume.
GRANT SELECT ON TABLE shardq_paused_queues TO shardq_worker;
GRANT SELECT, INSERT, DELETE ON TABLE shardq_paused_queues TO shardq_producer;

-- Periodic jobs (schema version 8): a worker records each schedule and moves
-- its last tick forward (INSERT, UPDATE; the tick's job goes to
-- workflow_status as above). A producer reads them for `shardq status`.
GRANT SELECT, INSERT, UPDATE ON TABLE shardq_schedules TO shardq_worker;
GRANT SELECT ON TABLE shardq_schedules TO shardq_producer;

-- Worker heartbeats (migration 9): each worker upserts its own row and
-- deletes expired ones (ON CONFLICT DO UPDATE needs SELECT too).
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE shardq_workers TO shardq_worker;

-- The dashboard. Read-only: every table it shows, nothing else.
GRANT SELECT ON TABLE workflow_status, workflow_steps, workflow_messages, workflow_events,
    shardq_workers, shardq_paused_queues, shardq_migrations TO shardq_dashboard_ro;
-- With actions (it is a member of shardq_dashboard_ro): UPDATE for retry and
-- cancel (and the key bookkeeping they do), INSERT and DELETE of pause rows.
-- No INSERT or DELETE of jobs, no step outputs.
GRANT UPDATE ON TABLE workflow_status TO shardq_dashboard;
GRANT INSERT, DELETE ON TABLE shardq_paused_queues TO shardq_dashboard;

-- Queue limits (migrations 21, 48). A worker reads them, takes a rate's
-- starts (under the limit row's lock, which also orders permit leases: a
-- row lock needs UPDATE; each take adds the bucket's row and deletes the
-- one it read) and keeps its permit leases (each renewal adds its lease's
-- row and deletes the one it replaces; lapsed leases and their holders
-- are deleted). A producer (operators: `shardq limit
-- set|list|clear`) writes the limits and reads the leases; the dashboard
-- reads both.
GRANT SELECT, UPDATE ON TABLE shardq_queue_limits TO shardq_worker;
GRANT SELECT, INSERT, DELETE ON TABLE shardq_rate_buckets TO shardq_worker;
GRANT SELECT, INSERT, DELETE ON TABLE shardq_limit_holders, shardq_limit_lease_moves
    TO shardq_worker;
GRANT USAGE ON SEQUENCE shardq_limit_lease_seq TO shardq_worker;
GRANT SELECT, INSERT, UPDATE ON TABLE shardq_queue_limits TO shardq_producer;
GRANT SELECT ON TABLE shardq_limit_holders, shardq_limit_lease_moves TO shardq_producer;
GRANT SELECT ON TABLE shardq_queue_limits, shardq_limit_holders, shardq_limit_lease_moves
    TO shardq_dashboard_ro;
-- Each group's start-rate bucket: taken by the claim (the worker's role:
-- a row added, numbered from the sequence, and the one read deleted;
-- migration 50), emptied of full buckets by upkeep (which locks the rows
-- it deletes: UPDATE).
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE shardq_group_buckets TO shardq_worker;
GRANT USAGE ON SEQUENCE shardq_group_bucket_seq TO shardq_worker;

-- Ready order (migrations 27-29, 47, 49). A worker's claim reads each
-- queue's ready floors and moves them up (a row added and one deleted per
-- floor that rises and for the barrier, and a number from the sequence:
-- shardq_advance_ready_floors). The trigger that numbers a job
-- made ready runs with the owner's rights, so a producer or the dashboard
-- needs nothing here.
GRANT SELECT ON TABLE shardq_ready_floors TO shardq_worker;
GRANT SELECT, INSERT, DELETE ON TABLE shardq_ready_floor_moves TO shardq_worker;
GRANT SELECT, INSERT, DELETE ON TABLE shardq_ready_barrier TO shardq_worker;
GRANT USAGE ON SEQUENCE shardq_ready_seq TO shardq_worker;
-- The backlog read (`shardq status`, `Client::depth`, `shardq metrics`,
-- the dashboard) counts ready jobs from the floors, as the claims find them.
GRANT SELECT ON TABLE shardq_ready_floors TO shardq_producer, shardq_dashboard_ro;
-- Group turns (migrations 41-42): the trigger that gives a grouped job its
-- turn and the claim's move of the queue's round run with the owner's
-- rights; `shardq check`, the dashboard and the backlog read (a
-- producer's `shardq status` and `Client::depth` too: grouped jobs are
-- counted from each queue's grouped floor) read the rounds.
GRANT SELECT ON TABLE shardq_group_rounds TO shardq_worker, shardq_producer, shardq_dashboard_ro;

-- Key floors (migration 44): keyed claims read and lower them; every
-- release of a key (a completion, a cancel, a retry: the dashboard and a
-- producer too) reads and moves them up; maintenance deletes quiet ones.
-- The trigger that lowers one for a job written below it runs with the
-- owner's rights.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE shardq_key_floors TO shardq_worker;
GRANT SELECT, INSERT, UPDATE ON TABLE shardq_key_floors TO shardq_producer, shardq_dashboard;
GRANT SELECT ON TABLE shardq_key_floors TO shardq_dashboard_ro;

-- The lease floor (migration 51): a worker's upkeep moves it
-- (a row added, the ones before it deleted); every read of the running
-- jobs (the backlog, `shardq check`) starts there.
GRANT SELECT, INSERT, DELETE ON TABLE shardq_lease_floor_moves TO shardq_worker;
GRANT SELECT ON TABLE shardq_lease_floor_moves TO shardq_producer, shardq_dashboard_ro;

-- Relay leases (migration 39): a worker takes and renews the lease of the
-- wakes its shard's children owe another shard (an upsert: SELECT too).
GRANT SELECT, INSERT, UPDATE ON TABLE shardq_relay_leases TO shardq_worker;

-- Cancel cascades owed (migration 40): a cancel writes one and its
-- canceller deletes it through functions that run with the owner's rights
-- (shardq_owe_cascades, which anyone may call, and shardq_cascades_paid,
-- which only these roles may: a debt dropped unpaid is a cancel not
-- carried out); a worker's pass takes the due ones (UPDATE) and
-- `shardq check` reads them.
GRANT SELECT, UPDATE ON TABLE shardq_cascades_owed TO shardq_worker;
GRANT SELECT ON TABLE shardq_cascades_owed TO shardq_producer, shardq_dashboard_ro;
GRANT EXECUTE ON FUNCTION shardq_cascades_paid(int[], bigint[], bigint[])
    TO shardq_worker, shardq_producer, shardq_dashboard;
