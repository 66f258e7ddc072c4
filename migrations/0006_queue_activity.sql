-- shardq:no-transaction
-- Scheduled jobs by queue. `worker --until-empty` asks whether a queue still
-- has retrying jobs (scheduled after a failure), and `shardq status` counts
-- scheduled jobs per queue: without this index both walked every scheduled
-- row of every queue (a delayed backlog can be millions). Only scheduled
-- rows are in it, so a job pays for it only when it is delayed or retried,
-- never on the claim and completion path. (An index on running rows by
-- queue would answer "any running job of this queue?" with one probe too,
-- but it cost every claim 9% of the pipeline's throughput in `shardq-bench
-- pipeline`; that question walks the running rows instead, which are
-- bounded by what the fleet holds, not by backlog or history.)
--
-- Built concurrently, outside a transaction: the fleet keeps claiming while
-- it builds (src/migrate/no_transaction.rs).
CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_status_scheduled_queue
    ON workflow_status (queue, attempts)
    WHERE status = 'scheduled';
