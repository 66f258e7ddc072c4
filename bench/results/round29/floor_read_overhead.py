"""What reading the ready floors through shardq_ready_floor_of (the view of
schema 47) costs against the same read inline, and against the function
without its SET clauses: 100 floors, no snapshot held, medians of 200,
three rounds. Run on one shard `shardq migrate` set up (port 54330)."""
import psycopg, time, statistics
S=("-c plan_cache_mode=force_custom_plan -c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off -c jit=off")
c=psycopg.connect("host=127.0.0.1 port=54330 user=postgres dbname=shardq", autocommit=True, options=S)
c.execute("SELECT shardq_ensure_floors(array_agg('q' || i), array_agg(0)) FROM generate_series(0, 99) i")
c.execute("VACUUM ANALYZE shardq_ready_floor_moves")
c.execute("""CREATE OR REPLACE FUNCTION pg_temp.nosets(p_queue text, p_priority int,
  OUT floor_seq bigint, OUT keyed_floor_seq bigint, OUT move_seq bigint) LANGUAGE plpgsql STABLE AS $$
  BEGIN SELECT f.floor_seq, f.keyed_floor_seq, f.move_seq INTO floor_seq, keyed_floor_seq, move_seq
  FROM public.shardq_ready_floor_moves f WHERE f.queue = p_queue AND f.priority = p_priority ORDER BY f.move_seq DESC LIMIT 1; END $$""")
qs={
 'view (function, 4 SETs, definer)': "SELECT sum(floor_seq) FROM shardq_ready_floors",
 'function without SETs': "SELECT sum(m.floor_seq) FROM shardq_ready_levels l CROSS JOIN LATERAL pg_temp.nosets(l.queue, l.priority) m",
 'inline lateral': "SELECT sum(m.floor_seq) FROM shardq_ready_levels l LEFT JOIN LATERAL (SELECT f.floor_seq FROM shardq_ready_floor_moves f WHERE f.queue=l.queue AND f.priority=l.priority ORDER BY f.move_seq DESC LIMIT 1) m ON true",
}
for r in range(3):
  for k,q in qs.items():
    ts=[]
    for _ in range(200):
      t=time.perf_counter(); c.execute(q).fetchall(); ts.append((time.perf_counter()-t)*1000)
    print(r,k,round(statistics.median(ts),3),'ms for',c.execute("SELECT count(*) FROM shardq_ready_levels").fetchone()[0],'levels')
