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
-- Opt-in (loom_feed_enable, the owner's): the feed is a statement trigger
-- on loom.events that writes one row per event to loom.feed, so appends
-- pay for it only where it is on.
--
-- Positions are 32 hexadecimal digits: the transaction (plus the feed's
-- offset, below) and the order, 16 each, so that text order is position
-- order. pg_upgrade keeps transaction ids, so positions go on after it. A
-- dump restored into a new cluster starts its ids again from low numbers:
-- the first write there sees committed positions at or above what the
-- cluster's ids can reach, and moves the offset past them (a new era),
-- so new positions stay above every restored one.
--
-- The feed is on while its trigger (events_feed) is there; loom.feed_state
-- has its one row from the first loom_feed_enable on, and a dump carries
-- it (its offset, its era, whether it was on). A dump does not carry the
-- trigger: after a restore, loom_feed_enable() again, as loom status says
-- (enabled, and no trigger).
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

CREATE SEQUENCE loom.feed_ord_seq AS bigint;
CREATE TABLE loom.feed (
    feed_tx bigint NOT NULL,
    ord bigint NOT NULL DEFAULT nextval('loom.feed_ord_seq'),
    execution_id text COLLATE "C" NOT NULL,
    sequence bigint NOT NULL,
    -- The event's own created_at: a reader joins on it too, so an id
    -- deleted and used again never brings its new events out at the old
    -- events' positions.
    event_created_at timestamptz NOT NULL,
    CONSTRAINT feed_pkey PRIMARY KEY (feed_tx, ord)
);
ALTER SEQUENCE loom.feed_ord_seq OWNED BY loom.feed.ord;
COMMENT ON TABLE loom.feed IS 'The change feed: one row per event appended while the feed is on, at its position (the writing transaction, then the order in it). Read with loom_feed_read or a consumer''s loom_feed_next; never write it.';

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
        PERFORM pg_catalog.pg_extension_config_dump('loom.feed', '');
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

-- A new era: the offset that puts this transaction (xid) above every
-- position there is, kept in loom.feed_state (the larger of it and the
-- one there, when two sessions of a restored cluster race). Called by the
-- trigger and by loom_feed_enable when a position is at or past what
-- this cluster's transaction ids reach.
CREATE FUNCTION @extschema@.loom_feed_new_era(xid bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    offset_now bigint;
BEGIN
    INSERT INTO loom.feed_state AS s (tx_offset, era)
    VALUES ((SELECT max(f.feed_tx) FROM loom.feed f) + 1 - xid, 2)
    ON CONFLICT ON CONSTRAINT feed_state_pkey DO UPDATE
    SET tx_offset = greatest(s.tx_offset, excluded.tx_offset), era = s.era + 1
    RETURNING s.tx_offset INTO offset_now;
    RETURN offset_now;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_new_era(bigint) IS
'Moves the change feed to a new era, whose positions for transaction xid on sort above every position there is (after a restore into a new cluster); returns the new offset. The owner''s.';

-- The trigger's function: one row in loom.feed per event the statement
-- inserted. SECURITY DEFINER (writers need no grant on loom.feed), and,
-- like loom's other trigger function, it checks how it was called.
CREATE FUNCTION @extschema@.loom_events_feed()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    offset_now bigint;
    notify boolean;
    newest bigint;
    xid bigint := pg_current_xact_id()::text::bigint;
BEGIN
    IF NOT (TG_TABLE_SCHEMA = 'loom' AND TG_TABLE_NAME = 'events' AND TG_WHEN = 'AFTER' AND TG_LEVEL = 'STATEMENT'
            AND TG_OP = 'INSERT' AND TG_NAME = 'events_feed') THEN
        RAISE EXCEPTION 'loom_events_feed() only feeds loom.events, not %.% (trigger %)', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A restore into a new cluster: a committed position this cluster's
    -- transaction ids cannot reach yet. Every row this statement sees was
    -- written by a transaction below its snapshot's xmax (the latest
    -- completed one's id plus one), or by this one, whose id may be above
    -- it: neither is at or past the larger of the two. The newest visible
    -- position is one backward descent of feed_pkey, read with the
    -- settings in one statement with no parameter (a generic plan for
    -- "feed_tx >= $1" would scan the table).
    SELECT s.tx_offset, s.notify, (SELECT f.feed_tx FROM loom.feed f ORDER BY f.feed_tx DESC LIMIT 1)
      INTO offset_now, notify, newest
    FROM (SELECT 1) one LEFT JOIN loom.feed_state s ON true;
    offset_now := coalesce(offset_now, 0);
    IF newest >= greatest(pg_snapshot_xmax(pg_current_snapshot())::text::bigint, xid + 1) + offset_now THEN
        offset_now := @extschema@.loom_feed_new_era(xid);
    END IF;
    INSERT INTO loom.feed (feed_tx, execution_id, sequence, event_created_at)
    SELECT xid + offset_now, i.execution_id, i.sequence, i.created_at
    FROM loom_feed_inserted i ORDER BY i.execution_id COLLATE "C", i.sequence;
    IF notify THEN
        PERFORM pg_notify('loom_feed', '');
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_events_feed() IS
'The change feed''s trigger function on loom.events (events_feed, created by loom_feed_enable): writes each inserted event''s position to loom.feed. Not callable.';

-- Creating or dropping the trigger locks loom.events against every
-- append: it waits at most 5 s behind open ones (55P03 then, and nothing
-- queues behind it longer).
CREATE FUNCTION @extschema@.loom_feed_enable(notify boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
DECLARE
    xid bigint;
BEGIN
    IF @extschema@.loom_is_distributed() THEN
        RAISE EXCEPTION 'loom''s change feed does not run on Citus: its positions follow one server''s transactions'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Read each execution with watch_events, or run the feed on a node that is not distributed (docs/feed.md).';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = 'loom.events'::regclass AND t.tgname = 'events_feed') THEN
        CREATE TRIGGER events_feed AFTER INSERT ON loom.events
            REFERENCING NEW TABLE AS loom_feed_inserted
            FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.loom_events_feed();
    END IF;
    INSERT INTO loom.feed_state AS s (enabled, notify) VALUES (true, coalesce(loom_feed_enable.notify, false))
    ON CONFLICT ON CONSTRAINT feed_state_pkey DO UPDATE SET enabled = true, notify = excluded.notify;
    -- After a restore into a new cluster (which status tells the owner to
    -- run this for): a new era at once, so the restored positions are
    -- readable before the first append.
    xid := pg_current_xact_id()::text::bigint;
    IF (SELECT f.feed_tx FROM loom.feed f ORDER BY f.feed_tx DESC LIMIT 1)
       >= greatest(pg_snapshot_xmax(pg_current_snapshot())::text::bigint, xid + 1)
          + (SELECT s.tx_offset FROM loom.feed_state s) THEN
        PERFORM @extschema@.loom_feed_new_era(xid);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_enable(boolean) IS
'Turns the change feed on: from now every append writes its events'' positions to loom.feed (and, with notify, sends NOTIFY loom_feed, with an empty payload, at commit). Moves the feed to a new era when it finds positions from a restored cluster above what this one''s transaction ids reach, so they are readable at once. 0A000 on Citus; 55P03 when appends hold loom.events for over 5 s. Idempotent; the owner''s to call.';

CREATE FUNCTION @extschema@.loom_feed_disable()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
BEGIN
    DROP TRIGGER IF EXISTS events_feed ON loom.events;
    UPDATE loom.feed_state s SET enabled = false, notify = false;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_disable() IS
'Turns the change feed off: appends write no positions any more (readers keep what was written). 55P03 when appends hold loom.events for over 5 s. The owner''s to call.';

-- Up to max_count positions after a position, in order, only below the
-- oldest transaction still in progress: what a reader sees there will
-- never change. A position whose event was deleted since (retention)
-- comes with NULL kind, payload and created_at: a reader skips it and
-- goes on after it, so a run of deleted events never stalls it.
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
    horizon := pg_snapshot_xmin(pg_current_snapshot())::text::bigint + coalesce((SELECT s.tx_offset FROM loom.feed_state s), 0);
    RETURN QUERY
    SELECT @extschema@.loom_feed_position(f.feed_tx, f.ord), f.execution_id::text, f.sequence, e.kind, e.payload, e.metadata, e.created_at
    FROM (SELECT g.feed_tx, g.ord, g.execution_id, g.sequence, g.event_created_at FROM loom.feed g
          WHERE (g.feed_tx, g.ord) > (start.feed_tx, start.ord) AND g.feed_tx < horizon
          ORDER BY g.feed_tx, g.ord LIMIT max_count) f
    LEFT JOIN loom.events e ON e.execution_id = f.execution_id AND e.sequence = f.sequence
                           AND e.created_at = f.event_created_at
    ORDER BY f.feed_tx, f.ord;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_read(text, integer) IS
'Up to max_count (1-10000) events after the position after (NULL: from the first), in position order, each with its position: only those no transaction in progress can come before, so a reader that goes on from the last position it read never skips one. An event deleted since comes with NULL kind, payload and created_at: skip it, and go on after its position. LM002 for a malformed position. Needs SELECT on loom.feed and loom.events (readers).';

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
    RETURN (SELECT @extschema@.loom_feed_position(f.feed_tx, f.ord) FROM loom.feed f
            WHERE f.feed_tx < horizon ORDER BY f.feed_tx DESC, f.ord DESC LIMIT 1);
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_head() IS
'The last position readable now (NULL: none yet): a consumer created at it reads only what comes after. Needs SELECT on loom.feed (readers).';

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

-- What no consumer needs any more: the rows at or before every
-- consumer's position, but never the last row, whose position a restore
-- into a new cluster must stay below (the new era starts above it). The
-- owner's: it must see every consumer's row, which row security hides
-- from any other role (42501 then).
CREATE FUNCTION @extschema@.loom_feed_trim(max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lowest record;
    deleted bigint;
BEGIN
    PERFORM @extschema@.loom_check_page_size(max_rows);
    IF row_security_active('loom.feed_consumers') THEN
        RAISE EXCEPTION 'loom_feed_trim must see every consumer, and row security hides other roles'' from %', current_user
            USING ERRCODE = 'insufficient_privilege', HINT = 'Run it as loom''s owner.';
    END IF;
    IF NOT EXISTS (SELECT FROM loom.feed_consumers) THEN
        RETURN 0;
    END IF;
    lowest := @extschema@.loom_feed_parse_position((SELECT min(c.position) FROM loom.feed_consumers c));
    DELETE FROM loom.feed f
    WHERE (f.feed_tx, f.ord) IN (SELECT g.feed_tx, g.ord FROM loom.feed g
                                 WHERE (g.feed_tx, g.ord) <= (lowest.feed_tx, lowest.ord)
                                   AND (g.feed_tx, g.ord) < (SELECT h.feed_tx, h.ord FROM loom.feed h
                                                             ORDER BY h.feed_tx DESC, h.ord DESC LIMIT 1)
                                 ORDER BY g.feed_tx, g.ord LIMIT max_rows);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_feed_trim(integer) IS
'Deletes at most max_rows feed rows at or before every consumer''s acknowledged position (none while there is no consumer), never the last row (a restore''s new era starts above it); returns how many. 42501 under row security (any role but the owner). Call it until it returns less than max_rows. The owner''s to call.';

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
'Drops a consumer this role owns (or may act as), so that it no longer holds back loom_feed_trim; returns whether there was one. Needs DELETE on loom.feed_consumers (writers).';
