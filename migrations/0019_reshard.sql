-- Online resharding (`shardq reshard`, src/reshard/): a range of shard keys
-- moves from one shard to another while the fleet runs. Its indexes were
-- built by 0018.
--
-- `held`: a job of a range moving in, on its new shard: not claimable until
-- the old shard holds no unfinished job of the range. `held_status` keeps
-- the status it is released to (and `running` for a stand-in of a job still
-- running on the old shard, kept only for its deduplication id).
ALTER TABLE workflow_status ADD COLUMN held_status text;
ALTER TABLE workflow_status DROP CONSTRAINT workflow_status_status_check;
-- NOT VALID: every existing row passed the narrower check it replaces, so
-- it passes this one; no table scan under the migration's lock. New rows
-- are checked.
ALTER TABLE workflow_status ADD CONSTRAINT workflow_status_status_check CHECK (
    status IN ('waiting', 'scheduled', 'queued', 'running', 'succeeded', 'failed', 'dead',
               'cancelled', 'held')) NOT VALID;

-- The range moves that make an epoch, recorded on every shard with the
-- epoch. `state`, on the new shard: `closed` (enqueues of the range wait,
-- then are refused with SQ005, while the moving command copies the
-- deduplication ids), `holding` (enqueues are written held), `released`.
CREATE TABLE shardq_map_moves (
    epoch      integer NOT NULL REFERENCES shardq_map_epochs (epoch),
    first_key  integer NOT NULL,
    end_key    integer NOT NULL,
    from_index integer NOT NULL CHECK (from_index >= 0),
    to_index   integer NOT NULL CHECK (to_index >= 0),
    state      text    NOT NULL CHECK (state IN ('closed', 'holding', 'released')),
    -- The new shard's first id once the range moves in: a job written with
    -- a lower id was given its id before (a client's reserved ids), and
    -- would sort before the jobs copied from the old shard: refused (SQ004)
    -- so the client takes new ids.
    ids_from   bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (epoch, first_key),
    CHECK (0 <= first_key AND first_key < end_key AND end_key <= 65536)
);
GRANT SELECT ON TABLE shardq_map_moves TO PUBLIC;
