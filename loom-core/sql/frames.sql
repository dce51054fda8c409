-- The snapshot frame (ADR 0141 D1) in SQL: decode in the server, so that
-- `state->'x'` works on a frame from psql, and encode there too. A frame
-- is a format byte, then the state's UTF-8 JSON text: 0x01 as it is, 0x02
-- as one zstd frame (level 3, content size and checksum declared), 0x03 as
-- a delta against a keyframe of the same execution (docs/frames.md).
--
-- These are the portable definitions, and the contract: the native
-- extension replaces the bodies of the first five with loom.so's C
-- (native/frames.sql), which is loom-core's codec. Here, in SQL and
-- PL/pgSQL alone, they do what they can without zstd: a 0x01 frame
-- decodes, frames and reports exactly as natively (the same text, byte
-- for byte, the same SQLSTATEs); a 0x02 frame's header is read and checked
-- exactly as natively (loom_snapshot_frame_info reports it, and a frame
-- loom-core would refuse before inflating is refused with the same
-- SQLSTATE), but inflating it, or writing one, is refused with
-- feature_not_supported (0A000): the client decodes and writes zstd frames
-- (pgloom's stores, resume, `loom snapshot show`).
--
-- Where the native error's SQLSTATE comes from PostgreSQL's own check here
-- (not UTF-8: 22021 from convert_from; not JSON: 22P02 from json_in), the
-- message is PostgreSQL's. No function here has an EXCEPTION block: one
-- would start a subtransaction per call, which PostgreSQL refuses inside a
-- parallel query, and these are PARALLEL SAFE.
--
-- The PL/pgSQL functions pin search_path to pg_catalog: their statements
-- are parsed when first called, under the caller's settings. They write a
-- backslash only in E'' literals, which read the same whatever
-- standard_conforming_strings is, and bytea constants with decode().

-- A frame's format byte, for every reader below: 1 (json), 2 (zstd) or 3
-- (delta). An empty frame and an unknown byte are refused here, with the
-- native SQLSTATEs and messages.
CREATE FUNCTION @extschema@.loom_frame_format(frame bytea) RETURNS integer
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    head integer;
BEGIN
    IF octet_length(frame) = 0 THEN
        RAISE EXCEPTION 'empty snapshot frame: a frame starts with a format byte'
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
    -- A slice: one TOAST chunk, not the whole frame.
    head := get_byte(substring(frame FROM 1 FOR 1), 0);
    IF head NOT IN (1, 2, 3) THEN
        RAISE EXCEPTION 'unknown snapshot frame format byte 0x%: written by a newer loom? this one reads 0x01 (json), 0x02 (zstd) and 0x03 (delta)',
                lpad(to_hex(head), 2, '0')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'upgrade loom on this server before reading frames a newer loom wrote';
    END IF;
    RETURN head;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_frame_format(bytea) IS
'The format byte of a snapshot frame: 1 (json), 2 (zstd) or 3 (delta). An empty frame is invalid_binary_representation (22P03), an unknown byte feature_not_supported (0A000). Internal: what every frame reader checks first.';

-- The keyframe a delta frame names: bytes 1-8 of a 0x03 frame, a
-- big-endian sequence (docs/frames.md). NULL for any other frame, and for
-- one too short to hold the header (decoding it says what is wrong). It
-- reads one TOAST chunk, not the frame: a join on it finds a delta's
-- keyframe by the primary key.
CREATE FUNCTION @extschema@.loom_snapshot_base_sequence(frame bytea) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE
        WHEN pg_catalog.substring(frame, 1, 1) OPERATOR(pg_catalog.<>) pg_catalog.decode('03', 'hex')
            OR pg_catalog.octet_length(frame) OPERATOR(pg_catalog.<) 25 THEN NULL
        ELSE ('x' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.substring(frame, 2, 8), 'hex'))::pg_catalog.bit(64)::pg_catalog.int8
    END;
COMMENT ON FUNCTION @extschema@.loom_snapshot_base_sequence(bytea) IS
'The sequence of the keyframe a delta snapshot frame (0x03) names, in the same execution; NULL for a keyframe (0x01, 0x02) and for anything shorter than a delta''s header.';

-- The zstd frame's header and block headers (RFC 8878 3.1.1), walked once
-- for both readers below as loom-core walks them before it inflates:
-- O(blocks), nothing inflated. A truncated frame, a reserved bit or block
-- type, an oversized block or bytes after the frame are refused here;
-- what a decoder refuses on policy (no checksum, over 256 MiB, a
-- dictionary) is returned for the caller to judge.
CREATE FUNCTION @extschema@.loom_zstd_frame_walk(payload bytea,
    OUT window_size bigint, OUT dictionary_id bigint, OUT content_size numeric,
    OUT has_checksum boolean, OUT max_output bigint)
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    pos integer;
    magic bigint;
    descriptor integer;
    single_segment boolean;
    width integer;
    block_limit bigint;
    block integer;
    block_size integer;
    stored integer;
    i integer;
    kind text;
BEGIN
    dictionary_id := 0;
    max_output := 0;
    n := octet_length(payload);
    IF n < 4 THEN
        RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd magic number'
            USING ERRCODE = 'data_corrupted';
    END IF;
    magic := get_byte(payload, 0) + get_byte(payload, 1) * 256 + get_byte(payload, 2) * 65536
             + get_byte(payload, 3)::bigint * 16777216;
    IF magic & 4294967280 = 407710288 THEN             -- 0x184D2A5?: skippable
        RAISE EXCEPTION 'snapshot frame 0x02 does not hold a zstd frame: a skippable frame'
            USING ERRCODE = 'invalid_binary_representation';
    ELSIF magic <> 4247762216 THEN                     -- 0xFD2FB528
        RAISE EXCEPTION 'snapshot frame 0x02 does not hold a zstd frame: no zstd magic number'
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
    pos := 4;
    IF pos + 1 > n THEN
        RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
            USING ERRCODE = 'data_corrupted';
    END IF;
    descriptor := get_byte(payload, pos);
    pos := pos + 1;
    single_segment := descriptor & 32 <> 0;
    has_checksum := descriptor & 4 <> 0;
    IF descriptor & 8 <> 0 THEN
        RAISE EXCEPTION 'snapshot frame is corrupt: the zstd frame header sets its reserved bit'
            USING ERRCODE = 'data_corrupted';
    END IF;
    IF NOT single_segment THEN
        IF pos + 1 > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        i := get_byte(payload, pos);
        pos := pos + 1;
        window_size := (1::bigint << (10 + (i >> 3)));
        window_size := window_size + (window_size / 8) * (i & 7);
    END IF;
    width := CASE descriptor & 3 WHEN 0 THEN 0 WHEN 1 THEN 1 WHEN 2 THEN 2 ELSE 4 END;
    IF width > 0 THEN
        IF pos + width > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        FOR i IN REVERSE width - 1 .. 0 LOOP
            dictionary_id := dictionary_id * 256 + get_byte(payload, pos + i);
        END LOOP;
        pos := pos + width;
    END IF;
    width := CASE descriptor >> 6
                 WHEN 0 THEN CASE WHEN single_segment THEN 1 ELSE 0 END
                 WHEN 1 THEN 2 WHEN 2 THEN 4 ELSE 8 END;
    IF width > 0 THEN
        IF pos + width > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the zstd frame header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        content_size := 0;
        FOR i IN REVERSE width - 1 .. 0 LOOP
            content_size := content_size * 256 + get_byte(payload, pos + i);
        END LOOP;
        IF width = 2 THEN
            content_size := content_size + 256;
        END IF;
        pos := pos + width;
    END IF;
    -- No block regenerates more than min(window, 128 KiB); a single-segment
    -- frame's window is its content.
    block_limit := least(coalesce(window_size::numeric, content_size, 131072), 131072);
    LOOP
        IF pos + 3 > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside a block header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        block := get_byte(payload, pos) + get_byte(payload, pos + 1) * 256
                 + get_byte(payload, pos + 2) * 65536;
        pos := pos + 3;
        block_size := block >> 3;
        CASE (block >> 1) & 3
            WHEN 0 THEN stored := block_size; max_output := max_output + block_size;
            WHEN 1 THEN stored := 1;          max_output := max_output + block_size;
            WHEN 2 THEN stored := block_size; max_output := max_output + block_limit;
            ELSE
                RAISE EXCEPTION 'snapshot frame is corrupt: a zstd block has the reserved block type'
                    USING ERRCODE = 'data_corrupted';
        END CASE;
        IF block_size > block_limit THEN
            RAISE EXCEPTION 'snapshot frame is corrupt: a zstd block claims % bytes, over the frame''s %-byte block limit',
                    block_size, block_limit
                USING ERRCODE = 'data_corrupted';
        END IF;
        IF pos + stored > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside a block'
                USING ERRCODE = 'data_corrupted';
        END IF;
        pos := pos + stored;
        EXIT WHEN block & 1 = 1;
    END LOOP;
    IF has_checksum THEN
        IF pos + 4 > n THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the content checksum'
                USING ERRCODE = 'data_corrupted';
        END IF;
        pos := pos + 4;
    END IF;
    IF pos < n THEN
        kind := 'trailing bytes';
        IF n - pos >= 4 THEN
            magic := get_byte(payload, pos) + get_byte(payload, pos + 1) * 256
                     + get_byte(payload, pos + 2) * 65536 + get_byte(payload, pos + 3)::bigint * 16777216;
            IF magic = 4247762216 THEN
                kind := 'a second zstd frame';
            ELSIF magic & 4294967280 = 407710288 THEN
                kind := 'a skippable frame';
            END IF;
        END IF;
        RAISE EXCEPTION '% after the zstd frame (% bytes at offset %): a loom frame holds exactly one zstd frame',
                kind, n - pos, pos
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
END
$$;
COMMENT ON FUNCTION @extschema@.loom_zstd_frame_walk(bytea) IS
'Internal to loom_snapshot_state_text and loom_snapshot_frame_info in SQL: walks a zstd frame''s header and block headers without inflating it, refusing a malformed frame with the SQLSTATE loom-core gives, and returns what the frame declares. Not part of the SQL API.';

CREATE FUNCTION @extschema@.loom_snapshot_state_text(frame bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    len integer := octet_length(frame);
    head integer;
    payload bytea;
    state text;
    -- What the zstd frame declares (loom_zstd_frame_walk).
    window_size bigint;
    dictionary_id bigint;
    content_size numeric;
    has_checksum boolean;
    max_output bigint;
    i integer;
BEGIN
    head := @extschema@.loom_frame_format(frame);
    IF head = 1 THEN
        IF len - 1 > 268435456 THEN
            RAISE EXCEPTION 'snapshot state too large: the frame declares % bytes, over the 268435456-byte limit', len - 1
                USING ERRCODE = 'program_limit_exceeded',
                      HINT = 'loom refuses states over 256 MiB so that a tampered row cannot exhaust memory';
        END IF;
        payload := substring(frame FROM 2);
        -- A NUL byte is UTF-8 but never JSON, and text cannot hold one.
        -- As loom-core names the cause: not UTF-8 if any other byte is not
        -- (convert_from raises 22021 on the payload with its NULs made
        -- 0x01: escape-encoded, backslashes first, so that every backslash
        -- left starts an octal escape), else not JSON.
        i := position(decode('00', 'hex') IN payload);
        IF i > 0 THEN
            state := convert_from(decode(replace(replace(encode(payload, 'escape'),
                                                         E'\\\\', E'\\134'),
                                                 E'\\000', E'\\001'), 'escape'), 'UTF8');
            RAISE EXCEPTION 'snapshot frame payload is not JSON: a NUL byte at byte %', i - 1
                USING ERRCODE = 'invalid_text_representation';
        END IF;
        state := convert_from(payload, 'UTF8');
        -- json_in checks without de-escaping: \u0000 and lone surrogates
        -- are JSON text, as loom-core reads them.
        PERFORM state::json;
        RETURN state;
    ELSIF head = 3 THEN
        RAISE EXCEPTION 'a delta snapshot frame (0x03) decodes only with its keyframe, which loom''s SQL-only flavour cannot do in the server'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'A delta is zstd against its keyframe''s text: the SQL-only flavour has no zstd.',
                  HINT = 'Decode it in the client (pgloom''s stores, resume, `loom snapshot show`), or install the native loom extension.';
    END IF;

    -- 0x02: the walk loom-core does before it inflates, so that a frame it
    -- would refuse is refused here with the same SQLSTATE.
    SELECT w.window_size, w.dictionary_id, w.content_size, w.has_checksum, w.max_output
      INTO window_size, dictionary_id, content_size, has_checksum, max_output
      FROM @extschema@.loom_zstd_frame_walk(substring(frame FROM 2)) w;
    -- What loom-core refuses before inflating, in its order.
    IF content_size > 268435456 THEN
        RAISE EXCEPTION 'snapshot state too large: the frame declares % bytes, over the 268435456-byte limit', content_size
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'loom refuses states over 256 MiB so that a tampered row cannot exhaust memory';
    ELSIF content_size > max_output THEN
        RAISE EXCEPTION 'snapshot frame is corrupt: the frame declares % bytes but its blocks can hold at most %',
                content_size, max_output
            USING ERRCODE = 'data_corrupted';
    ELSIF content_size IS NULL AND window_size > 4194304 THEN
        RAISE EXCEPTION 'zstd frame declares no content size and a %-byte window, over the 4194304-byte limit for such frames: loom always declares the size',
                window_size
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'loom refuses frames without a declared size whose window would be allocated outside PostgreSQL''s memory accounting';
    ELSIF dictionary_id <> 0 THEN
        RAISE EXCEPTION 'zstd frame needs dictionary %: loom never writes one, so the frame is not loom''s', dictionary_id
            USING ERRCODE = 'invalid_binary_representation';
    ELSIF NOT has_checksum THEN
        RAISE EXCEPTION 'zstd frame has no content checksum: loom always writes one, so the frame is not loom''s'
            USING ERRCODE = 'invalid_binary_representation';
    END IF;
    RAISE EXCEPTION 'loom''s SQL-only flavour cannot inflate a zstd snapshot frame (0x02) in the server'
        USING ERRCODE = 'feature_not_supported',
              DETAIL = 'The SQL-only flavour has no zstd: it decodes 0x01 (json) frames, and reads a 0x02 frame''s header only (loom_snapshot_frame_info).',
              HINT = 'Decode it in the client (pgloom''s stores, resume, `loom snapshot show`), or install the native loom extension.';
END
$$;

CREATE FUNCTION @extschema@.loom_snapshot_state(frame bytea) RETURNS jsonb
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_state_text(frame)::pg_catalog.jsonb;

-- Any frame with the keyframe it may name: a keyframe (0x01, 0x02) decodes
-- as above, base unused; a delta (0x03) against base, its keyframe's frame
-- as stored (loom.snapshots_decoded finds it). Here, without zstd, a delta
-- is refused as a 0x02 frame is; natively it is loom-core's decode, which
-- refuses a missing or wrong keyframe (XX001) and a delta of a delta
-- (22P03).
CREATE FUNCTION @extschema@.loom_snapshot_state_text(frame bytea, base bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF frame IS NULL THEN
        RETURN NULL;
    END IF;
    -- The one-argument reader refuses a delta with the SQL-only flavour's
    -- own error, and decodes a keyframe.
    RETURN @extschema@.loom_snapshot_state_text(frame);
END
$$;

CREATE FUNCTION @extschema@.loom_snapshot_state(frame bytea, base bytea) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_state_text(frame, base)::pg_catalog.jsonb;

-- The frame a delta store writes for state: a delta (0x03) against base,
-- the frame of the keyframe at base_sequence, unless the keyframe policy
-- (pgloom_core::frame::delta::KeyframePolicy: after 16 deltas, or a delta
-- over 40% of a keyframe's estimated size) or a missing base asks for a
-- keyframe, which is what codec 'zstd' writes. Natively only: here it is
-- refused after the checks a state passes, as codec 'zstd' is.
CREATE FUNCTION @extschema@.loom_snapshot_delta_frame(state text, base_sequence bigint, base bytea, deltas_since integer)
    RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF state IS NULL THEN
        RETURN NULL;
    END IF;
    IF octet_length(state) > 268435456 THEN
        RAISE EXCEPTION 'snapshot state too large: % bytes of JSON, over the 268435456-byte limit', octet_length(state)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    PERFORM state::json;
    RAISE EXCEPTION 'loom''s SQL-only flavour cannot compress a delta snapshot frame in the server'
        USING ERRCODE = 'feature_not_supported',
              DETAIL = 'A delta is zstd against its keyframe''s text: the SQL-only flavour has no zstd.',
              HINT = 'Save zstd frames from the client (pgloom''s stores), or install the native loom extension, which writes deltas.';
END
$$;

CREATE FUNCTION @extschema@.loom_snapshot_frame(state text, codec text DEFAULT 'zstd') RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The default collation, deterministic, whatever the argument's.
    codec_name text := codec;
    shown text;
BEGIN
    IF codec_name NOT IN ('none', 'zstd') THEN
        -- The name as loom-core's message writes it (Rust's {:?}).
        shown := replace(replace(replace(replace(replace(codec_name, E'\\', E'\\\\'), '"', E'\\"'),
                                         E'\n', E'\\n'), E'\r', E'\\r'), E'\t', E'\\t');
        IF shown ~ E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
            SELECT string_agg(CASE WHEN c ~ E'[\\x01-\\x1f\\x7f-\\x9f]'
                                   THEN E'\\u{' || to_hex(ascii(c)) || '}' ELSE c END, '' ORDER BY i)
              INTO shown
              FROM regexp_split_to_table(shown, '') WITH ORDINALITY AS s(c, i);
        END IF;
        RAISE EXCEPTION 'unknown snapshot codec "%": expected "none" or "zstd"', shown
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(state) > 268435456 THEN
        RAISE EXCEPTION 'snapshot state too large: % bytes of JSON, over the 268435456-byte limit', octet_length(state)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    -- A frame holds JSON and nothing else, so that it always decodes.
    PERFORM state::json;
    IF codec_name = 'zstd' THEN
        RAISE EXCEPTION 'loom''s SQL-only flavour cannot compress a snapshot frame with zstd in the server'
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'Natively, codec ''zstd'' gives 0x02, or 0x01 when zstd would not make the state smaller: without zstd, this flavour cannot tell which frame the native extension would write, so it writes none.',
                  HINT = 'Frame with codec ''none'' (0x01), frame in the client (pgloom''s stores), or install the native loom extension.';
    END IF;
    RETURN decode('01', 'hex') || convert_to(state, 'UTF8');
END
$$;

CREATE FUNCTION @extschema@.loom_snapshot_frame_info(frame bytea)
    RETURNS TABLE(format text, stored_bytes integer, declared_bytes bigint, has_checksum boolean)
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    len integer := octet_length(frame);
    head integer := @extschema@.loom_frame_format(frame);
    content_size numeric;
    base_bytes numeric;
BEGIN
    IF head = 1 THEN
        -- The text is not read: its length is what the frame declares.
        format := 'json';
        stored_bytes := len;
        declared_bytes := len - 1;
        has_checksum := false;
        RETURN NEXT;
        RETURN;
    ELSIF head = 3 THEN
        -- A delta's header as loom-core reads it first: whole, and naming
        -- a keyframe no larger than any state.
        IF len < 25 THEN
            RAISE EXCEPTION 'snapshot frame is truncated: it ends inside the delta header'
                USING ERRCODE = 'data_corrupted';
        END IF;
        base_bytes := ('x' || encode(substring(frame FROM 10 FOR 8), 'hex'))::bit(64)::bigint;
        IF base_bytes < 0 THEN
            base_bytes := base_bytes + 18446744073709551616;
        END IF;
        IF base_bytes > 268435456 THEN
            RAISE EXCEPTION 'snapshot state too large: the frame declares % bytes, over the 268435456-byte limit', base_bytes
                USING ERRCODE = 'program_limit_exceeded',
                      HINT = 'loom refuses states over 256 MiB so that a tampered row cannot exhaust memory';
        END IF;
    END IF;

    -- 0x02, or a delta's zstd frame: its header and block headers,
    -- nothing inflated; what a decoder refuses on policy (no checksum,
    -- over 256 MiB) is reported, not refused.
    SELECT w.content_size, w.has_checksum INTO content_size, has_checksum
      FROM @extschema@.loom_zstd_frame_walk(substring(frame FROM CASE head WHEN 3 THEN 26 ELSE 2 END)) w;
    format := CASE head WHEN 3 THEN 'delta' ELSE 'zstd' END;
    stored_bytes := len;
    -- A declared size past bigint (a foreign frame's) reads as its maximum.
    declared_bytes := CASE WHEN content_size > 9223372036854775807 THEN 9223372036854775807
                           ELSE content_size END;
    RETURN NEXT;
END
$$;

CREATE FUNCTION @extschema@.loom_snapshot_get_text(frame bytea, VARIADIC path text[]) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    len integer := octet_length(frame);
    payload bytea;
    state text;
    step text;
    value json;
    element numeric;
    digits text;
    steps text;
    i integer;
    found text;
    -- Where the state escapes \u0000 or a lone surrogate (see below).
    used text[];
    candidate text;
    high text;
    low text;
    escaped boolean := false;
    -- The walk (see below).
    kind text;
    budget bigint;
    spent bigint := 0;
    tokens text[];
    ends integer[];
    opened integer[];
    depth integer;
    here integer;
    j integer;
    parts text[];
    token text;
BEGIN
    -- A NULL step is NULL, whatever the frame holds, as natively: before
    -- the frame is read.
    FOREACH step IN ARRAY path LOOP
        IF step IS NULL THEN
            RETURN NULL;
        END IF;
    END LOOP;
    -- A 0x01 frame's text, checked as JSON once, by the cast below;
    -- anything else as loom_snapshot_state_text reads it (and refuses it).
    IF len > 1 AND len - 1 <= 268435456 AND get_byte(substring(frame FROM 1 FOR 1), 0) = 1 THEN
        payload := substring(frame FROM 2);
        IF position(decode('00', 'hex') IN payload) = 0 THEN
            state := convert_from(payload, 'UTF8');
        END IF;
    END IF;
    IF state IS NULL THEN
        state := @extschema@.loom_snapshot_state_text(frame);
    END IF;
    IF cardinality(path) = 0 THEN
        PERFORM state::json;
        RETURN btrim(state, E' \t\n\r');
    END IF;

    -- json's operators keep the value's own text, but they de-escape every
    -- string they pass, and refuse \u0000 and lone surrogates, which loom
    -- reads as JSON (and no key holding one ever equals a step: a step is
    -- text). So where the state has either, the walk runs on a copy in
    -- which each is another escape of the same length, chosen from code
    -- points that neither the state's escapes nor the steps use: the
    -- found value is then the copy's text of the same span, and turns back
    -- exactly. \u0000 and \uD800-\uDFFF become \uX000 and \uX800-\uXFFF
    -- (\uY800-\uYFFF for a lower-case d), for the first two digits X and Y
    -- free.
    IF strpos(state, E'\\u') > 0 AND state ~ E'\\\\u(0000|[dD][89a-fA-F])' THEN
        PERFORM state::json;
        used := ARRAY(SELECT DISTINCT lower(m[1])
                        FROM regexp_matches(state, E'\\\\u([0-9a-fA-F])(000|[89a-fA-F])', 'g') AS m);
        steps := array_to_string(path, '');
        FOREACH candidate IN ARRAY ARRAY['e', 'f', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c'] LOOP
            CONTINUE WHEN candidate = ANY (used);
            i := (strpos('0123456789abcdef', candidate) - 1) * 4096;
            CONTINUE WHEN steps ~ ('[' || chr(i) || chr(i + 2048) || '-' || chr(i + 4095) || ']');
            IF high IS NULL THEN
                high := candidate;
            ELSE
                low := candidate;
                EXIT;
            END IF;
        END LOOP;
        IF low IS NULL THEN
            RAISE EXCEPTION 'loom''s SQL-only flavour cannot read this state by path: its escapes and the path use every code point block it could stand NUL escapes and lone surrogates in'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Read it with loom_snapshot_state_text and decode it in the client, or install the native loom extension.';
        END IF;
        escaped := true;
        -- Escaped backslashes out of the way (a valid text has no control
        -- characters), so that every backslash left starts an escape;
        -- surrogate pairs kept; then the rest.
        state := replace(state, E'\\\\', chr(1));
        state := regexp_replace(state, E'\\\\u([dD][89abAB][0-9a-fA-F]{2})\\\\u([dD][c-fC-F][0-9a-fA-F]{2})',
                                chr(2) || E'\\1' || chr(2) || E'\\2', 'g');
        state := regexp_replace(state, E'\\\\uD([89a-fA-F])', E'\\\\u' || high || E'\\1', 'g');
        state := regexp_replace(state, E'\\\\ud([89a-fA-F])', E'\\\\u' || low || E'\\1', 'g');
        state := replace(state, E'\\u0000', E'\\u' || high || '000');
        state := replace(replace(state, chr(2), E'\\u'), chr(1), E'\\\\');
    END IF;

    -- One step at a time, as jsonb's #> walks: of duplicate keys the last
    -- (json's own #> follows every duplicate, and answers from an earlier
    -- one where the last has no such path; and it resolves a negative
    -- index once, on the first array at that depth long enough, whichever
    -- it is, counting the elements of each such array before it); an index
    -- as jsonb_get_element reads it.
    --
    -- A step with json's -> parses the whole value it stands at, and the
    -- value holds the rest of the walk: a path as deep as the state would
    -- cost depth times size. So the walk counts the bytes it has parsed,
    -- and past four times the state (and 1 MiB) outlines the value it
    -- stands at once, linearly, and goes on from there over that outline.
    -- The outline: the value's text cut after each bracket outside a
    -- string (one regular-expression pass), each token a run of other text
    -- and the bracket ending it, and for each opening token the index of
    -- its closing one (one pass over the tokens). A step then parses only
    -- the container's own text, each container in it a placeholder [i]
    -- naming its opening token: json's -> on that finds the member (the
    -- last of duplicate keys, a negative index from the end) without
    -- parsing what it holds. Every token is in one container's own text,
    -- so the walk costs the value's size, and the steps' number.
    value := state::json;
    budget := 4 * octet_length(state)::bigint + 1048576;
    FOREACH step IN ARRAY path LOOP
        IF tokens IS NULL THEN
            kind := json_typeof(value);
            IF kind IN ('object', 'array') THEN
                spent := spent + octet_length(value::text);
                IF spent > budget THEN
                    tokens := ARRAY(SELECT m[1]
                                      FROM regexp_matches(value::text,
                                                          E'(?:[^][{}"]|"(?:[^"\\\\]|\\\\.)*")*[][{}]', 'g') AS m);
                    ends := array_fill(0, ARRAY[cardinality(tokens)]);
                    opened := ends;
                    depth := 0;
                    FOR j IN 1 .. cardinality(tokens) LOOP
                        IF right(tokens[j], 1) IN ('[', '{') THEN
                            depth := depth + 1;
                            opened[depth] := j;
                        ELSE
                            ends[opened[depth]] := j;
                            depth := depth - 1;
                        END IF;
                    END LOOP;
                    here := 1;
                END IF;
            END IF;
        END IF;
        IF here IS NOT NULL THEN
            -- The container's own text, as json.
            parts := ARRAY[right(tokens[here], 1)];
            j := here + 1;
            LOOP
                token := tokens[j];
                parts := parts || left(token, -1);
                EXIT WHEN j = ends[here];
                parts := parts || ('[' || j || ']');
                j := ends[j] + 1;
            END LOOP;
            value := array_to_string(parts || right(token, 1), '')::json;
            kind := CASE right(tokens[here], 1) WHEN '{' THEN 'object' ELSE 'array' END;
        ELSIF tokens IS NOT NULL THEN
            -- A scalar has nothing under it.
            RETURN NULL;
        END IF;
        CASE kind
            WHEN 'object' THEN
                value := value -> step;
            WHEN 'array' THEN
                -- strtol: leading isspace, a sign, decimal digits to the
                -- end; NULL unless it fits an int. -2147483648 names no
                -- element of any array.
                digits := ltrim(step, E' \t\n\x0b\f\r');
                IF digits !~ '^[-+]?[0-9]+$' THEN
                    RETURN NULL;
                END IF;
                element := CASE WHEN left(digits, 1) = '-' THEN -1 ELSE 1 END;
                digits := ltrim(ltrim(digits, '+-'), '0');
                IF length(digits) > 10 THEN
                    RETURN NULL;
                END IF;
                element := element * ('0' || digits)::numeric;
                IF element < -2147483647 OR element > 2147483647 THEN
                    RETURN NULL;
                END IF;
                value := value -> element::integer;
            ELSE
                RETURN NULL;
        END CASE;
        IF value IS NULL THEN
            RETURN NULL;
        END IF;
        IF tokens IS NOT NULL THEN
            -- A container is a placeholder: the walk stands at it.
            here := CASE WHEN json_typeof(value) = 'array' THEN btrim(value::text, '[]')::integer END;
        END IF;
    END LOOP;
    IF here IS NOT NULL THEN
        found := right(tokens[here], 1) || array_to_string(tokens[here + 1 : ends[here]], '');
    ELSE
        found := value::text;
    END IF;
    IF escaped THEN
        found := regexp_replace(found, E'\\\\u' || high || '([89a-fA-F])', E'\\\\uD\\1', 'g');
        found := regexp_replace(found, E'\\\\u' || low || '([89a-fA-F])', E'\\\\ud\\1', 'g');
        found := replace(found, E'\\u' || high || '000', E'\\u0000');
    END IF;
    RETURN found;
END
$$;

-- Only the part asked for becomes jsonb: `->'turns'->0` without a jsonb of
-- the whole state.
CREATE FUNCTION @extschema@.loom_snapshot_get(frame bytea, VARIADIC path text[]) RETURNS jsonb
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_get_text(frame, VARIADIC path)::pg_catalog.jsonb;

-- The getters of any frame, a delta with the keyframe it names. Here the
-- two-argument getter refuses a delta with the SQL-only flavour's own
-- error, and walks a keyframe.
CREATE FUNCTION @extschema@.loom_snapshot_get_text(frame bytea, base bytea, VARIADIC path text[]) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF frame IS NULL OR path IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN @extschema@.loom_snapshot_get_text(frame, VARIADIC path);
END
$$;

CREATE FUNCTION @extschema@.loom_snapshot_get(frame bytea, base bytea, VARIADIC path text[]) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_get_text(frame, base, VARIADIC path)::pg_catalog.jsonb;

-- jsonb's own text form is the state that gets framed.
CREATE FUNCTION @extschema@.loom_snapshot_frame(state jsonb, codec text DEFAULT 'zstd') RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN @extschema@.loom_snapshot_frame(state::pg_catalog.text, codec);

COMMENT ON FUNCTION @extschema@.loom_snapshot_state(bytea) IS
'Decodes a loom snapshot frame (format byte 0x01 JSON or 0x02 zstd) into jsonb. Use loom_snapshot_state_text for the exact stored text: jsonb reorders keys, merges duplicates and cannot hold \u0000 or lone surrogates.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_get(bytea, text[]) IS
'The value at path in a loom snapshot frame''s state, as jsonb: loom_snapshot_get(frame, ''turns'', ''0'') is loom_snapshot_state(frame) #> ''{turns,0}'' (keys, array indexes, negative from the end; of duplicate keys the last), without making the whole state jsonb. NULL where there is none.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_get_text(bytea, text[]) IS
'The exact JSON text of the value at path in a loom snapshot frame''s state (see loom_snapshot_get); NULL where there is none.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_state_text(bytea) IS
'The exact JSON text a loom snapshot frame holds, byte for byte. Errors name the cause: unknown format byte (0A000), malformed or foreign frame (22P03), corrupt or truncated (XX001), state over 256 MiB (54000), not UTF-8 (22021), not JSON (22P02).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame(text, text) IS
'Frames a JSON state as loom stores it: codec ''zstd'' (default) gives 0x02 + zstd level 3 with checksum and content size, or 0x01 when zstd would not make it smaller; ''none'' gives 0x01 + the text. The text must be JSON (22P02) of at most 256 MiB (54000).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame(jsonb, text) IS
'Frames a jsonb state (its canonical text form) as loom stores it; see loom_snapshot_frame(text, text).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_frame_info(bytea) IS
'Reads a loom snapshot frame''s header without inflating it: format (json, zstd or delta), stored_bytes (the whole frame), declared_bytes (the JSON text''s length as declared; NULL when a zstd frame declares none), has_checksum (a delta''s: its zstd frame''s). A delta''s header must be whole and name a keyframe of at most 256 MiB.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_state_text(bytea, bytea) IS
'The exact JSON text of any snapshot frame: a keyframe (0x01, 0x02) alone, a delta (0x03) against base, the frame of the keyframe it names (loom_snapshot_base_sequence; loom.snapshots_decoded joins it). A missing or wrong keyframe is data_corrupted (XX001), a delta given as the keyframe invalid_binary_representation (22P03). The SQL-only flavour decodes 0x01 only (0A000 otherwise): the client decodes the rest.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_state(bytea, bytea) IS
'loom_snapshot_state_text(frame, base) as jsonb.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_get_text(bytea, bytea, text[]) IS
'loom_snapshot_get_text of any frame: a keyframe (0x01, 0x02) alone, a delta (0x03) with base, the frame of the keyframe it names, as loom_snapshot_state_text(frame, base) takes it. base must be typed bytea (a column; a parameter as $2::bytea): an untyped one is taken for a path step. The SQL-only flavour walks 0x01 only (0A000 otherwise).';
COMMENT ON FUNCTION @extschema@.loom_snapshot_get(bytea, bytea, text[]) IS
'loom_snapshot_get_text(frame, base, VARIADIC path) as jsonb.';
COMMENT ON FUNCTION @extschema@.loom_snapshot_delta_frame(text, bigint, bytea, integer) IS
'The frame a delta store writes for state: a delta (0x03) against base (the frame of the keyframe at base_sequence), or a keyframe as codec ''zstd'' writes when base is NULL or the keyframe policy asks for one (after 16 deltas, deltas_since counting them, or a delta over 40% of a keyframe''s estimated size). The native extension only: the SQL-only flavour refuses it (0A000), and its clients write deltas themselves.';
