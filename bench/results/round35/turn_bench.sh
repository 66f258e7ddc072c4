#!/bin/bash
# Round 35: times one INSERT of $1 grouped jobs (100 groups) into an emptied
# workflow_status on the local shard at 127.0.0.1:54330, after VACUUM ANALYZE
# of the empty table when $2 is "analyze" (turn_bench.txt).
# $1 = rows, $2 = "analyze" or "fresh"
prep="TRUNCATE workflow_status CASCADE"
[ "$2" = analyze ] && an="VACUUM ANALYZE workflow_status" || an="SELECT 1"
psql -h 127.0.0.1 -p 54330 -U postgres -d shardq -q -At -c "$prep" -c "$an" -c "\timing on" -c "INSERT INTO workflow_status (shard_key, queue, handler, payload, job_group) SELECT g % 1024, 'q', 'noop', '{}', 'g' || (g % 100) FROM generate_series(1, $1) g" 2>/dev/null | grep Time
