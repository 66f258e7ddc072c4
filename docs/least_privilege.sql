-- A least-privilege role for shardq workers and producers.
--
-- Run this as the owner of shardq's tables (the role that ran `shardq migrate`),
-- in EVERY shard database, after migrating:
--
--     psql "postgres://owner@host:5432/shardq" -f docs/least_privilege.sql
--
-- It creates the group role `shardq_worker` once per cluster and grants it, in
-- this database, what `shardq worker`, `shardq enqueue`, `shardq status` and an
-- embedded `shardq::Client` need, and nothing else. Migrations (DDL) stay with
-- the owner: run `shardq migrate` with the owner's URL, everything else with a
-- login role in `shardq_worker`, e.g.
--
--     CREATE ROLE app_worker LOGIN PASSWORD '...' IN ROLE shardq_worker;
--
-- (give that role's password through `password_file` or `password_env`, not in
-- shards.toml). The file can be run again; granting twice changes nothing.

-- The group role holds the privileges; login roles are members of it. NOLOGIN:
-- nobody connects as the group itself. Roles are per cluster, so a second shard
-- database on the same server finds it already there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'shardq_worker') THEN
        CREATE ROLE shardq_worker NOLOGIN;
    END IF;
END
$$;

-- Connecting to this database. PUBLIC has it by default; a hardened server that
-- revoked it from PUBLIC still lets shardq's workers in.
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO shardq_worker', current_database());
END
$$;

-- Looking up shardq's tables in schema public. USAGE only: no CREATE, so a
-- worker can neither add tables nor shadow shardq's with its own. Since
-- PostgreSQL 15, PUBLIC has no CREATE on schema public; on older servers
-- revoke it, or every role (the worker's included) may create tables there.
GRANT USAGE ON SCHEMA public TO shardq_worker;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- The jobs. SELECT: claims, status, inspection, the "is work left" check.
-- INSERT: enqueue (the id is an identity column, which needs no sequence
-- privilege). UPDATE: claiming (FOR UPDATE SKIP LOCKED needs it too),
-- completion, retries, lease extension and recovery, promotion of due jobs,
-- cancellation. DELETE: retention of finished jobs.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE workflow_status TO shardq_worker;

-- Durable step outputs. SELECT: a replayed job reads its finished steps.
-- INSERT: a step records its output (ON CONFLICT DO NOTHING needs no more).
-- UPDATE and DELETE: today's statements do not use them (retention deletes a
-- job's steps through ON DELETE CASCADE, which runs with the owner's rights);
-- they are granted so that changes to step handling need no new grant on
-- upgrade. Leave them out for a stricter role.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE workflow_steps TO shardq_worker;

-- The schema version: a worker refuses to run against a schema it does not
-- know, so it reads this table. Read only: recording a migration is the owner's.
GRANT SELECT ON TABLE shardq_migrations TO shardq_worker;
