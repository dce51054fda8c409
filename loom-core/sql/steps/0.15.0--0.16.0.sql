-- loom 0.15.0 -> 0.16.0 (issue 37): delta snapshot frames (0x03), read
-- and written in the server. New: loom_frame_format (every reader's first
-- check, once), loom_snapshot_base_sequence, loom_snapshot_state_text and
-- loom_snapshot_state with a keyframe, loom_snapshot_delta_frame, and
-- loom_snapshot_row_state with a keyframe; loom.snapshots_decoded joins
-- each delta's keyframe; loom_save_snapshot takes codec 'delta', and it
-- and pgloom store through loom_store_snapshot, which keeps a keyframe
-- that deltas name; loom_delete_snapshots deletes each
-- keyframe after its deltas; loom_resume returns a delta's keyframe
-- (base_z); loom_status counts keyframes and deltas.
-- Claims with fencing (issue 38): loom.claims, loom_schedule, loom_claim,
-- loom_renew, loom_complete, loom_check_fence; retention never deletes
-- a claimed or scheduled execution; loom_status counts claims. The change
-- feed (issue 38, opt-in): loom.events.feed_tx and feed_ord (added here
-- if loom.events can be locked in time, by loom_feed_enable otherwise),
-- loom.feed_state, loom.feed_consumers, loom_feed_enable, loom_feed_read,
-- consumers and their acknowledgements; writers insert every column of
-- loom.events but the feed's; loom_distribute refuses while the feed is on.
-- The routines are rerun from the current parts; the extension's three
-- new C bodies come first.
\echo Use "ALTER EXTENSION loom UPDATE TO '0.16.0'" to load this file. \quit
-- Nothing below resolves a name through a schema another role can create
-- in (issue 25): every loom object is named by @extschema@ or loom.
SET LOCAL search_path = pg_catalog, pg_temp;

-- @native: the C bodies of the three new frame functions, before the
-- routines rerun below name them
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_state_text(frame bytea, base bytea) RETURNS text
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_state_text_with_base_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_state(frame bytea, base bytea) RETURNS jsonb
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_state_with_base_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_delta_frame(state text, base_sequence bigint, base bytea, deltas_since integer)
    RETURNS bytea
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_delta_frame_wrapper';
CREATE OR REPLACE FUNCTION @extschema@.loom_snapshot_get_text(frame bytea, base bytea, VARIADIC path text[]) RETURNS text
    IMMUTABLE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'loom_snapshot_get_text_with_base_wrapper';
-- @end native

-- @rerun frames: loom_frame_format, loom_snapshot_base_sequence, loom_snapshot_state_text, loom_snapshot_state, loom_snapshot_delta_frame, loom_snapshot_frame_info, loom_snapshot_get_text, loom_snapshot_get
-- loom_resume returns a delta's keyframe too (base_z): a new result
-- column, which CREATE OR REPLACE cannot add.
DROP FUNCTION @extschema@.loom_resume(text);
-- @rerun snapshot_api: loom_snapshot_row_state, loom_define_snapshots_decoded, loom_snapshot_keyframe, loom_store_snapshot, loom_save_snapshot, loom_delete_snapshots, loom_resume
-- @rerun status: loom_status
SELECT @extschema@.loom_define_snapshots_decoded();

-- As loom-core/sql/claims.sql creates it for a fresh install.
CREATE TABLE loom.claims (
    execution_id text COLLATE "C" NOT NULL,
    queue text COLLATE "C" NOT NULL,
    due_at timestamptz,
    fence bigint NOT NULL DEFAULT 0,
    holder text,
    wake_at timestamptz,
    claimed_at timestamptz,
    CONSTRAINT claims_pkey PRIMARY KEY (execution_id),
    CONSTRAINT claims_held_is_due CHECK (holder IS NULL OR due_at IS NOT NULL),
    CONSTRAINT claims_fence_not_negative CHECK (fence >= 0)
);
CREATE INDEX claims_due ON loom.claims (queue, due_at) WHERE due_at IS NOT NULL;
CREATE SEQUENCE loom.claims_fence_seq AS bigint;
ALTER SEQUENCE loom.claims_fence_seq OWNED BY loom.claims.fence;
COMMENT ON TABLE loom.claims IS 'Which executions are due to run, which worker holds each one and until when (due_at, while holder is set), and its fencing token (fence, new from loom.claims_fence_seq at each claim). Write it through loom_schedule, loom_claim, loom_renew and loom_complete; writes that carry a token call loom_check_fence.';

DO $loom$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'loom') THEN
        PERFORM pg_catalog.pg_extension_config_dump('loom.claims', '');
        PERFORM pg_catalog.pg_extension_config_dump('loom.claims_fence_seq', '');
    END IF;
END
$loom$;

-- As loom-core/sql/feed.sql creates them for a fresh install.
CREATE TABLE loom.feed_state (
    single boolean NOT NULL DEFAULT true,
    enabled boolean NOT NULL DEFAULT true,
    notify boolean NOT NULL DEFAULT false,
    era integer NOT NULL DEFAULT 1,
    tx_offset bigint NOT NULL DEFAULT 0,
    CONSTRAINT feed_state_pkey PRIMARY KEY (single),
    CONSTRAINT feed_state_one_row CHECK (single)
);
COMMENT ON TABLE loom.feed_state IS 'The change feed''s settings from loom_feed_enable and loom_feed_disable (whether it is on, whether it notifies) and the offset that keeps its positions growing across a restore into a new cluster (era). Never write it.';

-- Positions of events deleted since they were fed, each above those
-- before it: inserted, never updated, so that deletes never wait on each
-- other here; loom_feed_enable keeps only the newest.
CREATE TABLE loom.feed_high_water (
    feed_tx bigint NOT NULL
);
CREATE INDEX feed_high_water_tx ON loom.feed_high_water (feed_tx);
-- Rows are deleted by loom_feed_enable: under a publication of loom's
-- tables, a delete needs a replica identity (equal marks may be inserted
-- at once, so there is no key).
ALTER TABLE loom.feed_high_water REPLICA IDENTITY FULL;
COMMENT ON TABLE loom.feed_high_water IS 'The change feed''s high water mark: the transaction half of positions of events deleted (or truncated) since they were fed, and of the newest when the feed was turned off, which a restore''s new era starts above. Written by the feed''s triggers and functions; never write it.';

CREATE SEQUENCE loom.feed_ord_seq AS bigint;
COMMENT ON SEQUENCE loom.feed_ord_seq IS 'The order of events within a transaction in the change feed (loom.events.feed_ord, while the feed is on).';

-- Durable named consumers: each keeps the position it acknowledged last.
-- A row belongs to the role that created it (owner_role, a regrole, which
-- a dump writes by name): row security lets
-- only that role and its members see or move it, so a writer cannot move
-- another consumer's position unless granted that role.
CREATE TABLE loom.feed_consumers (
    name text COLLATE "C" NOT NULL,
    owner_role regrole NOT NULL,
    position text COLLATE "C" NOT NULL DEFAULT '',
    acked_at timestamptz,
    CONSTRAINT feed_consumers_pkey PRIMARY KEY (name),
    CONSTRAINT feed_consumers_position CHECK (position ~ '^([0-9a-f]{32})?$')
);
ALTER TABLE loom.feed_consumers ENABLE ROW LEVEL SECURITY;
CREATE POLICY feed_consumers_owner ON loom.feed_consumers
    USING (pg_catalog.pg_has_role(current_user, owner_role::oid, 'MEMBER'))
    WITH CHECK (pg_catalog.pg_has_role(current_user, owner_role::oid, 'MEMBER'));
COMMENT ON TABLE loom.feed_consumers IS 'The change feed''s named consumers and the position each acknowledged last; each row is its creating role''s (row security). Write it through loom_feed_create_consumer and loom_feed_ack.';

DO $loom$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'loom') THEN
        PERFORM pg_catalog.pg_extension_config_dump('loom.feed_state', '');
        PERFORM pg_catalog.pg_extension_config_dump('loom.feed_high_water', '');
        PERFORM pg_catalog.pg_extension_config_dump('loom.feed_ord_seq', '');
        PERFORM pg_catalog.pg_extension_config_dump('loom.feed_consumers', '');
    END IF;
END
$loom$;

-- Each role granted reader or writer before gets what loom_grant_access
-- now grants on loom.claims and the feed's tables: readers (SELECT on
-- loom.events) see them, writers (EXECUTE on
-- loom_lock_execution_for_write) write claims and their own consumers.
-- And every role that may INSERT into loom.events may now insert every
-- column but the feed's positions, which only the feed's defaults write.
DO $loom_step$
DECLARE
    grantee text;
    inserters text[];
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
        WHERE c.oid OPERATOR(pg_catalog.=) 'loom.events'::pg_catalog.regclass
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
          AND (a.grantee OPERATOR(pg_catalog.=) 0 OR r.oid IS NOT NULL)
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON loom.claims, loom.feed_state, loom.feed_high_water, loom.feed_consumers TO %s', grantee);
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT pg_catalog.quote_ident(r.rolname)
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
        WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.loom_lock_execution_for_write(text)'::pg_catalog.regprocedure
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON loom.claims TO %s', grantee);
        EXECUTE pg_catalog.format('GRANT INSERT, UPDATE, DELETE ON loom.feed_consumers TO %s', grantee);
        EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE loom.claims_fence_seq, loom.feed_ord_seq TO %s', grantee);
    END LOOP;
    -- Every role with INSERT on the whole table, PUBLIC too, whoever
    -- granted it: the owner's grants are revoked with what hangs off them
    -- (CASCADE: a grant option's grants), then each role gets the columns.
    inserters := ARRAY(
        SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
        WHERE c.oid OPERATOR(pg_catalog.=) 'loom.events'::pg_catalog.regclass
          AND a.grantee OPERATOR(pg_catalog.<>) c.relowner AND a.privilege_type OPERATOR(pg_catalog.=) 'INSERT'
          AND (a.grantee OPERATOR(pg_catalog.=) 0 OR r.oid IS NOT NULL));
    FOREACH grantee IN ARRAY inserters LOOP
        EXECUTE pg_catalog.format('REVOKE INSERT ON loom.events FROM %s CASCADE', grantee);
    END LOOP;
    FOREACH grantee IN ARRAY inserters LOOP
        -- feed_ord's default takes from the sequence as the appending role.
        EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE loom.feed_ord_seq TO %s', grantee);
        EXECUTE pg_catalog.format('GRANT INSERT (%s) ON loom.events TO %s',
            (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
             WHERE a.attrelid OPERATOR(pg_catalog.=) 'loom.events'::pg_catalog.regclass AND a.attnum OPERATOR(pg_catalog.>) 0
               AND NOT a.attisdropped AND a.attname OPERATOR(pg_catalog.<>) ALL (ARRAY['feed_tx', 'feed_ord']::pg_catalog.name[])),
            grantee);
    END LOOP;
END
$loom_step$;
-- @rerun claims: loom_check_claim_arguments, loom_fenced_out, loom_schedule, loom_claim, loom_check_fence, loom_renew, loom_complete, loom_claim_counts
-- @rerun retention: loom_lock_idle_executions, loom_delete_idle_executions
-- @rerun privileges: loom_grant_access, loom_revoke_access
-- loom_ensure_event_metadata grants the column it adds to the roles that
-- insert the log column by column.
-- @rerun collation_migration: loom_ensure_event_metadata
-- @rerun feed: loom_feed_parse_position, loom_feed_position, loom_feed_has_columns, loom_feed_add_columns, loom_feed_is_on, loom_feed_newest, loom_feed_restored, loom_feed_new_era, loom_events_feed, loom_feed_enable, loom_feed_disable, loom_feed_readable, loom_feed_read, loom_feed_head, loom_feed_create_consumer, loom_feed_next, loom_feed_ack, loom_feed_drop_consumer
-- The feed's columns, unless loom.events is busy for longer than loom's
-- migrations wait (loom.migration_lock_timeout, 2 s unless set: its
-- ACCESS EXCLUSIVE lock waits behind every append in progress, and every
-- append would wait behind it) or the database runs Citus (each node
-- keeps its own loom.events, which one update cannot alter together):
-- loom_feed_enable adds them then.
DO $loom_step$
DECLARE
    lock_wait text := pg_catalog.current_setting('lock_timeout');
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        PERFORM pg_catalog.set_config('lock_timeout', @extschema@.loom_migration_lock_timeout() || 'ms', true);
        PERFORM @extschema@.loom_feed_add_columns();
        PERFORM pg_catalog.set_config('lock_timeout', lock_wait, true);
    END IF;
EXCEPTION WHEN lock_not_available THEN
    RAISE WARNING 'loom: could not add the change feed''s columns to loom.events: % (SQLSTATE %)', SQLERRM, SQLSTATE
        USING HINT = 'Nothing else changes: loom_feed_enable() adds them when the feed is turned on.';
END
$loom_step$;
-- @rerun distribute: loom_distribute
REVOKE EXECUTE ON FUNCTION
    @extschema@.loom_events_feed(),
    @extschema@.loom_feed_enable(boolean),
    @extschema@.loom_feed_disable(),
    @extschema@.loom_feed_new_era(),
    @extschema@.loom_feed_add_columns()
FROM PUBLIC;
