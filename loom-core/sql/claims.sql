-- Claims with fencing (issue 38; docs/claims.md): which executions a
-- worker should run now, and a token that stops a worker that lost its
-- turn from writing.
--
-- One row per execution that was ever scheduled. due_at is when it may
-- next be claimed: a schedule sets it (now, or a timer's time), a claim
-- moves it to the end of the lease, so a lease that lapses is simply due
-- again, and a complete clears it (or sets the next timer). So one index,
-- (queue, due_at), serves every claim, and a held row costs a claim
-- nothing: it is not due. Each claim takes a new fencing token from one
-- sequence (loom.claims_fence_seq), so tokens only grow, per execution
-- and across executions, and an id deleted and used again never meets an
-- old token; a write that carries a token (loom_check_fence) is refused
-- with LM001 once a newer one exists. A schedule while the row is held (a
-- signal arriving while a worker runs it) is kept in wake_at and becomes
-- due_at when the holder completes: no wake-up is lost and no lease is
-- stolen.
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

-- The bounds every claims function checks the same way: a lease between
-- a second and a day, a batch between 1 and 1000.
CREATE FUNCTION @extschema@.loom_check_claim_arguments(queue text, lease interval, max_count integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queue IS NULL OR queue = '' THEN
        RAISE EXCEPTION 'a claims queue needs a name, not %', coalesce(quote_literal(queue), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease < interval '1 second' OR lease > interval '1 day' THEN
        RAISE EXCEPTION 'a lease lasts from 1 second to 1 day, not %', coalesce(lease::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_count IS NULL OR max_count < 1 OR max_count > 1000 THEN
        RAISE EXCEPTION 'a claim takes from 1 to 1000 executions, not %', coalesce(max_count::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_check_claim_arguments(text, interval, integer) IS
'22023 unless queue is a non-empty name, lease lasts from 1 second to 1 day and max_count is from 1 to 1000: the checks loom_claim and loom_renew share.';

-- The error a write carrying a stale token gets: LM001, one SQLSTATE for
-- every fenced path (pgloom's Error::FencedOut), its message saying why
-- from the claim as it is now.
CREATE FUNCTION @extschema@.loom_fenced_out(execution_id text, fence bigint)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_fence bigint;
    held boolean;
    why text;
BEGIN
    SELECT c.fence, c.holder IS NOT NULL INTO current_fence, held FROM loom.claims c
    WHERE c.execution_id = loom_fenced_out.execution_id;
    why := CASE WHEN current_fence IS NULL THEN 'was never claimed'
                WHEN current_fence > fence THEN format('was claimed again since (token %s)', current_fence)
                WHEN current_fence < fence THEN format('has no such token (its newest is %s)', current_fence)
                WHEN NOT held THEN 'was completed under that token'
                ELSE 'changed while the call ran'
           END;
    RAISE EXCEPTION 'execution %: fencing token % is not a claim this worker holds: the execution %', quote_literal(execution_id), fence, why
        USING ERRCODE = 'LM001',
              HINT = 'Stop working on the execution: another worker holds it, or none does.';
END
$$;
COMMENT ON FUNCTION @extschema@.loom_fenced_out(text, bigint) IS
'Raises LM001 for a fencing token that is not a claim its caller holds, saying why from the claim as it is now (never claimed, claimed again, no such token, completed).';

-- Marks an execution runnable at a time (now by default): a new row, or
-- an earlier due_at for one not held (a later time never postpones a
-- wake-up already due: the holder reschedules itself through
-- loom_complete). While a worker holds it (its lease live or lapsed), the
-- time is kept in wake_at: the execution is due again when the holder
-- completes; a worker that takes a lapsed lease over runs one already due
-- and keeps a later one. An execution stays in the queue it was first
-- scheduled in (queue, NULL for 'default', names a new one's): a signal
-- from another queue's worker never moves it. Takes the
-- execution's write lock first, as an append does, so a retention sweep
-- (which never deletes a scheduled execution) sees it or runs before it.
CREATE FUNCTION @extschema@.loom_schedule(execution_id text, run_at timestamptz DEFAULT NULL, queue text DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    run_time timestamptz := coalesce(run_at, statement_timestamp());
    result timestamptz;
BEGIN
    IF execution_id IS NULL OR execution_id = '' THEN
        RAISE EXCEPTION 'loom_schedule needs an execution id' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.loom_check_claim_arguments(coalesce(queue, 'default'), interval '1 minute', 1);
    IF run_time = 'infinity' OR run_time = '-infinity' THEN
        RAISE EXCEPTION 'loom_schedule needs a finite time, not %', run_time USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.loom_lock_execution_for_write(execution_id);
    INSERT INTO loom.claims AS c (execution_id, queue, due_at)
    VALUES (execution_id, coalesce(queue, 'default'), run_time)
    ON CONFLICT ON CONSTRAINT claims_pkey DO UPDATE
    SET due_at = CASE WHEN c.holder IS NULL THEN least(c.due_at, excluded.due_at) ELSE c.due_at END,
        wake_at = CASE WHEN c.holder IS NOT NULL THEN least(c.wake_at, excluded.due_at) ELSE c.wake_at END
    RETURNING CASE WHEN c.holder IS NOT NULL AND c.due_at > statement_timestamp() THEN c.wake_at ELSE c.due_at END
    INTO result;
    RETURN result;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_schedule(text, timestamptz, text) IS
'Marks an execution runnable at run_at (NULL: now): it becomes claimable then. queue (NULL: ''default'') is a new execution''s; one scheduled before stays in its queue. An execution not held keeps the earlier of its due time and run_at; one a worker holds keeps the time and is due again once the holder completes (a worker that takes a lapsed lease over runs a wake-up already due, and keeps a later one). Returns when it will be due. Needs INSERT and UPDATE on loom.claims (writers).';

-- Claims up to max_count due executions of a queue for worker, for lease:
-- the oldest due first, each row locked SKIP LOCKED so that workers never
-- wait on each other, its fence bumped. A lapsed lease is due (its
-- due_at is the lease's end), so it is claimed like any other.
CREATE FUNCTION @extschema@.loom_claim(queue text, worker text, lease interval, max_count integer DEFAULT 1)
RETURNS TABLE(execution_id text, fence bigint, lease_until timestamptz, was_due_at timestamptz, lapsed_holder text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Both statements' plans are made once per session and kept (a claim is
-- the hot path): PostgreSQL would otherwise plan them at every call,
-- because LIMIT max_count's default estimate (a tenth of the table) makes
-- the kept plan look dear. And each is pinned to its index walk (the due
-- index, then the primary key for each row): a plan kept from a session's
-- first claim on a small table would otherwise scan the whole table at
-- every claim once it has grown, until it is next analyzed.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    ids text[];
    dues timestamptz[];
    holders text[];
BEGIN
    -- The shared checks only when one fails: a claim is the hot path.
    IF queue IS NULL OR queue = '' OR lease IS NULL OR lease < interval '1 second' OR lease > interval '1 day'
       OR max_count IS NULL OR max_count < 1 OR max_count > 1000 THEN
        PERFORM @extschema@.loom_check_claim_arguments(queue, lease, max_count);
    END IF;
    IF worker IS NULL OR worker = '' THEN
        RAISE EXCEPTION 'loom_claim needs a worker name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The due executions, oldest first, locked (skipping those another
    -- worker is claiming), with what they were: then each updated by its
    -- key, under the lock this transaction holds.
    SELECT array_agg(d.execution_id), array_agg(d.due_at), array_agg(d.holder) INTO ids, dues, holders
    FROM (SELECT c.execution_id, c.due_at, c.holder
          FROM loom.claims c
          WHERE c.queue = loom_claim.queue AND c.due_at <= statement_timestamp()
          ORDER BY c.due_at
          LIMIT max_count
          FOR UPDATE SKIP LOCKED) d;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE loom.claims c
    SET fence = nextval('loom.claims_fence_seq'), holder = worker, due_at = statement_timestamp() + lease,
        claimed_at = statement_timestamp(),
        -- A wake-up already due is this run's; a later one (a timer set
        -- while a lapsed holder held it) is kept for when this one ends.
        wake_at = CASE WHEN c.wake_at > statement_timestamp() THEN c.wake_at END
    FROM unnest(ids, dues, holders) AS due(execution_id, due_at, holder)
    WHERE c.execution_id = due.execution_id
    RETURNING c.execution_id, c.fence, c.due_at, due.due_at, due.holder;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_claim(text, text, interval, integer) IS
'Claims up to max_count (1-1000) executions of queue that are due (scheduled for now or earlier, or held under a lease that lapsed), oldest first, for worker, for lease (1 second to 1 day): each gets a new fencing token, higher than every earlier one (a wake-up already due that a lapsed holder kept is this run''s; a later one is kept). Workers never wait on each other (SKIP LOCKED). Returns each with its token, when its lease ends, when it was due and the worker whose lease lapsed (NULL for none). Needs UPDATE on loom.claims (writers).';

-- The holder's own checks: its token is the newest and still held. FOR
-- KEY SHARE holds the row until the caller's transaction ends, so a claim
-- (which locks it FOR UPDATE, SKIP LOCKED) cannot take a new token between
-- this check and the caller's commit; renewals and completions (FOR NO
-- KEY UPDATE) do not conflict with it, so a worker renewing from another
-- connection while its write is open never waits on itself. And the
-- transaction may idle no longer than the lease lasts (what is left of
-- it, or its length since the claim, the longer: renewals from another
-- connection extend it; idle_in_transaction_session_timeout, for this
-- transaction): a worker paused inside it (a GC pause, SIGSTOP) loses its
-- session, and its lock, instead of keeping the execution from every
-- other worker for ever.
CREATE FUNCTION @extschema@.loom_check_fence(execution_id text, fence bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_fence bigint;
    held boolean;
    lease_end timestamptz;
    lease_start timestamptz;
    left_ms bigint;
    idle_ms bigint;
BEGIN
    IF execution_id IS NULL OR fence IS NULL THEN
        RAISE EXCEPTION 'loom_check_fence needs an execution id and a token' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.fence, c.holder IS NOT NULL, c.due_at, c.claimed_at INTO current_fence, held, lease_end, lease_start FROM loom.claims c
    WHERE c.execution_id = loom_check_fence.execution_id FOR KEY SHARE;
    IF current_fence IS DISTINCT FROM fence OR NOT held THEN
        PERFORM @extschema@.loom_fenced_out(execution_id, fence);
    END IF;
    left_ms := least(86400000, greatest(1000, ceil(extract(epoch FROM greatest(lease_end - clock_timestamp(), lease_end - lease_start)) * 1000)))::bigint;
    idle_ms := (SELECT s.setting::bigint FROM pg_settings s WHERE s.name = 'idle_in_transaction_session_timeout');
    IF idle_ms = 0 OR idle_ms > left_ms THEN
        PERFORM set_config('idle_in_transaction_session_timeout', left_ms::text, true);
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_check_fence(text, bigint) IS
'Refuses (LM001) unless fence is the execution''s newest fencing token and its claim is still held (not completed), and holds the claim (FOR KEY SHARE) to the end of the transaction, so no claim can pass it before the caller commits; the transaction may then idle no longer than the lease (what is left of it or its length since the claim, the longer; idle_in_transaction_session_timeout, at least 1 s). Call it first in the transaction of each append, snapshot save or ref put a worker makes under a claim. Needs UPDATE on loom.claims (writers).';

-- Extends a lease: refused (LM001) once another worker holds a newer
-- token. A lease that lapsed but was not claimed again is renewed.
CREATE FUNCTION @extschema@.loom_renew(execution_id text, fence bigint, lease interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    renewed timestamptz;
BEGIN
    PERFORM @extschema@.loom_check_claim_arguments('renew', lease, 1);
    IF execution_id IS NULL OR fence IS NULL THEN
        RAISE EXCEPTION 'loom_renew needs an execution id and a token' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE loom.claims c SET due_at = greatest(c.due_at, statement_timestamp() + lease)
    WHERE c.execution_id = loom_renew.execution_id AND c.fence = loom_renew.fence AND c.holder IS NOT NULL
    RETURNING c.due_at INTO renewed;
    IF renewed IS NULL THEN
        PERFORM @extschema@.loom_fenced_out(execution_id, fence);
    END IF;
    RETURN renewed;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_renew(text, bigint, interval) IS
'Extends the holder''s lease to at least now + lease and returns its end; LM001 once the execution was claimed again (a newer token) or completed. Needs UPDATE on loom.claims (writers).';

-- Ends a claim: the execution is no longer held, and is due again at
-- next_run_at, or at a wake-up that arrived while it was held, whichever
-- is first; with neither, it waits for the next loom_schedule.
CREATE FUNCTION @extschema@.loom_complete(execution_id text, fence bigint, next_run_at timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found_row boolean;
    next_due timestamptz;
BEGIN
    IF execution_id IS NULL OR fence IS NULL THEN
        RAISE EXCEPTION 'loom_complete needs an execution id and a token' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF next_run_at = 'infinity' OR next_run_at = '-infinity' THEN
        RAISE EXCEPTION 'loom_complete needs a finite next run time, not %', next_run_at USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE loom.claims c
    SET holder = NULL, claimed_at = NULL, wake_at = NULL,
        due_at = CASE WHEN next_run_at IS NULL THEN c.wake_at
                      WHEN c.wake_at IS NULL THEN next_run_at
                      ELSE least(next_run_at, c.wake_at) END
    WHERE c.execution_id = loom_complete.execution_id AND c.fence = loom_complete.fence AND c.holder IS NOT NULL
    RETURNING true, c.due_at INTO found_row, next_due;
    IF found_row IS NULL THEN
        PERFORM @extschema@.loom_fenced_out(execution_id, fence);
    END IF;
    RETURN next_due;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_complete(text, bigint, timestamptz) IS
'Ends the holder''s claim: the execution is due again at next_run_at or at a wake-up scheduled while it was held, the earlier of them, and otherwise only once loom_schedule is called again. Returns when it is next due (NULL: not scheduled). LM001 once the execution was claimed again or completed. Needs UPDATE on loom.claims (writers).';

-- What loom status prints about claims: counted, not estimated (a claims
-- table holds the executions in flight, not the history); a role that
-- may not read loom.claims gets NULLs.
CREATE FUNCTION @extschema@.loom_claim_counts()
RETURNS TABLE(queue text, due bigint, claimed bigint, lapsed bigint, scheduled bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT c.queue,
           count(*) FILTER (WHERE c.holder IS NULL AND c.due_at <= statement_timestamp()),
           count(*) FILTER (WHERE c.holder IS NOT NULL AND c.due_at > statement_timestamp()),
           count(*) FILTER (WHERE c.holder IS NOT NULL AND c.due_at <= statement_timestamp()),
           count(*) FILTER (WHERE c.holder IS NULL AND c.due_at > statement_timestamp())
    FROM loom.claims c
    WHERE c.due_at IS NOT NULL
    GROUP BY c.queue
    ORDER BY c.queue;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_claim_counts() IS
'Per queue, the executions due now and unclaimed, claimed under a live lease, claimed under a lease that lapsed (claimable again), and scheduled for later. Needs SELECT on loom.claims (readers).';
