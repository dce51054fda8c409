-- The change feed (issue 38; docs/feed.md): every event of the database
-- after a position, in an order a reader follows without ever skipping
-- an event that commits later.
--
-- A sequence number taken at insert skips: a transaction that took 41
-- and commits after the one that took 42 is invisible to a reader that
-- has moved past 42. So a position here is the writing transaction's id
-- (pg_current_xact_id, 64 bits, never wrapping), then the row's order in
-- it, and a reader reads only below the oldest transaction still in
-- progress (pg_snapshot_xmin of its snapshot): every transaction below
-- it has ended, so nothing can ever appear there again. An event becomes
-- readable once every transaction older than its own has ended, and
-- positions sort in commit-safe order.
--
-- Opt-in (loom_feed_enable, the owner's). A position is kept in the
-- event's own row, loom.events.feed_tx and feed_ord, written by column
-- defaults the feed sets while it is on (the transaction's id plus the
-- offset, a constant in the default; a sequence for the order) and
-- read through one partial index: an append with the feed on writes one
-- more index entry and nothing else (no trigger, no second row), and
-- with it off, nothing at all. Writers may not name the two columns
-- (column privileges), so no position is forged.
--
-- Positions are 32 hexadecimal digits: the transaction (plus the feed's
-- offset, below) and the order, 16 each, so that text order is position
-- order. pg_upgrade keeps transaction ids, so positions go on after it. A
-- dump restored into a new cluster starts its ids again from low numbers:
-- loom_feed_enable, which status asks for after a restore, finds
-- positions at or above what the cluster's ids can reach and moves the
-- offset past them (a new era), so new positions stay above every
-- restored one: above every event's, and above the newest position of
-- events deleted since (loom.feed_high_water, written by the feed's
-- delete and truncate triggers and by loom_feed_disable). Until then,
-- readers refuse (55000) rather than read past what comes later. (A
-- consumer's position is its role's to write, so it bounds nothing.)
--
-- The feed is on while feed_tx has its default; loom.feed_state has its
-- one row from the first loom_feed_enable on, and a dump carries it (its
-- offset, its era, whether it was on) and the high water mark. The
-- extension's dump carries neither the defaults nor the index nor the
-- triggers (the SQL-only flavour's carries all three, with the old
-- offset): after a restore, loom_feed_enable() again before anything is
-- appended, as loom status says.
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

-- A position's two halves, from its text; LM002 for anything else.
CREATE FUNCTION @extschema@.loom_feed_parse_position(feed_position text, OUT feed_tx bigint, OUT ord bigint)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF feed_position IS NULL OR feed_position = '' THEN
        feed_tx := -1;
        ord := -1;
        RETURN;
    END IF;
    IF feed_position !~ '^[0-9a-f]{32}$' THEN
        RAISE EXCEPTION 'invalid feed position %: expected 32 lowercase hexadecimal digits from loom_feed_read', quote_literal(left(feed_position, 64))
            USING ERRCODE = 'LM002';
    END IF;
    feed_tx := ('x' || substr(feed_position, 1, 16))::bit(64)::bigint;
    ord := ('x' || substr(feed_position, 17, 16))::bit(64)::bigint;
    IF feed_tx < 0 OR ord < 0 THEN
        RAISE EXCEPTION 'invalid feed position %: out of range', quote_literal(feed_position) USING ERRCODE = 'LM002';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_parse_position(text) IS
'A feed position''s transaction and order; NULL or empty is before the first (-1, -1); LM002 for text that is not a position.';

CREATE FUNCTION @extschema@.loom_feed_position(feed_tx bigint, ord bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN lpad(to_hex(feed_tx), 16, '0') || lpad(to_hex(ord), 16, '0');
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_position(bigint, bigint) IS
'A feed position''s text (32 hexadecimal digits, which sort as positions do) from its transaction and order.';

-- Whether loom.events has the feed's columns (an update may have left
-- them to loom_feed_enable): without them, no event has a position.
CREATE FUNCTION @extschema@.loom_feed_has_columns()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) = 2 FROM pg_attribute a
    WHERE a.attrelid = 'loom.events'::regclass AND a.attname IN ('feed_tx', 'feed_ord')
      AND NOT a.attisdropped AND a.atttypid = 'bigint'::regtype
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_has_columns() IS
'Whether loom.events has the change feed''s position columns, feed_tx and feed_ord (loom_feed_enable adds them when an update could not).';

-- loom.events' two position columns, last, unless they are there. In a
-- fresh install's script; an update adds them if it can lock loom.events
-- in time, and loom_feed_enable otherwise (a catalog change, no rewrite,
-- but it waits behind every append in progress). 55000 for a column of
-- that name that is not loom's.
CREATE FUNCTION @extschema@.loom_feed_add_columns()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF @extschema@.loom_feed_has_columns() THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = 'loom.events'::regclass
               AND a.attname IN ('feed_tx', 'feed_ord') AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'loom.events has a column feed_tx or feed_ord that is not the change feed''s bigint pair'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Rename or drop it, then run SELECT @extschema@.loom_feed_enable();';
    END IF;
    ALTER TABLE loom.events ADD COLUMN feed_tx bigint, ADD COLUMN feed_ord bigint;
    COMMENT ON COLUMN loom.events.feed_tx IS 'The event''s position in the change feed, with feed_ord (NULL: appended while the feed was off): its writing transaction plus the feed''s offset. Written by the default loom_feed_enable sets, never by a writer; read with loom_feed_read.';
    COMMENT ON COLUMN loom.events.feed_ord IS 'The event''s order within its transaction in the change feed (NULL: appended while the feed was off), from loom.feed_ord_seq.';
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_add_columns() IS
'Adds loom.events'' change feed columns (feed_tx, feed_ord) unless they are there; 55000 for other columns of those names. The owner''s: loom_feed_enable calls it.';
SELECT @extschema@.loom_feed_add_columns();

-- Whether the feed is on: feed_tx and feed_ord have the defaults that
-- give appends their positions (a restore carries neither).
CREATE FUNCTION @extschema@.loom_feed_is_on()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) = 2 FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
    WHERE d.adrelid = 'loom.events'::regclass AND a.attname IN ('feed_tx', 'feed_ord') AND NOT a.attisdropped
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_is_on() IS
'Whether the change feed is on: loom.events.feed_tx and feed_ord have the defaults loom_feed_enable sets.';

-- The newest position a reader may have read: an event's, or one deleted
-- since (each one backward descent of an index).
CREATE FUNCTION @extschema@.loom_feed_newest()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN greatest(
        (SELECT e.feed_tx FROM loom.events e WHERE e.feed_tx IS NOT NULL ORDER BY e.feed_tx DESC LIMIT 1),
        (SELECT h.feed_tx FROM loom.feed_high_water h ORDER BY h.feed_tx DESC LIMIT 1));
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_newest() IS
'The transaction half of the newest position a reader may have read: an event''s, or one of an event deleted since (loom.feed_high_water).';

-- Whether positions are at or past what this cluster's transactions
-- reach (a dump restored into a new cluster, before loom_feed_enable):
-- every position this cluster wrote is below its snapshot's xmax (the
-- latest completed transaction's id plus one) or is this transaction's,
-- plus the offset. New positions would then sort below restored ones.
-- Given loom_feed_newest(), which a reader goes on to use too.
CREATE FUNCTION @extschema@.loom_feed_restored(newest bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN coalesce(newest
                    >= greatest(pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                                coalesce(pg_current_xact_id_if_assigned()::text::bigint + 1, 0))
                       + coalesce((SELECT s.tx_offset FROM loom.feed_state s), 0),
                    false);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_restored(bigint) IS
'Whether newest, the change feed''s newest position (loom_feed_newest()), is at or past what this cluster''s transaction ids reach: restored into a new cluster, and loom_feed_enable() not run since. Readers refuse (55000) while it is.';

-- The offset from now on: the one in loom.feed_state, unless a position
-- is at or past the oldest transaction still running (after a restore
-- into a new cluster, above everything its transactions reach), and then
-- a new era's, which puts that transaction, and so every one that can
-- still append, above every position there is (the larger of it and the one there,
-- when two sessions of a restored cluster race). Refused (22003) when a
-- position is so high that new ones would soon overflow.
CREATE FUNCTION @extschema@.loom_feed_new_era()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    offset_now bigint := coalesce((SELECT s.tx_offset FROM loom.feed_state s), 0);
    newest bigint := @extschema@.loom_feed_newest();
    oldest bigint := pg_snapshot_xmin(pg_current_snapshot())::text::bigint;
BEGIN
    -- Against the oldest transaction still running, not the newest: one
    -- that began before this and appends after it must sort above too
    -- (in a cluster where nothing was restored, a new era then and again
    -- only moves positions up).
    IF newest >= oldest + offset_now THEN
        IF newest >= 4611686018427387904 THEN
            RAISE EXCEPTION 'the change feed holds a position (transaction %) too high to start a new era above', newest
                USING ERRCODE = 'numeric_value_out_of_range',
                      HINT = 'An event or a high water mark of loom.feed_high_water was written by hand: delete it as the owner.';
        END IF;
        INSERT INTO loom.feed_state AS s (tx_offset, era)
        VALUES (newest + 1 - oldest, 2)
        ON CONFLICT ON CONSTRAINT feed_state_pkey DO UPDATE
        SET tx_offset = greatest(s.tx_offset, excluded.tx_offset), era = s.era + 1
        RETURNING s.tx_offset INTO offset_now;
    END IF;
    RETURN offset_now;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_new_era() IS
'The change feed''s offset from now on: a new era''s, whose positions sort above every position there is, when one is at or past what this cluster''s transaction ids reach (after a restore into a new cluster); 22003 for a position too high for that. The owner''s: loom_feed_enable calls it.';

-- The feed's triggers on loom.events, while it is on: NOTIFY after an
-- append (when the owner asked for it), the high water mark of the
-- positions of events deleted (or truncated), which a restore's new era
-- must start above, and in the SQL-only flavour a guard: its dump carries
-- the defaults with the old cluster's offset, so in a new cluster an
-- append is refused until the owner runs loom_feed_enable, instead of
-- taking a position below the restored ones. SECURITY DEFINER (writers need no grant on
-- loom.feed_high_water), and, like loom's other trigger functions, it
-- checks how it was called.
CREATE FUNCTION @extschema@.loom_events_feed()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    newest bigint;
BEGIN
    IF NOT (TG_TABLE_SCHEMA = 'loom' AND TG_TABLE_NAME = 'events' AND TG_LEVEL = 'STATEMENT'
            AND ((TG_NAME IN ('events_feed_notify', 'events_feed_guard') AND TG_WHEN = 'AFTER' AND TG_OP = 'INSERT')
                 OR (TG_NAME = 'events_feed_deleted' AND TG_WHEN = 'AFTER' AND TG_OP = 'DELETE')
                 OR (TG_NAME = 'events_feed_truncated' AND TG_WHEN = 'BEFORE' AND TG_OP = 'TRUNCATE'))) THEN
        RAISE EXCEPTION 'loom_events_feed() only serves the change feed''s triggers on loom.events, not %.% (trigger %)', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_NAME = 'events_feed_guard' THEN
        IF @extschema@.loom_feed_restored(@extschema@.loom_feed_newest()) THEN
            RAISE EXCEPTION 'the change feed was restored into another cluster and not turned on there since: these events would sort below the restored ones, and nothing was appended'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'As loom''s owner: SELECT @extschema@.loom_feed_enable();';
        END IF;
        RETURN NULL;
    ELSIF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('loom_feed', '');
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        newest := (SELECT max(d.feed_tx) FROM loom_feed_deleted d);
    ELSE
        -- A newer snapshot than this one would miss what committed since.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'loom.events is truncated in READ COMMITTED only while the change feed is on: an older snapshot would miss its newest positions'
                USING ERRCODE = 'feature_not_supported';
        END IF;
        -- Its newest event's or the mark's: the mark grows only past it.
        newest := @extschema@.loom_feed_newest();
    END IF;
    -- Inserted, not updated: deletes never wait on each other for it.
    IF newest > coalesce((SELECT h.feed_tx FROM loom.feed_high_water h ORDER BY h.feed_tx DESC LIMIT 1), -1) THEN
        INSERT INTO loom.feed_high_water (feed_tx) VALUES (newest);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_events_feed() IS
'The change feed''s trigger function on loom.events (created by loom_feed_enable): NOTIFY loom_feed after an append when the feed notifies, the high water mark of deleted positions (loom.feed_high_water), and in the SQL-only flavour the guard that refuses appends (55000) after a restore into another cluster until loom_feed_enable(). Not callable.';

-- The feed's defaults: set by enable (whose transaction holds loom.events
-- against every append while it changes them) and dropped by disable, at
-- most 5 s behind open appends (55P03 then, and nothing queues behind it
-- longer).
CREATE FUNCTION @extschema@.loom_feed_enable(notify boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
DECLARE
    offset_before bigint := (SELECT s.tx_offset FROM loom.feed_state s);
    offset_now bigint;
BEGIN
    IF @extschema@.loom_is_distributed() THEN
        RAISE EXCEPTION 'loom''s change feed does not run on Citus: its positions follow one server''s transactions'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Read each execution with watch_events, or run the feed on a node that is not distributed (docs/feed.md).';
    END IF;
    PERFORM @extschema@.loom_feed_add_columns();
    -- Built once, over the whole log (appends wait for it): docs/feed.md
    -- says how to build it first without stopping them, and one such
    -- build that failed half way (an invalid index) is built again.
    IF NOT coalesce((SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass('loom.events_feed_position')), true) THEN
        DROP INDEX loom.events_feed_position;
    END IF;
    IF to_regclass('loom.events_feed_position') IS NULL THEN
        CREATE INDEX events_feed_position ON loom.events (feed_tx, feed_ord) WHERE feed_tx IS NOT NULL;
    END IF;
    INSERT INTO loom.feed_state AS s (enabled, notify) VALUES (true, coalesce(loom_feed_enable.notify, false))
    ON CONFLICT ON CONSTRAINT feed_state_pkey DO UPDATE SET enabled = true, notify = excluded.notify;
    -- After a restore into a new cluster (which status tells the owner to
    -- run this for): a new era at once, so the restored positions are
    -- readable before the first append and new ones sort after them.
    offset_now := @extschema@.loom_feed_new_era();
    -- The high water mark's newest is all it needs.
    DELETE FROM loom.feed_high_water h
    WHERE h.feed_tx < (SELECT g.feed_tx FROM loom.feed_high_water g ORDER BY g.feed_tx DESC LIMIT 1);
    IF NOT @extschema@.loom_feed_is_on() OR offset_now IS DISTINCT FROM offset_before THEN
        EXECUTE format('ALTER TABLE loom.events
                            ALTER COLUMN feed_tx SET DEFAULT (pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.int8 OPERATOR(pg_catalog.+) %s::pg_catalog.int8),
                            ALTER COLUMN feed_ord SET DEFAULT pg_catalog.nextval(''loom.feed_ord_seq''::pg_catalog.regclass)',
                       offset_now);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = 'loom.events'::regclass AND t.tgname = 'events_feed_deleted') THEN
        CREATE TRIGGER events_feed_deleted AFTER DELETE ON loom.events
            REFERENCING OLD TABLE AS loom_feed_deleted
            FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_feed();
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = 'loom.events'::regclass AND t.tgname = 'events_feed_truncated') THEN
        CREATE TRIGGER events_feed_truncated BEFORE TRUNCATE ON loom.events
            FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_feed();
    END IF;
    IF to_regclass('loom.sql_only') IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = 'loom.events'::regclass AND t.tgname = 'events_feed_guard') THEN
        CREATE TRIGGER events_feed_guard AFTER INSERT ON loom.events
            FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_feed();
    END IF;
    IF coalesce(loom_feed_enable.notify, false) THEN
        IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = 'loom.events'::regclass AND t.tgname = 'events_feed_notify') THEN
            CREATE TRIGGER events_feed_notify AFTER INSERT ON loom.events
                FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_feed();
        END IF;
    ELSIF EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = 'loom.events'::regclass AND t.tgname = 'events_feed_notify') THEN
        DROP TRIGGER events_feed_notify ON loom.events;
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_enable(boolean) IS
'Turns the change feed on: from now every append gives its events positions (loom.events.feed_tx and feed_ord, by their defaults), and, with notify, sends NOTIFY loom_feed, with an empty payload, at commit. The first time, adds the two columns if an update could not, and builds their index over the whole log. Moves the feed to a new era when it finds positions from a restored cluster above what this one''s transaction ids reach, so they are readable at once. 0A000 on Citus; 55P03 when appends hold loom.events for over 5 s. Idempotent; the owner''s to call.';

CREATE FUNCTION @extschema@.loom_feed_disable()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
DECLARE
    newest bigint;
    trigger_name name;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'loom_feed_disable runs in READ COMMITTED only: an older snapshot would miss the newest positions'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    IF @extschema@.loom_feed_is_on() THEN
        ALTER TABLE loom.events ALTER COLUMN feed_tx DROP DEFAULT, ALTER COLUMN feed_ord DROP DEFAULT;
    END IF;
    IF to_regclass('loom.events_feed_position') IS NOT NULL THEN
        -- Every position handed out (read under the lock the ALTER took,
        -- so none comes after it), deleted later or not: a restore's new
        -- era starts above it.
        newest := @extschema@.loom_feed_newest();
        IF newest IS NOT NULL THEN
            INSERT INTO loom.feed_high_water (feed_tx) VALUES (newest);
        END IF;
    END IF;
    FOR trigger_name IN
        SELECT t.tgname FROM pg_trigger t WHERE t.tgrelid = 'loom.events'::regclass
        AND t.tgname IN ('events_feed_notify', 'events_feed_deleted', 'events_feed_truncated', 'events_feed_guard')
    LOOP
        EXECUTE format('DROP TRIGGER %I ON loom.events', trigger_name);
    END LOOP;
    UPDATE loom.feed_state s SET enabled = false, notify = false;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_disable() IS
'Turns the change feed off: appends give no positions any more (readers keep what was written; the index stays, for them and for the next loom_feed_enable). 55P03 when appends hold loom.events for over 5 s. The owner''s to call.';

-- Whether a reader has positions to read: none where the feed was never
-- on (no settings, no index: and no scan of the log). After a restore
-- (its index, and for the SQL-only flavour its offset, not carried), until
-- the owner runs loom_feed_enable: refused (55000), not read past what
-- comes later, nor taken for an empty feed. And a reader going on after
-- a position past every one this database knows (kept from before a
-- restore whose events after it were deleted, or made up): what comes
-- next would sort below it, so it is refused, not read past.
CREATE FUNCTION @extschema@.loom_feed_readable(after_tx bigint DEFAULT -1)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    newest bigint;
BEGIN
    IF to_regclass('loom.events_feed_position') IS NULL THEN
        IF EXISTS (SELECT FROM loom.feed_state) THEN
            RAISE EXCEPTION 'the change feed has no index here: it was restored, and not turned on again since'
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'As loom''s owner: SELECT @extschema@.loom_feed_enable(); before anything is appended.';
        END IF;
        RETURN false;
    END IF;
    newest := @extschema@.loom_feed_newest();
    IF @extschema@.loom_feed_restored(newest) THEN
        RAISE EXCEPTION 'the change feed was restored into another cluster and not turned on there since: new positions would sort below the restored ones'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'As loom''s owner: SELECT @extschema@.loom_feed_enable(); before anything is appended.';
    END IF;
    IF after_tx > coalesce(newest, -1) THEN
        RAISE EXCEPTION 'a feed position of transaction % is past every position this database holds', after_tx
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Read on from loom_feed_head() (or from the start); events after it here would never reach this reader.';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_readable(bigint) IS
'Whether the change feed has positions to read (false: it was never on); 55000 after a restore until loom_feed_enable() runs, and for a position (its transaction half, after_tx) past every one this database holds. What loom_feed_read and loom_feed_head check first.';

-- Up to max_count events after a position, in order, only below the
-- oldest transaction still in progress: what a reader sees there will
-- never change (an event deleted since is simply not there).
CREATE FUNCTION @extschema@.loom_feed_read(after text DEFAULT NULL, max_count integer DEFAULT 1000)
RETURNS TABLE(feed_position text, execution_id text, sequence bigint, kind text, payload jsonb, metadata jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    start record;
    horizon bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_count);
    IF max_count > 10000 THEN
        RAISE EXCEPTION 'a feed page holds at most 10000 events, not %', max_count USING ERRCODE = 'invalid_parameter_value';
    END IF;
    start := @extschema@.loom_feed_parse_position(after);
    IF NOT @extschema@.loom_feed_readable(start.feed_tx) THEN
        RETURN;
    END IF;
    horizon := pg_snapshot_xmin(pg_current_snapshot())::text::bigint + coalesce((SELECT s.tx_offset FROM loom.feed_state s), 0);
    RETURN QUERY
    SELECT @extschema@.loom_feed_position(e.feed_tx, e.feed_ord), e.execution_id::text, e.sequence, e.kind, e.payload, e.metadata, e.created_at
    FROM loom.events e
    WHERE e.feed_tx IS NOT NULL AND (e.feed_tx, e.feed_ord) > (start.feed_tx, start.ord) AND e.feed_tx < horizon
    ORDER BY e.feed_tx, e.feed_ord LIMIT max_count;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_read(text, integer) IS
'Up to max_count (1-10000) events after the position after (NULL: from the first), in position order, each with its position: only those no transaction in progress can come before, so a reader that goes on from the last position it read never skips one. LM002 for a malformed position; 55000 after a restore until loom_feed_enable() runs, and for a position past every one this database holds. Needs SELECT on loom.events, loom.feed_state and loom.feed_high_water (readers).';

-- The last position readable now: where a consumer that wants only what
-- comes next starts.
CREATE FUNCTION @extschema@.loom_feed_head()
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    horizon bigint := pg_snapshot_xmin(pg_current_snapshot())::text::bigint + coalesce((SELECT s.tx_offset FROM loom.feed_state s), 0);
BEGIN
    IF NOT @extschema@.loom_feed_readable() THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT @extschema@.loom_feed_position(e.feed_tx, e.feed_ord) FROM loom.events e
            WHERE e.feed_tx IS NOT NULL AND e.feed_tx < horizon ORDER BY e.feed_tx DESC, e.feed_ord DESC LIMIT 1);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_head() IS
'The last position readable now (NULL: none yet): a consumer created at it reads only what comes after. 55000 after a restore until loom_feed_enable() runs. Needs SELECT on loom.events, loom.feed_state and loom.feed_high_water (readers).';

CREATE FUNCTION @extschema@.loom_feed_create_consumer(consumer text, start_after text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    result text;
BEGIN
    IF consumer IS NULL OR consumer = '' THEN
        RAISE EXCEPTION 'a feed consumer needs a name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.loom_feed_parse_position(start_after);
    INSERT INTO loom.feed_consumers AS c (name, owner_role, position)
    SELECT consumer, r.oid::regrole, coalesce(start_after, '') FROM pg_roles r WHERE r.rolname = current_user
    ON CONFLICT ON CONSTRAINT feed_consumers_pkey DO NOTHING;
    SELECT c.position INTO result FROM loom.feed_consumers c WHERE c.name = consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'feed consumer % belongs to another role', quote_literal(consumer)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN result;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_create_consumer(text, text) IS
'Creates a named consumer of the change feed, owned by the calling role, starting after start_after (NULL: from the first position; loom_feed_head(): from now), unless it exists; returns its acknowledged position. 42501 when another role owns the name. Needs INSERT on loom.feed_consumers (writers).';

CREATE FUNCTION @extschema@.loom_feed_next(consumer text, max_count integer DEFAULT 1000)
RETURNS TABLE(feed_position text, execution_id text, sequence bigint, kind text, payload jsonb, metadata jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    acked text;
BEGIN
    SELECT c.position INTO acked FROM loom.feed_consumers c WHERE c.name = consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no feed consumer % (or it belongs to another role)', coalesce(quote_literal(consumer), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    RETURN QUERY SELECT * FROM @extschema@.loom_feed_read(acked, max_count);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_next(text, integer) IS
'The next batch of a consumer: up to max_count events after its acknowledged position, as loom_feed_read reads them. Reading moves nothing: acknowledge with loom_feed_ack once processed. 42704 for a consumer this role cannot see.';

-- Acknowledges a consumer's position: never backwards (an ack of an
-- older position, a redelivery's, changes nothing), and, given expected,
-- only from that position (LM003 otherwise): two processes sharing a
-- consumer cannot both move it.
CREATE FUNCTION @extschema@.loom_feed_ack(consumer text, feed_position text, expected text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_position text;
BEGIN
    IF feed_position IS NULL OR feed_position = '' THEN
        RAISE EXCEPTION 'loom_feed_ack needs a position' USING ERRCODE = 'LM002';
    END IF;
    PERFORM @extschema@.loom_feed_parse_position(feed_position);
    PERFORM @extschema@.loom_feed_parse_position(expected);
    SELECT c.position INTO current_position FROM loom.feed_consumers c WHERE c.name = consumer FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no feed consumer % (or it belongs to another role)', coalesce(quote_literal(consumer), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    IF expected IS NOT NULL AND expected <> current_position THEN
        RAISE EXCEPTION 'feed consumer % is at %, not at the expected %', quote_literal(consumer),
                coalesce(nullif(current_position, ''), 'the start'), coalesce(nullif(expected, ''), 'the start')
            USING ERRCODE = 'LM003';
    END IF;
    IF feed_position > current_position THEN
        UPDATE loom.feed_consumers c SET position = feed_position, acked_at = statement_timestamp()
        WHERE c.name = consumer;
        RETURN feed_position;
    END IF;
    RETURN current_position;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_ack(text, text, text) IS
'Moves a consumer''s acknowledged position forward to feed_position (never back) and returns it; given expected, only from that position (LM003 otherwise). LM002 for a malformed position, 42704 for a consumer this role cannot see. Needs UPDATE on loom.feed_consumers (writers).';

CREATE FUNCTION @extschema@.loom_feed_drop_consumer(consumer text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM loom.feed_consumers c WHERE c.name = consumer;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_drop_consumer(text) IS
'Drops a consumer this role owns (or may act as); returns whether there was one. Needs DELETE on loom.feed_consumers (writers).';
