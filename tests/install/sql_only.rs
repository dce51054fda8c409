//! loom's SQL-only flavour (issue 28, docs/flavours.md) on servers that
//! cannot load loom.so: PostgreSQL 15 and 18 builds with no loom in their
//! lib and extension directories, loom installed by a database owner that
//! is not a superuser, with `psql -f target/sql-only/loom.sql` or
//! `migrate()` / `loom migrate --sql-only`.

use std::collections::BTreeSet;

use loom_harness::pg_pool;
use loom_harness::sql_only::{script_path, servers, SqlOnlyServer, OWNER};
use loom_harness::{cli, describe, runtime, sqlstate, Cluster, LOOM_VERSION};
use pgloom::branch_registry::PgBranchRegistry;
use pgloom::conformance::{
    check_branch_registry, check_event_store, check_resume_and_retention, check_snapshot_store,
    Fidelity,
};
use pgloom::event_store::{Event, EventStore, PgEventStore};
use pgloom::migrate::{migrate, Flavour, MigrateOptions};
use pgloom::snapshot_store::{
    Codec, Decode, PgSnapshotStore, PgSnapshotStoreOptions, SnapshotStore,
};
use pgloom::Error;
use postgres::Client;

/// Every server in turn, with its major in the messages.
fn on_each_server(test: impl Fn(&SqlOnlyServer, &str)) {
    let servers = servers();
    assert!(!servers.is_empty(), "LOOM_PG_SQL_ONLY names no server");
    for server in &servers {
        let major = server.major();
        println!("PostgreSQL {major}: {}", server.conninfo());
        test(server, &format!("PostgreSQL {major}"));
    }
}

#[test]
fn the_servers_cannot_load_loom() {
    on_each_server(|server, major| {
        let mut admin = server.connect_as("postgres", "postgres");
        let libdir: String = admin
            .query_one(
                "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(
            !std::path::Path::new(&libdir).join("loom.so").exists(),
            "{major}: {libdir} has loom.so"
        );
        let available: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_available_extensions WHERE name = 'loom'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(available, 0, "{major}: loom is an available extension");
        server.fresh_database("loom_so_none");
        let err = server
            .connect_as("loom_so_none", "postgres")
            .batch_execute("CREATE EXTENSION loom")
            .unwrap_err();
        assert_eq!(sqlstate(&err), "0A000", "{major}: {}", describe(&err));
    });
}

#[test]
fn a_database_owner_installs_it_with_psql_and_owns_all_of_it() {
    on_each_server(|server, major| {
        let db = "loom_so_psql";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        let row = owner
            .query_one(
                "SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
                        (SELECT version FROM loom.sql_only),
                        (SELECT function_schema::text FROM loom.sql_only)",
                &[],
            )
            .unwrap();
        assert!(!row.get::<_, bool>(0), "{major}: {OWNER} is a superuser");
        assert_eq!(row.get::<_, String>(1), LOOM_VERSION, "{major}");
        assert_eq!(row.get::<_, String>(2), "public", "{major}");
        // Every object loom made is the owner's: nothing of a superuser's
        // runs on its behalf, and nothing it made is someone else's.
        let foreign: Vec<String> = owner
            .query(
                "SELECT c.oid::regclass::text FROM pg_class c
                 WHERE c.relnamespace = 'loom'::regnamespace AND c.relowner <> current_user::regrole
                 UNION ALL
                 SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace IN ('public'::regnamespace, 'loom'::regnamespace)
                   AND p.proname LIKE 'loom%' AND p.proowner <> current_user::regrole",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(foreign.is_empty(), "{major}: not the owner's: {foreign:?}");
        let status: Vec<(String, Option<String>)> = owner
            .query("SELECT item, value FROM loom_status()", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert!(
            status.contains(&("loom flavour".into(), Some("SQL-only".into())))
                && status.contains(&("loom version".into(), Some(LOOM_VERSION.into()))),
            "{major}: {status:?}"
        );

        // The script again: refused before it changes anything.
        let (ok, output) = server.psql_file(db, OWNER, &script_path());
        assert!(
            !ok && output.contains("schema loom exists"),
            "{major}: {output}"
        );
        let version: String = owner
            .query_one("SELECT version FROM loom.sql_only", &[])
            .unwrap()
            .get(0);
        assert_eq!(version, LOOM_VERSION);
    });
}

/// The catalog facts that make up loom's SQL contract, owner-neutral:
/// functions (arguments, result, attributes, comment, privileges), loom's
/// relations, columns, indexes, constraints, triggers and views.
/// `prolang`, `prosrc` and `procost` are left out: they are what a native
/// replacement changes. Comparable across majors (the extension's is
/// 15's): without 17's MAINTAIN privilege and 18's NOT NULL constraints;
/// views' text only when `$1` (each major prints it its own way).
const CONTRACT: &str = r#"
WITH acl(oid, owner, acl, kind) AS (
    SELECT p.oid, p.proowner, p.proacl, 'f' FROM pg_proc p
    UNION ALL SELECT c.oid, c.relowner, c.relacl, CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END FROM pg_class c
), grants AS (
    SELECT a.oid, string_agg(
        CASE WHEN x.grantee = 0 THEN 'PUBLIC' WHEN x.grantee = a.owner THEN 'OWNER'
             ELSE pg_get_userbyid(x.grantee) END || ':' || x.privilege_type, ',' ORDER BY 1) AS g
    FROM acl a, aclexplode(coalesce(a.acl, acldefault(a.kind::"char", a.owner))) x
    -- MAINTAIN: an owner's privilege from PostgreSQL 17 on (the native
    -- catalog compared is 15's).
    WHERE x.privilege_type <> 'MAINTAIN'
    GROUP BY a.oid
)
SELECT 'function ' || p.oid::regprocedure::text || ' -> ' || coalesce(pg_get_function_result(p.oid), 'procedure')
       || ' | ' || pg_get_function_arguments(p.oid)
       || ' | ' || p.provolatile::text || p.proisstrict::int || p.prosecdef::int || p.proparallel::text
       || p.proretset::int || ' | ' || coalesce(p.proconfig::text, '')
       || ' | ' || coalesce(obj_description(p.oid, 'pg_proc'), '')
       || ' | ' || coalesce((SELECT g FROM grants WHERE grants.oid = p.oid), '')
FROM pg_proc p WHERE p.pronamespace IN ('public'::regnamespace, 'loom'::regnamespace)
UNION ALL
SELECT 'relation ' || c.oid::regclass::text || ' ' || c.relkind::text
       || ' | ' || coalesce(obj_description(c.oid, 'pg_class'), '')
       || ' | ' || coalesce((SELECT g FROM grants WHERE grants.oid = c.oid), '')
       || ' | ' || CASE WHEN $1 THEN coalesce(pg_get_viewdef(c.oid), '') ELSE '' END
FROM pg_class c WHERE c.relnamespace = 'loom'::regnamespace AND c.relkind <> 'i'
UNION ALL
SELECT 'column ' || a.attrelid::regclass::text || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || ' ' || coalesce((SELECT collname FROM pg_collation WHERE oid = a.attcollation), '')
       || ' ' || a.attnotnull::text || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
       || ' | ' || coalesce(col_description(a.attrelid, a.attnum), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'loom'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'loom'::regnamespace
UNION ALL
SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'loom'::regnamespace
  AND contype <> 'n' -- 18 catalogs NOT NULL as constraints too; attnotnull says it
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'loom'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'schema loom | ' || coalesce(obj_description('loom'::regnamespace, 'pg_namespace'), '')
"#;

fn server_major(client: &mut Client) -> i32 {
    let num: String = client
        .query_one("SHOW server_version_num", &[])
        .unwrap()
        .get(0);
    num.parse::<i32>().unwrap() / 10000
}

fn contract(client: &mut Client, view_text: bool) -> BTreeSet<String> {
    client
        .query(CONTRACT, &[&view_text])
        .unwrap_or_else(|e| panic!("{}", describe(&e)))
        .iter()
        .map(|r| implementation_neutral(&r.get::<_, String>(0)))
        .collect()
}

/// The names of the functions `native/` files replace, and of those whose
/// comment they restate (a stripe lock's tag is not the twin's).
fn natively_replaced(statement: &str) -> Vec<&'static str> {
    pgloom_core::sql::parts_of(pgloom_core::sql::Kind::Native)
        .flat_map(|part| part.sql.split(statement).skip(1))
        .map(|rest| &rest[..rest.find('(').expect("a parameter list")])
        .collect()
}

/// A function's row with what its native replacement may change blanked:
/// its SET search_path (C resolves nothing through it, so it pins none),
/// and its comment where the native file restates it. Its arguments,
/// result, attributes and privileges stay: those are the contract.
fn implementation_neutral(fact: &str) -> String {
    let Some(rest) = fact.strip_prefix("function ") else {
        return fact.to_owned();
    };
    let name = &rest[..rest.find('(').unwrap_or(rest.len())];
    if !natively_replaced("CREATE OR REPLACE FUNCTION @extschema@.").contains(&name) {
        return fact.to_owned();
    }
    let recommented = natively_replaced("COMMENT ON FUNCTION @extschema@.").contains(&name);
    fact.split(" | ")
        .enumerate()
        .map(|(i, field)| match i {
            3 => "(pinned by the portable definition)",
            4 if recommented => "(the flavour's own)",
            _ => field,
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

#[test]
fn the_sql_only_catalog_is_the_extensions_less_what_only_a_superuser_or_the_library_can_make() {
    let mut native = Cluster::C.fresh_database("loom_so_native_catalog");
    let native_major = server_major(&mut native);
    let native_views_too = contract(&mut native, true);
    let native_without_view_text = contract(&mut native, false);
    on_each_server(|server, major| {
        let db = "loom_so_catalog";
        server.fresh_sql_only_database(db);
        let same_major = server.major() == native_major;
        let sql_only = contract(&mut server.connect_as(db, "postgres"), same_major);
        let native = if same_major {
            &native_views_too
        } else {
            &native_without_view_text
        };
        // Only the native flavour has the event triggers' functions (a
        // superuser's); only the SQL-only one has its version table.
        let only_native: Vec<_> = native
            .difference(&sql_only)
            .filter(|f| {
                !f.starts_with("function loom.loom_keep_schema_names()")
                    && !f.starts_with("function loom.loom_refuse_drops()")
            })
            .collect();
        let only_sql: Vec<_> = sql_only
            .difference(native)
            .filter(|f| !f.contains("loom.sql_only"))
            .collect();
        assert!(
            only_native.is_empty() && only_sql.is_empty(),
            "{major}: the flavours differ\nonly in the extension:\n{}\nonly in the SQL-only flavour:\n{}",
            only_native.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"),
            only_sql.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"),
        );
        assert!(sql_only.len() > 100, "{major}: {} facts", sql_only.len());
    });
}

#[test]
fn the_sql_api_keeps_its_guarantees_without_the_library() {
    on_each_server(|server, major| {
        let db = "loom_so_api";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        owner
            .batch_execute(
                "SELECT loom_append_event('run-b', 1, 'started', '{\"n\":1}');
                 SELECT loom_append_events(ARRAY['run-a','run-a','run-c'], ARRAY[1,2,1]::bigint[],
                        ARRAY['s','t','s'], ARRAY['{}','{}','{}']::jsonb[],
                        ARRAY['{\"trace\":\"x\"}', NULL, 'null']::jsonb[]);",
            )
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        let ids: Vec<String> = owner
            .query("SELECT loom_list_executions(NULL, 10)", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(ids, ["run-a", "run-b", "run-c"], "{major}");
        let err = owner
            .batch_execute("SELECT loom_append_event('run-a', 2, 'again', '{}')")
            .unwrap_err();
        assert_eq!(sqlstate(&err), "23505", "{major}: {}", describe(&err));
        let err = owner
            .batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ;
                 SELECT loom_append_event('run-z', 1, 's', '{}')",
            )
            .unwrap_err();
        assert_eq!(sqlstate(&err), "0A000", "{major}: {}", describe(&err));
        owner.batch_execute("ROLLBACK").unwrap();
        let err = owner
            .batch_execute(
                "SELECT loom_append_events(ARRAY['x'], ARRAY[1,2]::bigint[], ARRAY['s'], ARRAY['{}']::jsonb[])",
            )
            .unwrap_err();
        assert_eq!(sqlstate(&err), "22023", "{major}: {}", describe(&err));

        // The executions index follows a delete, and a COPY.
        owner
            .batch_execute("SELECT loom_delete_execution('run-b')")
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        let mut copy = owner
            .copy_in("COPY loom.events (execution_id, sequence, kind, payload) FROM STDIN")
            .unwrap();
        std::io::Write::write_all(&mut copy, b"run-d\t1\tcopied\t{}\n").unwrap();
        copy.finish()
            .unwrap_or_else(|e| panic!("{major}: COPY: {}", describe(&e)));
        let indexed: Vec<String> = owner
            .query("SELECT execution_id FROM loom.executions ORDER BY 1", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(indexed, ["run-a", "run-c", "run-d"], "{major}");
        let verified: i64 = owner
            .query_one(
                "SELECT count(*) FROM (SELECT DISTINCT execution_id FROM loom.events) e
                 FULL JOIN loom.executions x USING (execution_id)
                 WHERE e.execution_id IS NULL OR x.execution_id IS NULL",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            verified, 0,
            "{major}: loom.executions differs from loom.events"
        );
        let metadata: Vec<Option<serde_json::Value>> = owner
            .query(
                "SELECT metadata FROM loom_read_events('run-a', 0, 10) ORDER BY sequence",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            metadata,
            [Some(serde_json::json!({"trace": "x"})), None],
            "{major}"
        );
    });
}

#[test]
fn json_frames_decode_in_sql_and_zstd_frames_say_where_they_can() {
    let state = r#"{"b": [1, 2, {"deep": "é\u0000"}], "a": "x", "a": "last"}"#;
    let json_frame = pgloom_core::frame::encode(state, pgloom_core::frame::Codec::None).unwrap();
    let big = format!(r#"{{"turns": "{}"}}"#, "compressible ".repeat(400));
    let zstd_frame = pgloom_core::frame::encode(&big, pgloom_core::frame::Codec::Zstd).unwrap();
    assert_eq!(zstd_frame[0], 0x02);
    on_each_server(|server, major| {
        let db = "loom_so_frames";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        let row = owner
            .query_one(
                "SELECT loom_snapshot_state_text($1), loom_snapshot_get_text($1, 'a'),
                        loom_snapshot_get_text($1, 'b', '-1'),
                        (loom_snapshot_frame_info($1)).format,
                        loom_snapshot_frame($2, 'none') = $1",
                &[&json_frame, &state],
            )
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        assert_eq!(row.get::<_, String>(0), state, "{major}: the exact text");
        assert_eq!(row.get::<_, String>(1), "\"last\"", "{major}");
        assert_eq!(row.get::<_, String>(2), r#"{"deep": "é\u0000"}"#, "{major}");
        assert_eq!(row.get::<_, String>(3), "json", "{major}");
        assert!(row.get::<_, bool>(4), "{major}: frame(state, 'none')");

        for call in [
            "SELECT loom_snapshot_state_text($1)",
            "SELECT loom_snapshot_state($1)::text",
            "SELECT loom_snapshot_get_text($1, 'turns')",
        ] {
            let err = owner.query_one(call, &[&zstd_frame]).unwrap_err();
            let db_error = err
                .as_db_error()
                .unwrap_or_else(|| panic!("{major}: {err}"));
            assert_eq!(
                db_error.code().code(),
                "0A000",
                "{major}: {call}: {}",
                describe(&err)
            );
            let said = format!("{} {}", db_error.message(), db_error.hint().unwrap_or(""));
            assert!(
                said.contains("client") && said.contains("extension"),
                "{major}: {call}: {said}"
            );
        }
        let err = owner
            .query_one("SELECT loom_snapshot_frame('{}'::text)", &[])
            .unwrap_err();
        assert_eq!(sqlstate(&err), "0A000", "{major}: {}", describe(&err));
    });
}

/// A malformed zstd frame is refused by the SQL-only flavour's header walk
/// (`loom_zstd_frame_walk`, PL/pgSQL) with the SQLSTATE the extension's
/// loom-core gives, and a sound one is described alike by
/// `loom_snapshot_frame_info` in both flavours: the extension on cluster c
/// is the oracle for each frame (issue 36: the walk, once two copies, is
/// written once).
#[test]
fn the_sql_only_zstd_walk_refuses_what_the_extension_refuses() {
    let big = format!(r#"{{"turns": "{}"}}"#, "compressible words ".repeat(2000));
    let sound = pgloom_core::frame::encode(&big, pgloom_core::frame::Codec::Zstd).unwrap();
    assert_eq!(sound[0], 0x02);
    let with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut frame = sound.clone();
        edit(&mut frame);
        frame
    };
    let frames: Vec<(&str, Vec<u8>)> = vec![
        ("sound", sound.clone()),
        ("magic cut short", sound[..4].to_vec()),
        (
            "a skippable frame",
            with(&|f| f[1..5].copy_from_slice(&[0x50, 0x2A, 0x4D, 0x18])),
        ),
        ("no magic", with(&|f| f[1] ^= 0xFF)),
        ("header cut short", sound[..6].to_vec()),
        ("the reserved bit", with(&|f| f[5] |= 8)),
        ("a block cut short", sound[..sound.len() - 40].to_vec()),
        ("the checksum cut short", sound[..sound.len() - 2].to_vec()),
        ("trailing bytes", with(&|f| f.extend_from_slice(&[1, 2, 3]))),
        (
            "a second frame",
            with(&|f| f.extend_from_slice(&sound[1..])),
        ),
        ("no checksum flag", with(&|f| f[5] &= !4)),
    ];
    type Info = (String, i32, i64, bool);
    let info = |client: &mut Client, frame: &[u8]| -> Result<Info, String> {
        client
            .query_one(
                "SELECT format, stored_bytes, declared_bytes, has_checksum FROM loom_snapshot_frame_info($1)",
                &[&frame],
            )
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .map_err(|e| sqlstate(&e))
    };
    let text = |client: &mut Client, frame: &[u8]| -> Result<String, String> {
        client
            .query_one("SELECT loom_snapshot_state_text($1)", &[&frame])
            .map(|r| r.get(0))
            .map_err(|e| sqlstate(&e))
    };
    drop(Cluster::C.fresh_database("loom_so_walk_native"));
    on_each_server(|server, major| {
        let mut native = Cluster::C.connect("loom_so_walk_native");
        let db = "loom_so_walk";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        for (what, frame) in &frames {
            assert_eq!(
                info(&mut owner, frame),
                info(&mut native, frame),
                "{major}: loom_snapshot_frame_info of {what}"
            );
            match text(&mut native, frame) {
                // What the extension inflates, the SQL-only flavour cannot.
                Ok(_) => assert_eq!(
                    text(&mut owner, frame),
                    Err("0A000".to_owned()),
                    "{major}: loom_snapshot_state_text of {what}"
                ),
                refused => assert_eq!(
                    text(&mut owner, frame),
                    refused,
                    "{major}: loom_snapshot_state_text of {what}"
                ),
            }
        }
        // Every malformed frame was refused, not only the sound one read.
        assert!(frames[1..]
            .iter()
            .all(|(_, frame)| text(&mut native, frame).is_err()));
    });
}

/// Delta frames (0x03) on the SQL-only flavour: their header is read as
/// the extension reads it (loom_snapshot_frame_info, the keyframe's
/// sequence), and every decode or encode of one in the server is refused
/// with 0A000, where the extension decodes it with its keyframe.
#[test]
fn the_sql_only_flavour_reads_a_deltas_header_and_leaves_its_decoding_to_the_client() {
    use pgloom_core::frame::delta::{encode_delta, Keyframe};
    let base = format!(r#"{{"turns": "{}"}}"#, "compressible words ".repeat(2000));
    let next = format!(
        r#"{{"turns": "{}", "more": 1}}"#,
        "compressible words ".repeat(2100)
    );
    let keyframe = pgloom_core::frame::encode(&base, pgloom_core::frame::Codec::Zstd).unwrap();
    let sound = encode_delta(
        &next,
        Keyframe {
            sequence: 7,
            text: &base,
        },
    )
    .unwrap();
    let mut huge = sound.clone();
    huge[9..17].copy_from_slice(&u64::MAX.to_be_bytes());
    let mut unchecked = sound.clone();
    unchecked[29] &= !4;
    let frames: Vec<(&str, Vec<u8>)> = vec![
        ("a delta", sound.clone()),
        ("a delta cut inside its header", sound[..20].to_vec()),
        ("a delta naming a keyframe past the ceiling", huge),
        ("a delta whose zstd frame has no checksum flag", unchecked),
        (
            "a delta cut inside its zstd frame",
            sound[..sound.len() - 2].to_vec(),
        ),
    ];
    let info = |client: &mut Client,
                frame: &[u8]|
     -> Result<(String, i32, i64, bool, Option<i64>), String> {
        client
            .query_one(
                "SELECT format, stored_bytes, declared_bytes, has_checksum, loom_snapshot_base_sequence($1)
                 FROM loom_snapshot_frame_info($1)",
                &[&frame],
            )
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .map_err(|e| sqlstate(&e))
    };
    let refused =
        |client: &mut Client, sql: &str, params: &[&(dyn postgres::types::ToSql + Sync)]| {
            client
                .query(sql, params)
                .map(|_| ())
                .map_err(|e| sqlstate(&e))
        };
    drop(Cluster::C.fresh_database("loom_so_delta_native"));
    on_each_server(|server, major| {
        let mut native = Cluster::C.connect("loom_so_delta_native");
        let db = "loom_so_delta";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        for (what, frame) in &frames {
            assert_eq!(
                info(&mut owner, frame),
                info(&mut native, frame),
                "{major}: loom_snapshot_frame_info of {what}"
            );
            for sql in [
                "SELECT loom_snapshot_state_text($1)",
                "SELECT loom_snapshot_state_text($1, $2)",
                "SELECT loom_snapshot_state($1, $2)",
            ] {
                let params: &[&(dyn postgres::types::ToSql + Sync)] = if sql.contains("$2") {
                    &[frame, &keyframe]
                } else {
                    &[frame]
                };
                assert_eq!(
                    refused(&mut owner, sql, params),
                    Err("0A000".to_owned()),
                    "{major}: {sql} of {what}"
                );
            }
        }
        // A reader of a bare frame refuses a delta alike in both flavours:
        // it cannot take the keyframe.
        for sql in [
            "SELECT loom_snapshot_state_text($1)",
            "SELECT loom_snapshot_state($1)",
            "SELECT loom_snapshot_get_text($1, 'turns')",
        ] {
            assert_eq!(
                refused(&mut native, sql, &[&sound]),
                Err("0A000".to_owned()),
                "{major}: natively, {sql} of a delta"
            );
            assert_eq!(
                refused(&mut owner, sql, &[&sound]),
                Err("0A000".to_owned()),
                "{major}: {sql} of a delta"
            );
        }
        // What the SQL-only flavour refuses, the extension decodes.
        let decoded: String = native
            .query_one(
                "SELECT loom_snapshot_state_text($1, $2)",
                &[&sound, &keyframe],
            )
            .unwrap()
            .get(0);
        assert_eq!(decoded, next);
        // A path in a delta, with its keyframe: natively the value, here
        // 0A000.
        // A parameter is typed: an untyped one would be taken for a step.
        let path = "SELECT loom_snapshot_get_text($1, $2::bytea, 'more')";
        let more: Option<String> = native.query_one(path, &[&sound, &keyframe]).unwrap().get(0);
        assert_eq!(more.as_deref(), Some("1"), "{major}");
        assert_eq!(
            refused(&mut owner, path, &[&sound, &keyframe]),
            Err("0A000".to_owned()),
            "{major}: a path in a delta"
        );
        assert_eq!(
            info(&mut owner, &sound).map(|i| i.4),
            Ok(Some(7)),
            "{major}: the keyframe a delta names"
        );
        // Writing one: the state is checked first, as the extension does.
        assert_eq!(
            refused(
                &mut owner,
                "SELECT loom_snapshot_delta_frame($1, 7, $2, 0)",
                &[&next, &keyframe]
            ),
            Err("0A000".to_owned())
        );
        assert_eq!(
            refused(
                &mut owner,
                "SELECT loom_snapshot_delta_frame('{oops', 7, $1, 0)",
                &[&keyframe]
            ),
            Err("22P02".to_owned())
        );
        owner
            .batch_execute("SELECT loom_ensure_snapshot_zstd()")
            .unwrap();
        assert_eq!(
            refused(
                &mut owner,
                "SELECT loom_save_snapshot('e', 'wf', 1, $1, 'delta')",
                &[&next]
            ),
            Err("0A000".to_owned()),
            "{major}: a save with codec 'delta'"
        );
    });
}

/// The client's stores on a SQL-only database, as its owner: the event
/// store, branch registry and snapshot store kits (zstd frames written and
/// read by the client), and resume with retention.
#[test]
fn the_conformance_kits_pass_on_the_sql_only_flavour() {
    let rt = runtime();
    on_each_server(|server, major| {
        let db = "loom_so_kits";
        server.fresh_sql_only_database(db);
        let conninfo = server.database_as(db, OWNER);
        let events = PgEventStore::new(pg_pool(&conninfo, 4).unwrap());
        rt.block_on(events.check_server())
            .unwrap_or_else(|e| panic!("{major}: {e}"));
        rt.block_on(check_event_store(&events))
            .unwrap_or_else(|f| panic!("{major}: {f}"));
        let registry = PgBranchRegistry::new(events.pool().clone());
        rt.block_on(check_branch_registry(&registry))
            .unwrap_or_else(|f| panic!("{major}: {f}"));

        // Deltas too: the client writes and decodes them, the server keeps
        // each beside its keyframe.
        for (codec, fidelity) in [
            (Codec::None, Fidelity::Jsonb),
            (Codec::Zstd, Fidelity::Exact),
            (Codec::Delta, Fidelity::Exact),
        ] {
            let db = format!("loom_so_snap_{codec}");
            server.fresh_sql_only_database(&db);
            let pool = pg_pool(&server.database_as(&db, OWNER), 2).unwrap();
            let mut options = PgSnapshotStoreOptions::new();
            options.codec(codec).decode(Decode::Client);
            let snapshots = rt
                .block_on(PgSnapshotStore::start(pool.clone(), &options))
                .unwrap_or_else(|e| panic!("{major}: {e}"));
            rt.block_on(check_snapshot_store(&snapshots, codec, fidelity))
                .unwrap_or_else(|f| panic!("{major} {codec}: {f}"));
        }

        let db = "loom_so_resume";
        server.fresh_sql_only_database(db);
        let pool = pg_pool(&server.database_as(db, OWNER), 2).unwrap();
        let events = PgEventStore::new(pool.clone());
        let mut options = PgSnapshotStoreOptions::new();
        options.codec(Codec::Zstd);
        let snapshots = rt
            .block_on(PgSnapshotStore::start(pool, &options))
            .unwrap_or_else(|e| panic!("{major}: {e}"));
        rt.block_on(check_resume_and_retention(&events, &snapshots))
            .unwrap_or_else(|f| panic!("{major}: {f}"));
        assert_eq!(snapshots.snapshot_codec(), Codec::Zstd);
    });
}

/// A writer and a reader granted by `loom_grant_access`, and a role with
/// no grant: the same privilege model as the extension's.
#[test]
fn roles_get_what_loom_grant_access_gives_and_nothing_more() {
    let rt = runtime();
    on_each_server(|server, major| {
        let db = "loom_so_roles";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        owner
            .batch_execute(
                "DROP ROLE IF EXISTS loom_so_writer; DROP ROLE IF EXISTS loom_so_reader;
                 DROP ROLE IF EXISTS loom_so_nobody;
                 CREATE ROLE loom_so_writer LOGIN; CREATE ROLE loom_so_reader LOGIN;
                 CREATE ROLE loom_so_nobody LOGIN;
                 SELECT loom_grant_access('loom_so_writer', 'writer');
                 SELECT loom_grant_access('loom_so_reader', 'reader');",
            )
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        let writer =
            PgEventStore::new(pg_pool(&server.database_as(db, "loom_so_writer"), 2).unwrap());
        rt.block_on(writer.append(&[Event::new("w", 1, "s", serde_json::json!({}))]))
            .unwrap_or_else(|e| panic!("{major}: writer: {e}"));
        let reader =
            PgEventStore::new(pg_pool(&server.database_as(db, "loom_so_reader"), 2).unwrap());
        let page = rt.block_on(reader.list_executions_page(None, 10)).unwrap();
        assert_eq!(page.ids, ["w"], "{major}");
        let err = rt
            .block_on(reader.append(&[Event::new("r", 1, "s", serde_json::json!({}))]))
            .unwrap_err();
        assert!(
            matches!(&err, Error::Postgres(e) if e.sqlstate() == Some("42501")),
            "{major}: {err}"
        );
        let mut nobody = server.connect_as(db, "loom_so_nobody");
        for call in [
            "SELECT * FROM loom_list_executions(NULL, 10)",
            "SELECT loom_append_event('n', 1, 's', '{}')",
            "SELECT loom_rebuild_executions()",
        ] {
            let err = nobody.batch_execute(call).unwrap_err();
            assert_eq!(
                sqlstate(&err),
                "42501",
                "{major}: {call}: {}",
                describe(&err)
            );
        }
        // The trigger function and the executions lock are the owner's.
        let err = server
            .connect_as(db, "loom_so_writer")
            .batch_execute("SELECT loom_lock_executions_for_delete(ARRAY['w'])")
            .unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{major}: {}", describe(&err));
    });
}

#[test]
fn migrate_installs_and_keeps_the_sql_only_flavour_and_refuses_the_other() {
    let rt = runtime();
    on_each_server(|server, major| {
        let db = "loom_so_migrate";
        server.fresh_database(db);
        let conninfo = server.database_as(db, OWNER);
        let mut options = MigrateOptions::new();
        options.sql_only();
        let first = rt
            .block_on(migrate(&conninfo, &options))
            .unwrap_or_else(|e| panic!("{major}: {e}"));
        assert_eq!(
            (first.from_version.as_deref(), first.to_version.as_str()),
            (None, LOOM_VERSION),
            "{major}"
        );
        assert!(first.warnings.is_empty(), "{major}: {:?}", first.warnings);
        // A boot while a long transaction holds loom.events (and
        // snapshots) whole: nothing to change, so nothing waits on it.
        let mut holder = server.connect_as(db, OWNER);
        holder
            .batch_execute("BEGIN; LOCK TABLE loom.events, loom.snapshots IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        let mut bounded = options.clone();
        bounded
            .lock_timeout(std::time::Duration::from_millis(200))
            .snapshot_codec(Codec::Zstd);
        let started = std::time::Instant::now();
        let again = rt
            .block_on(migrate(&conninfo, &bounded))
            .unwrap_or_else(|e| panic!("{major}: under a held lock: {e}"));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{major}: {:?}",
            started.elapsed()
        );
        assert_eq!(again.from_version.as_deref(), Some(LOOM_VERSION), "{major}");
        assert!(again.warnings.is_empty(), "{major}: {:?}", again.warnings);
        holder.batch_execute("ROLLBACK").unwrap();
        // What loom.sql_only records decides the update: a newer version
        // (a newer client migrated) is left as it is; one that was never
        // a SQL-only release is refused, changing nothing.
        let mut owner = server.connect_as(db, OWNER);
        owner
            .batch_execute("UPDATE loom.sql_only SET version = '0.99.0'")
            .unwrap();
        let newer = rt.block_on(migrate(&conninfo, &options)).unwrap();
        assert_eq!(
            (newer.from_version.as_deref(), newer.to_version.as_str()),
            (Some("0.99.0"), "0.99.0"),
            "{major}"
        );
        owner
            .batch_execute("UPDATE loom.sql_only SET version = '0.11.9'")
            .unwrap();
        let err = rt.block_on(migrate(&conninfo, &options)).unwrap_err();
        assert!(
            matches!(&err, Error::IncompatibleExtension { installed, .. } if installed == "0.11.9"),
            "{major}: {err}"
        );
        owner
            .batch_execute(&format!(
                "UPDATE loom.sql_only SET version = '{LOOM_VERSION}'"
            ))
            .unwrap();
        // The extension asked for, where the SQL-only flavour is.
        let err = rt
            .block_on(migrate(&conninfo, &MigrateOptions::new()))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::WrongFlavour {
                    installed: Flavour::SqlOnly,
                    asked: Flavour::Extension
                }
            ),
            "{major}: {err}"
        );
        // The CLI, on a second database.
        server.fresh_database("loom_so_migrate_cli");
        let (code, out, _) = cli::loom(
            &["migrate"],
            &[
                "--db",
                &server.database_as("loom_so_migrate_cli", OWNER),
                "--sql-only",
            ],
        );
        assert_eq!(code, 0, "{major}: {out}");
        let version: String = server
            .connect_as("loom_so_migrate_cli", OWNER)
            .query_one("SELECT version FROM loom.sql_only", &[])
            .unwrap()
            .get(0);
        assert_eq!(version, LOOM_VERSION, "{major}");
    });
    // And the SQL-only flavour asked for where the extension is.
    let _ = Cluster::C.fresh_database("loom_so_native_migrate");
    let mut options = MigrateOptions::new();
    options.sql_only();
    let err = rt
        .block_on(migrate(
            &Cluster::C.database("loom_so_native_migrate"),
            &options,
        ))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongFlavour {
                installed: Flavour::Extension,
                asked: Flavour::SqlOnly
            }
        ),
        "{err}"
    );
}

/// The retention functions as 0.12.0 had them: as the upgrade steps that
/// last wrote them left them (0.7.0 to 0.10.0; none changed again before
/// 0.13.0). The SQL-only 0.12.0 install was the portable part of the same
/// chain.
fn retention_at_0_12_0(schema: &str) -> String {
    let steps = [
        include_str!("../../sql/loom--0.7.0--0.8.0.sql"),
        include_str!("../../sql/loom--0.8.0--0.9.0.sql"),
        include_str!("../../sql/loom--0.9.0--0.10.0.sql"),
    ]
    .concat();
    [
        "loom_execution_activity",
        "loom_lock_idle_executions",
        "loom_delete_idle_executions",
    ]
    .iter()
    .map(|name| {
        let start = [
            format!("\nCREATE FUNCTION @extschema@.{name}("),
            format!("\nCREATE OR REPLACE FUNCTION @extschema@.{name}("),
        ]
        .iter()
        .filter_map(|header| steps.rfind(header.as_str()))
        .max()
        .expect("written by a step")
            + 1;
        let end = start + steps[start..].find("\n$$;\n").expect("its end") + 5;
        steps[start..end]
            .replacen("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
            .replace("@extschema@", schema)
    })
    .collect::<Vec<_>>()
    .join("\n")
}

/// Issue 39: a SQL-only database at 0.12.0 gets 0.13.0's retention
/// functions from `migrate()`, through the same step file the extension
/// updates with, and ends with the catalog of a fresh install.
#[test]
fn migrate_updates_a_sql_only_database_from_0_12_0() {
    let rt = runtime();
    let definitions = |client: &mut Client| -> Vec<String> {
        client
            .query(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p
                 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'loom%'
                 ORDER BY p.oid::regprocedure::text",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    on_each_server(|server, major| {
        let mut options = MigrateOptions::new();
        options.sql_only();
        let fresh = "loom_so_update_fresh";
        server.fresh_database(fresh);
        rt.block_on(migrate(&server.database_as(fresh, OWNER), &options))
            .unwrap_or_else(|e| panic!("{major}: {e}"));
        let db = "loom_so_update";
        server.fresh_database(db);
        let conninfo = server.database_as(db, OWNER);
        rt.block_on(migrate(&conninfo, &options))
            .unwrap_or_else(|e| panic!("{major}: {e}"));
        let mut owner = server.connect_as(db, OWNER);
        // A writer of before the update: its grants, without 0.14.0's
        // tables (and so without their grants).
        owner
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE loom_so_update_writer LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                 SELECT public.loom_grant_access('loom_so_update_writer'::regrole, 'writer'::text);
                 {} UPDATE loom.sql_only SET version = '0.12.0';
                 DROP TABLE loom.stripes, loom.migration_lock, loom.claims, loom.feed_state, loom.feed_high_water, loom.feed_consumers;
                 DROP SEQUENCE loom.feed_ord_seq;
                 ALTER TABLE loom.events DROP COLUMN feed_tx, DROP COLUMN feed_ord;
                 GRANT INSERT ON loom.events TO loom_so_update_writer;",
                retention_at_0_12_0("public")
            ))
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        assert_ne!(
            definitions(&mut owner),
            definitions(&mut server.connect_as(fresh, OWNER)),
            "{major}: 0.12.0's retention differs from the current"
        );
        let updated = rt
            .block_on(migrate(&conninfo, &options))
            .unwrap_or_else(|e| panic!("{major}: {e}"));
        assert_eq!(
            (updated.from_version.as_deref(), updated.to_version.as_str()),
            (Some("0.12.0"), LOOM_VERSION),
            "{major}"
        );
        assert_eq!(
            definitions(&mut owner),
            definitions(&mut server.connect_as(fresh, OWNER)),
            "{major}: updated from 0.12.0 as a fresh install"
        );
        let recorded: String = owner
            .query_one("SELECT version FROM loom.sql_only", &[])
            .unwrap()
            .get(0);
        assert_eq!(recorded, LOOM_VERSION, "{major}");
        // The update granted the writer what 0.14.0's stripe locks take.
        server
            .connect_as(db, "loom_so_update_writer")
            .batch_execute(
                "SELECT public.loom_append_event('w'::text, 1::bigint, 's'::text, '{}'::jsonb, NULL::jsonb);
                 SELECT public.loom_delete_execution('w'::text, 10000);",
            )
            .unwrap_or_else(|e| panic!("{major}: a writer of before the update: {}", describe(&e)));
        // And may no longer insert the whole table: not the feed's positions.
        let forged = server
            .connect_as(db, "loom_so_update_writer")
            .batch_execute(
                "INSERT INTO loom.events (execution_id, sequence, kind, payload, feed_tx) VALUES ('w', 1, 's', '{}', 1)",
            )
            .unwrap_err();
        assert_eq!(loom_harness::sqlstate(&forged), "42501", "{major}");
    });
}

/// Review finding (issue 28): a database's owner that is not superuser
/// fakes a SQL-only install (its own `loom.sql_only` and functions named as
/// loom's) where loom is not installed, or owns the real one; a superuser
/// running the `loom` command or the client there calls none of it.
#[test]
fn a_superuser_session_calls_none_of_the_owners_functions() {
    let rt = runtime();
    on_each_server(|server, major| {
        for (db, real) in [("loom_so_fake", false), ("loom_so_real", true)] {
            if real {
                server.fresh_sql_only_database(db);
            } else {
                server.fresh_database(db);
            }
            let trap = |name: &str| {
                format!(
                    "CREATE OR REPLACE FUNCTION public.{name} RETURNS void LANGUAGE plpgsql AS $f$
                     BEGIN INSERT INTO public.fired VALUES ('{name}', current_user); END $f$;"
                )
            };
            let fake = if real {
                String::new()
            } else {
                "CREATE SCHEMA loom;
                 CREATE TABLE loom.sql_only (one boolean PRIMARY KEY DEFAULT true, version text NOT NULL,
                                             function_schema name NOT NULL);
                 INSERT INTO loom.sql_only (version, function_schema) VALUES ('0.12.0', 'public');"
                    .to_owned()
            };
            server
                .connect_as(db, OWNER)
                .batch_execute(&format!(
                    "{fake}
                     CREATE TABLE public.fired (what text, who text);
                     GRANT INSERT ON public.fired TO PUBLIC;
                     {}",
                    if real {
                        // The owner replaces loom's own functions.
                        "CREATE OR REPLACE FUNCTION public.loom_take_migration_lock() RETURNS void LANGUAGE plpgsql AS $f$
                         BEGIN INSERT INTO public.fired VALUES ('loom_take_migration_lock', current_user); END $f$;"
                            .to_owned()
                    } else {
                        trap("loom_take_migration_lock()") + &trap("loom_status()")
                    }
                ))
                .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
            let as_superuser = server.database_as(db, "postgres");
            let mut options = MigrateOptions::new();
            if real {
                options.sql_only();
            }
            let err = rt.block_on(migrate(&as_superuser, &options)).unwrap_err();
            assert!(
                matches!(&err, Error::SqlOnlyOwnedByAnother { owner } if owner == OWNER),
                "{major} {db}: {err}"
            );
            let (code, out, _) = cli::loom(&["status"], &["--db", &as_superuser]);
            assert_ne!(code, 0, "{major} {db}: {out}");
            assert!(out.contains("connect as"), "{major} {db}: {out}");
            let events = PgEventStore::new(pg_pool(&as_superuser, 1).unwrap());
            assert!(
                matches!(
                    rt.block_on(events.check_server()),
                    Err(Error::SqlOnlyOwnedByAnother { .. })
                ),
                "{major} {db}"
            );
            let fired: i64 = server
                .connect_as(db, "postgres")
                .query_one("SELECT count(*) FROM public.fired", &[])
                .unwrap()
                .get(0);
            assert_eq!(fired, 0, "{major} {db}: the owner's code ran");
        }
    });
}

/// Issue 34, on the SQL-only flavour: a role loom never granted anything
/// holds every advisory key loom's migration lock and stripes were until
/// 0.14.0 (0x6C6F6F6D, and it with each stripe 0-63), and stalls
/// nothing: the owner's `migrate()`, a writer's appends and deletes, and
/// a retention sweep all run through. It cannot take the locks they are
/// now (`LOCK TABLE loom.migration_lock`, a row of `loom.stripes`), and a
/// writer can lock a stripe but not renumber one.
#[test]
fn a_role_with_no_grants_stalls_no_sql_only_migration_or_write() {
    let rt = runtime();
    on_each_server(|server, major| {
        let db = "loom_so_stall";
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        owner
            .batch_execute(
                "DO $$ BEGIN CREATE ROLE loom_so_stranger LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                 DO $$ BEGIN CREATE ROLE loom_so_stall_writer LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                 SELECT public.loom_grant_access('loom_so_stall_writer'::regrole, 'writer'::text);",
            )
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        let mut stranger = server.connect_as(db, "loom_so_stranger");
        stranger
            .batch_execute(
                "SELECT pg_advisory_lock(1819242349);
                 SELECT pg_advisory_lock(1819242349, s) FROM generate_series(0, 63) s;",
            )
            .unwrap();
        for statement in [
            "BEGIN; LOCK TABLE loom.migration_lock IN SHARE UPDATE EXCLUSIVE MODE",
            "BEGIN; SELECT FROM loom.stripes WHERE stripe = 0 FOR KEY SHARE",
        ] {
            let refused = stranger.batch_execute(statement).unwrap_err();
            assert_eq!(
                sqlstate(&refused),
                "42501",
                "{major}: {statement}: {}",
                describe(&refused)
            );
            stranger.batch_execute("ROLLBACK").unwrap();
        }
        let started = std::time::Instant::now();
        let mut options = MigrateOptions::new();
        options
            .sql_only()
            .migration_lock_wait(std::time::Duration::from_secs(5));
        rt.block_on(migrate(&server.database_as(db, OWNER), &options))
            .unwrap_or_else(|e| panic!("{major}: migrate beside the stranger: {e}"));
        let mut writer = server.connect_as(db, "loom_so_stall_writer");
        writer
            .batch_execute(
                "SET lock_timeout = '5s';
                 SELECT public.loom_append_event('held'::text, 1::bigint, 's'::text, '{}'::jsonb, NULL::jsonb);
                 SELECT public.loom_append_events(ARRAY['held', 'other'], ARRAY[2, 1]::bigint[], ARRAY['s', 's'], ARRAY['{}', '{}']::jsonb[], NULL::jsonb[]);
                 SELECT public.loom_delete_execution('other'::text, 10000);",
            )
            .unwrap_or_else(|e| panic!("{major}: writes beside the stranger: {}", describe(&e)));
        owner.batch_execute("SET lock_timeout = '5s'").unwrap();
        owner
            .batch_execute("CALL public.loom_sweep_idle_executions(interval '0 seconds', 10000)")
            .unwrap_or_else(|e| panic!("{major}: a sweep beside the stranger: {}", describe(&e)));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{major}: {:?}",
            started.elapsed()
        );
        let left: i64 = owner
            .query_one("SELECT count(*) FROM loom.executions", &[])
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "{major}: the sweep deleted every idle execution");
        // A writer may lock a stripe, and change nothing of what locks it.
        writer
            .batch_execute("BEGIN; SELECT FROM loom.stripes WHERE stripe = 7 FOR UPDATE; ROLLBACK")
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        let refused = writer
            .batch_execute("UPDATE loom.stripes SET stripe = stripe + 100")
            .unwrap_err();
        assert_eq!(
            sqlstate(&refused),
            "42501",
            "{major}: {}",
            describe(&refused)
        );
    });
}

/// Review finding (issue 28): installed by a superuser, loom's SECURITY
/// DEFINER functions would be the superuser's, calling functions in a
/// schema the database's owner controls; installed into a schema others
/// may create in, an overload planted beside loom's would be called in
/// its place. Both are refused before anything is created.
#[test]
fn only_the_owner_installs_and_only_into_a_schema_no_one_else_creates_in() {
    on_each_server(|server, major| {
        let db = "loom_so_who";
        server.fresh_database(db);
        let (ok, out) = server.psql_file(db, "postgres", &script_path());
        assert!(
            !ok && out.contains("installed by the database's owner"),
            "{major}: {out}"
        );
        server
            .connect_as(db, OWNER)
            .batch_execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
            .unwrap();
        let (ok, out) = server.psql_file(db, OWNER, &script_path());
        assert!(
            !ok && out.contains("other roles may create in schema"),
            "{major}: {out}"
        );
        let left: i64 = server
            .connect_as(db, OWNER)
            .query_one(
                "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'loom')
                        + (SELECT count(*) FROM pg_proc WHERE proname LIKE 'loom%')",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "{major}: a refused install left objects behind");
    });
}

/// Review finding (issue 28), in both flavours: a writer calling
/// `loom_track_appended` while a delete of the same execution is open
/// must not leave the id in loom.executions with no events.
#[test]
fn tracking_an_id_during_its_delete_leaves_no_orphan_in_either_flavour() {
    let run = |conninfo_as: &dyn Fn(&str) -> String, setup: &mut Client, label: &str| {
        setup
            .batch_execute(
                "DROP ROLE IF EXISTS loom_so_tracker; CREATE ROLE loom_so_tracker LOGIN;
                 SELECT loom_grant_access('loom_so_tracker', 'writer');
                 SELECT loom_append_event('ph', 1, 's', '{}');",
            )
            .unwrap_or_else(|e| panic!("{label}: {}", describe(&e)));
        let mut deleter =
            Client::connect(&conninfo_as("loom_so_tracker"), postgres::NoTls).unwrap();
        deleter
            .batch_execute("BEGIN; SELECT loom_delete_execution('ph');")
            .unwrap();
        let tracker_conninfo = conninfo_as("loom_so_tracker");
        let tracker = std::thread::spawn(move || {
            let mut tracker = Client::connect(&tracker_conninfo, postgres::NoTls).unwrap();
            tracker.batch_execute("SELECT loom_track_appended(ARRAY['ph'])")
        });
        std::thread::sleep(std::time::Duration::from_millis(500));
        deleter.batch_execute("COMMIT").unwrap();
        tracker
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("{label}: {}", describe(&e)));
        let indexed: i64 = setup
            .query_one(
                "SELECT count(*) FROM loom.executions WHERE execution_id = 'ph'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(indexed, 0, "{label}: 'ph' indexed with no events");
    };
    let native_db = "loom_so_orphan_native";
    let mut native = Cluster::C.fresh_database(native_db);
    run(
        &|role: &str| format!("{} dbname={native_db} user={role}", Cluster::C.conninfo()),
        &mut native,
        "the extension",
    );
    on_each_server(|server, major| {
        let db = "loom_so_orphan";
        server.fresh_sql_only_database(db);
        run(
            &|role: &str| server.database_as(db, role),
            &mut server.connect_as(db, OWNER),
            major,
        );
    });
}

/// Review finding (issue 28): the PL/pgSQL path walk re-read the value at
/// each step, so depth times size: a path of 1999 steps into a state 2000
/// deep holding a 262,144-element array took 17 s (the extension: 12 ms).
/// Now linear: well inside a 5 s statement_timeout, with the exact text.
#[test]
fn a_deep_path_into_a_large_state_reads_in_linear_time() {
    let depth = 2000;
    let bottom = format!("[{}0]", "0,".repeat(262_143));
    let state = format!("{}{bottom}{}", "[".repeat(depth - 1), "]".repeat(depth - 1));
    let frame = pgloom_core::frame::encode(&state, pgloom_core::frame::Codec::None).unwrap();
    let path: Vec<String> = vec!["0".to_owned(); depth - 1];
    on_each_server(|server, major| {
        let db = "loom_so_deep";
        server.fresh_sql_only_database(db);
        let mut reader = server.connect_as(db, OWNER);
        reader
            .batch_execute("SET statement_timeout = '5s'")
            .unwrap();
        let found: String = reader
            .query_one(
                "SELECT loom_snapshot_get_text($1, VARIADIC $2::text[])",
                &[&frame, &path],
            )
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)))
            .get(0);
        assert!(found == bottom, "{major}: not the bottom array's text");
    });
}

/// The move (docs/flavours.md): a SQL-only database on a server that has
/// loom.so, with events, metadata, a zstd snapshot, a run of deltas, refs,
/// lineage and two
/// granted roles, moved by a superuser with `loom move-to-extension`:
/// every row is in the extension's tables, the executions index is
/// exact, the roles keep their access, the server now decodes the zstd
/// frame, and none of the owner's code ran as the superuser.
#[test]
fn a_sql_only_database_moves_to_the_extension_without_losing_a_row() {
    let rt = runtime();
    let server = SqlOnlyServer::with_library(&Cluster::C.conninfo());
    let db = "loom_so_move";
    server.fresh_sql_only_database(db);
    let owner_conninfo = server.database_as(db, OWNER);
    let pool = pg_pool(&owner_conninfo, 2).unwrap();
    let events = PgEventStore::new(pool.clone());
    rt.block_on(
        events.append(&[
            Event::new("run-a", 1, "started", serde_json::json!({"n": 1})),
            Event::new("run-a", 2, "step", serde_json::json!({"n": 2}))
                .with_metadata(serde_json::json!({"trace_id": "t-1"})),
            Event::new("run-b", 1, "started", serde_json::json!({})),
        ]),
    )
    .unwrap();
    let mut options = PgSnapshotStoreOptions::new();
    options.codec(Codec::Zstd);
    let snapshots = rt
        .block_on(PgSnapshotStore::start(pool.clone(), &options))
        .unwrap();
    let state = serde_json::json!({"turns": vec!["the same words again and again"; 50]});
    rt.block_on(snapshots.save(&pgloom::snapshot_store::NewSnapshot::new(
        "run-a",
        "wf",
        2,
        pgloom::snapshot_store::JsonText::from_serialize(&state).unwrap(),
    )))
    .unwrap();
    // A run the client saved as deltas: each moves beside its keyframe.
    options.codec(Codec::Delta);
    let deltas = rt
        .block_on(PgSnapshotStore::start(pool.clone(), &options))
        .unwrap();
    let run: Vec<String> = (20..30)
        .map(|turns| loom_fixtures::agent_state(turns, false))
        .collect();
    for (i, state) in run.iter().enumerate() {
        rt.block_on(deltas.save(&pgloom::snapshot_store::NewSnapshot::new(
            "run-c",
            "wf",
            i as i64 + 1,
            pgloom::snapshot_store::JsonText::new(state.clone()).unwrap(),
        )))
        .unwrap();
    }
    let registry = PgBranchRegistry::new(pool);
    rt.block_on(pgloom::branch_registry::BranchRegistry::put_ref(
        &registry,
        "run-a/main",
        "run-a",
        2,
    ))
    .unwrap();
    let mut owner = server.connect_as(db, OWNER);
    owner
        .batch_execute(
            "INSERT INTO loom.lineage (execution_id, parent_execution_id, fork_sequence) VALUES ('run-b', 'run-a', 1);
             -- 0.16.0's state: the feed on, an event at its position, a
             -- consumer part way; run-a claimed under a fencing token.
             SELECT loom_feed_enable(true);
             SELECT loom_append_event('run-b', 2, 'fed', '{}');
             SELECT loom_feed_create_consumer('projector', '00000000000000010000000000000001');
             SELECT loom_schedule('run-a', NULL, 'q');
             SELECT * FROM loom_claim('q', 'before-the-move', interval '60 seconds', 1);
             -- Restarted by hand: the move still goes on above the token.
             ALTER SEQUENCE loom.claims_fence_seq RESTART WITH 1;
             DROP ROLE IF EXISTS loom_so_mv_writer; DROP ROLE IF EXISTS loom_so_mv_reader;
             CREATE ROLE loom_so_mv_writer LOGIN; CREATE ROLE loom_so_mv_reader LOGIN;
             SELECT loom_grant_access('loom_so_mv_writer', 'writer');
             SELECT loom_grant_access('loom_so_mv_reader', 'reader');
             -- What the owner plants for the superuser: a trigger on its
             -- log, and its own function named as one of loom's.
             CREATE TABLE public.fired (what text, who text);
             GRANT INSERT ON public.fired TO PUBLIC;
             CREATE FUNCTION public.trap() RETURNS trigger LANGUAGE plpgsql AS $f$
             BEGIN INSERT INTO public.fired VALUES (TG_NAME, current_user); RETURN NULL; END $f$;
             CREATE TRIGGER trap AFTER INSERT OR UPDATE OR DELETE ON loom.events
                 FOR EACH STATEMENT EXECUTE FUNCTION public.trap();",
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    const DIGEST: &str = "SELECT
        (SELECT md5(string_agg(concat_ws('|', execution_id, sequence, kind, payload, created_at, metadata), ',' ORDER BY execution_id, sequence)) FROM loom.events),
        (SELECT md5(string_agg(concat_ws('|', id, execution_id, workflow_id, sequence, created_at, state, encode(state_z, 'hex')), ',' ORDER BY id)) FROM loom.snapshots),
        (SELECT md5(string_agg(concat_ws('|', name, execution_id, sequence, updated_at), ',' ORDER BY name)) FROM loom.refs),
        (SELECT md5(string_agg(concat_ws('|', execution_id, parent_execution_id, fork_sequence, created_at), ',' ORDER BY execution_id)) FROM loom.lineage),
        (SELECT string_agg(concat_ws('|', execution_id, sequence, feed_tx, feed_ord), ',' ORDER BY feed_tx, feed_ord) FROM loom.events WHERE feed_tx IS NOT NULL),
        (SELECT string_agg(concat_ws('|', execution_id, queue, due_at, fence, holder, claimed_at), ',') FROM loom.claims),
        (SELECT string_agg(concat_ws('|', name, owner_role, position), ',') FROM loom.feed_consumers),
        (SELECT concat_ws('|', enabled, notify, era, tx_offset, (SELECT max(feed_tx) FROM loom.feed_high_water)) FROM loom.feed_state)";
    let digest = |client: &mut Client| -> Vec<String> {
        let row = client.query_one(DIGEST, &[]).unwrap();
        (0..8).map(|i| row.get::<_, String>(i)).collect()
    };
    let before = digest(&mut owner);

    let superuser = server.database_as(db, "postgres");
    let (code, out, _) = cli::loom(&["move-to-extension"], &["--db", &superuser]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("loom.events: 4 rows copied"), "{out}");
    assert!(out.contains("loom.claims: 1 rows copied"), "{out}");
    assert!(out.contains("loom.feed_consumers: 1 rows copied"), "{out}");
    assert!(
        out.contains("loom_so_mv_writer: granted writer again"),
        "{out}"
    );

    let mut admin = server.connect_as(db, "postgres");
    let version: String = admin
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'loom'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(version, LOOM_VERSION);
    assert_eq!(digest(&mut admin), before, "a row changed in the move");
    let fired: i64 = admin
        .query_one("SELECT count(*) FROM public.fired", &[])
        .unwrap()
        .get(0);
    assert_eq!(fired, 0, "the owner's trigger ran in the move");
    let indexed: Vec<String> = admin
        .query("SELECT execution_id FROM loom.executions ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(indexed, ["run-a", "run-b"]);
    // The feed is on again, and the claim goes on: its token completes it,
    // and the next claim's token is above it (the sequence moved too).
    admin
        .batch_execute(
            "SELECT loom_complete('run-a', (SELECT fence FROM loom.claims WHERE execution_id = 'run-a'), now())",
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    let (on, next_above): (bool, bool) = {
        let row = admin
            .query_one(
                "SELECT loom_feed_is_on(),
                        (SELECT fence FROM loom_claim('q', 'after-the-move', interval '60 seconds', 1))
                          > (SELECT max(fence) FROM loom_before_extension.claims)",
                &[],
            )
            .unwrap_or_else(|e| panic!("{}", describe(&e)));
        (row.get(0), row.get(1))
    };
    assert_eq!((on, next_above), (true, true));
    let decoded: String = admin
        .query_one(
            "SELECT loom_snapshot_state_text(state_z) FROM loom.snapshots WHERE execution_id = 'run-a'",
            &[],
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)))
        .get(0);
    assert!(decoded.contains("the same words again"));
    // And every delta, with its keyframe, where the SQL-only flavour
    // refused to.
    let moved: Vec<String> = admin
        .query(
            "SELECT loom_snapshot_state_text(s.state_z, b.state_z) FROM loom.snapshots s
             LEFT JOIN loom.snapshots b ON b.execution_id = s.execution_id
              AND b.sequence = loom_snapshot_base_sequence(s.state_z)
             WHERE s.execution_id = 'run-c' ORDER BY s.sequence",
            &[],
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)))
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(moved, run);
    let deltas_moved: i64 = admin
        .query_one(
            "SELECT count(*) FROM loom.snapshots WHERE loom_snapshot_base_sequence(state_z) IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(deltas_moved >= 5, "{deltas_moved} deltas moved");
    // The roles keep their access, through the client, as superuser's
    // sessions now may too.
    let writer =
        PgEventStore::new(pg_pool(&server.database_as(db, "loom_so_mv_writer"), 1).unwrap());
    rt.block_on(writer.append(&[Event::new("run-a", 3, "step", serde_json::json!({}))]))
        .unwrap_or_else(|e| panic!("writer after the move: {e}"));
    let reader =
        PgEventStore::new(pg_pool(&server.database_as(db, "loom_so_mv_reader"), 1).unwrap());
    let page = rt.block_on(reader.list_executions_page(None, 10)).unwrap();
    assert_eq!(page.ids, ["run-a", "run-b"]);
    let as_superuser = PgEventStore::new(pg_pool(&superuser, 1).unwrap());
    rt.block_on(as_superuser.check_server()).unwrap();
    // Moved once: a second move finds nothing to move, and changes nothing.
    let (code, out, _) = cli::loom(&["move-to-extension"], &["--db", &superuser]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("no SQL-only loom"), "{out}");
}

/// A SQL-only database at an older version moves to the extension at that
/// version, which PostgreSQL builds from 0.1.0's script and the upgrade
/// steps: those never add the snapshot frame column, which the SQL-only
/// flavour always has, so the move adds it (as that release's own script
/// did) instead of refusing the column (review of issue 36).
#[test]
fn a_sql_only_database_at_an_older_version_moves_to_the_extension() {
    let rt = runtime();
    let server = SqlOnlyServer::with_library(&Cluster::C.conninfo());
    for version in ["0.12.0", "0.14.0"] {
        let db = format!("loom_so_move_{}", version.replace('.', "_"));
        server.fresh_sql_only_database(&db);
        let pool = pg_pool(&server.database_as(&db, OWNER), 1).unwrap();
        let mut options = PgSnapshotStoreOptions::new();
        options.codec(Codec::Zstd);
        let snapshots = rt.block_on(PgSnapshotStore::start(pool, &options)).unwrap();
        let state = serde_json::json!({"turns": vec!["again and again"; 50]});
        rt.block_on(snapshots.save(&pgloom::snapshot_store::NewSnapshot::new(
            "run-a",
            "wf",
            1,
            pgloom::snapshot_store::JsonText::from_serialize(&state).unwrap(),
        )))
        .unwrap();
        server
            .connect_as(&db, OWNER)
            .batch_execute(&format!(
                "UPDATE loom.sql_only SET version = '{version}';
                 ALTER TABLE loom.events DROP COLUMN feed_tx, DROP COLUMN feed_ord;"
            ))
            .unwrap();
        let superuser = server.database_as(&db, "postgres");
        let (code, out, _) = cli::loom(&["move-to-extension"], &["--db", &superuser]);
        assert_eq!(code, 0, "{version}: {out}");
        let mut admin = server.connect_as(&db, "postgres");
        let row = admin
            .query_one(
                "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'loom'),
                        (SELECT loom_snapshot_state_text(state_z) FROM loom.snapshots)",
                &[],
            )
            .unwrap_or_else(|e| panic!("{version}: {}", describe(&e)));
        assert_eq!(row.get::<_, String>(0), version);
        assert!(
            row.get::<_, String>(1).contains("again and again"),
            "{version}"
        );
    }
}

/// Second review (issue 28): ways past the first fix, each refused before
/// any of the owner's functions runs. The owner replaces
/// `loom_take_migration_lock` and `loom_status` with traps, then a session
/// that may do more than it comes: a superuser the owner's `role` setting
/// turned into the owner (its code could `SET ROLE NONE` back), a member
/// of a superuser role, a role with CREATEROLE, a member of
/// `pg_read_all_data`; and a plain `loom migrate` (the extension asked
/// for) calls nothing of the SQL-only owner's either. A role with none of
/// that, granted by `loom_grant_access`, is served.
#[test]
fn sessions_that_may_do_more_than_the_owner_call_nothing_of_its() {
    let rt = runtime();
    on_each_server(|server, major| {
        let db = "loom_so_more";
        server.fresh_sql_only_database(db);
        let mut admin = server.connect_as("postgres", "postgres");
        for statement in [
            "DROP ROLE IF EXISTS loom_so_su_member",
            "DROP ROLE IF EXISTS loom_so_su_group",
            "DROP ROLE IF EXISTS loom_so_createrole",
            "DROP ROLE IF EXISTS loom_so_read_all",
            "CREATE ROLE loom_so_su_group SUPERUSER NOLOGIN",
            "CREATE ROLE loom_so_su_member LOGIN IN ROLE loom_so_su_group",
            "CREATE ROLE loom_so_createrole LOGIN CREATEROLE",
            "CREATE ROLE loom_so_read_all LOGIN IN ROLE pg_read_all_data",
        ] {
            admin
                .batch_execute(statement)
                .unwrap_or_else(|e| panic!("{major}: {statement}: {}", describe(&e)));
        }
        server
            .connect_as(db, OWNER)
            .batch_execute(
                "CREATE TABLE public.fired (what text, who text);
                 GRANT INSERT ON public.fired TO PUBLIC;
                 GRANT USAGE ON SCHEMA loom TO PUBLIC;
                 CREATE OR REPLACE FUNCTION public.loom_take_migration_lock() RETURNS void LANGUAGE plpgsql AS $f$
                 BEGIN INSERT INTO public.fired VALUES ('lock', session_user); END $f$;
                 ALTER FUNCTION public.loom_status() RENAME TO loom_status_kept;
                 CREATE FUNCTION public.loom_status() RETURNS TABLE(item text, value text, needs_action boolean, statement text)
                 LANGUAGE plpgsql AS $f$
                 BEGIN INSERT INTO public.fired VALUES ('status', session_user);
                       RETURN QUERY SELECT * FROM public.loom_status_kept(); END $f$;",
            )
            .unwrap_or_else(|e| panic!("{major}: {}", describe(&e)));
        let mut sql_only = MigrateOptions::new();
        sql_only.sql_only();
        for role in [
            "loom_so_su_member",
            "loom_so_createrole",
            "loom_so_read_all",
        ] {
            let conninfo = server.database_as(db, role);
            let err = rt.block_on(migrate(&conninfo, &sql_only)).unwrap_err();
            assert!(
                matches!(err, Error::SqlOnlyOwnedByAnother { .. }),
                "{major} {role}: {err}"
            );
            let (code, out, _) = cli::loom(&["status"], &["--db", &conninfo]);
            assert!(
                code != 0 && out.contains("connect as"),
                "{major} {role}: {out}"
            );
        }
        // The extension asked for: refused as the other flavour, before
        // the lock (the owner's) is taken.
        let as_owner = server.database_as(db, OWNER);
        let err = rt
            .block_on(migrate(&as_owner, &MigrateOptions::new()))
            .unwrap_err();
        assert!(matches!(err, Error::WrongFlavour { .. }), "{major}: {err}");
        // The owner makes every session of the database its own.
        server
            .connect_as("postgres", "postgres")
            .batch_execute(&format!("ALTER DATABASE {db} SET role = {OWNER}"))
            .unwrap();
        let superuser = server.database_as(db, "postgres");
        let err = rt.block_on(migrate(&superuser, &sql_only)).unwrap_err();
        assert!(
            matches!(err, Error::SqlOnlyOwnedByAnother { .. }),
            "{major}: {err}"
        );
        let (code, out, _) = cli::loom(&["status"], &["--db", &superuser]);
        assert!(code != 0 && out.contains("connect as"), "{major}: {out}");
        server
            .connect_as("postgres", "postgres")
            .batch_execute(&format!("ALTER DATABASE {db} RESET role"))
            .unwrap();
        let fired: Vec<(String, String)> = server
            .connect_as(db, "postgres")
            .query("SELECT what, who FROM public.fired", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert!(fired.is_empty(), "{major}: the owner's code ran: {fired:?}");
        // A role with none of that is served (it runs the owner's code
        // with its own rights: docs/flavours.md).
        server
            .connect_as(db, OWNER)
            .batch_execute(
                "DROP ROLE IF EXISTS loom_so_plain; CREATE ROLE loom_so_plain LOGIN;
                 SELECT loom_grant_access('loom_so_plain', 'writer');",
            )
            .unwrap();
        let writer =
            PgEventStore::new(pg_pool(&server.database_as(db, "loom_so_plain"), 1).unwrap());
        rt.block_on(writer.check_server())
            .unwrap_or_else(|e| panic!("{major}: a plain writer: {e}"));
    });
}

/// The move's review (issue 28): what the owner can do to a move, each
/// refused with nothing changed and none of its code run. While the move
/// waits for a table the owner holds, the owner swaps `loom.sql_only` for
/// a view calling its function (the move checks only after its locks); a
/// record naming loom's old schema as the functions' schema (the
/// extension would land where `DROP SCHEMA` takes it); a version that was
/// never a SQL-only release; and a lock held past the move's wait.
#[test]
fn what_the_owner_does_to_a_move_changes_nothing() {
    let server = SqlOnlyServer::with_library(&Cluster::C.conninfo());
    let db = "loom_so_move_hostile";
    let superuser = server.database_as(db, "postgres");
    let fresh = || {
        server.fresh_sql_only_database(db);
        let mut owner = server.connect_as(db, OWNER);
        owner
            .batch_execute(
                "SELECT loom_append_event('kept', 1, 's', '{}');
                 CREATE TABLE public.fired (what text, who text);
                 GRANT INSERT ON public.fired TO PUBLIC;
                 CREATE FUNCTION public.trap() RETURNS text LANGUAGE plpgsql AS $f$
                 BEGIN INSERT INTO public.fired VALUES ('trap', current_user); RETURN '0.12.0'; END $f$;",
            )
            .unwrap_or_else(|e| panic!("{}", describe(&e)));
        owner
    };
    let unchanged = |label: &str| {
        let mut admin = server.connect_as(db, "postgres");
        let row = admin
            .query_one(
                "SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'loom'),
                        (SELECT count(*) FROM public.fired),
                        to_regclass('loom.events') IS NOT NULL",
                &[],
            )
            .unwrap();
        assert_eq!(
            (
                row.get::<_, i64>(0),
                row.get::<_, i64>(1),
                row.get::<_, bool>(2)
            ),
            (0, 0, true),
            "{label}: the move changed something, or the owner's code ran"
        );
    };

    // The swap while the move waits.
    fresh();
    let mut holder = server.connect_as(db, OWNER);
    holder
        .batch_execute("BEGIN; LOCK TABLE loom.events IN ACCESS SHARE MODE")
        .unwrap();
    let mover_conninfo = superuser.clone();
    let mover = std::thread::spawn(move || {
        cli::loom(
            &["move-to-extension"],
            &["--db", &mover_conninfo, "--lock-timeout-ms", "20000"],
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let mut swapper = server.connect_as(db, OWNER);
    let swapped = swapper.batch_execute(
        "SET lock_timeout = '3s';
         DROP TABLE loom.sql_only;
         CREATE VIEW loom.sql_only AS SELECT true AS one, public.trap() AS version, 'public'::name AS function_schema;",
    );
    println!("the owner's swap: {:?}", swapped.as_ref().map_err(describe));
    holder.batch_execute("COMMIT").unwrap();
    let (code, out, _) = mover.join().unwrap();
    println!("the move after the swap: exit {code}: {out}");
    if swapped.is_ok() {
        assert_ne!(code, 0, "{out}");
        unchanged("a view swapped in while the move waited");
    } else {
        // The swap could not run beside the move: the move went on
        // against what it had locked, and ran nothing of the owner's.
        let fired: i64 = server
            .connect_as(db, "postgres")
            .query_one("SELECT count(*) FROM public.fired", &[])
            .unwrap()
            .get(0);
        assert_eq!(fired, 0, "{out}");
    }

    // A tampered record: the functions' schema, then the version.
    for (tamper, label) in [
        (
            "UPDATE loom.sql_only SET function_schema = 'loom_before_extension'",
            "the functions' schema named as the old tables'",
        ),
        (
            "UPDATE loom.sql_only SET version = '0.11.0'",
            "a version never released SQL-only",
        ),
    ] {
        let mut owner = fresh();
        owner.batch_execute(tamper).unwrap();
        let (code, out, _) = cli::loom(&["move-to-extension"], &["--db", &superuser]);
        assert!(
            code != 0 && out.contains("no SQL-only loom"),
            "{label}: {out}"
        );
        unchanged(label);
    }

    // A lock held past the move's wait: it fails, and writers were held
    // up only that long.
    fresh();
    let mut holder = server.connect_as(db, OWNER);
    holder
        .batch_execute("BEGIN; LOCK TABLE loom.refs IN ACCESS SHARE MODE")
        .unwrap();
    let (code, out, took) = cli::loom(
        &["move-to-extension"],
        &["--db", &superuser, "--lock-timeout-ms", "300"],
    );
    holder.batch_execute("ROLLBACK").unwrap();
    assert!(code != 0 && out.contains("lock timeout"), "{out}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    unchanged("a lock not had in time");
}

/// Third review (issue 34): what the planner evaluates as it plans a read
/// of the owner's tables runs with the owner's rights, never the
/// superuser's. The owner plants an `IMMUTABLE` function that makes it
/// superuser when a superuser runs it, behind a partial index's predicate
/// on `loom.events`, an expression index on `loom.sql_only` and an
/// expression statistics object on `loom.snapshots` (and, on 18, a
/// virtual generated column); its functions' schema and its name both
/// need quoting. The move runs them only as the owner, copies every row,
/// and the owner stays what it was.
#[test]
fn the_planner_runs_the_owners_expressions_in_a_move_only_as_the_owner() {
    let rt = runtime();
    let server = SqlOnlyServer::with_library(&Cluster::C.conninfo());
    let db = "loom_so_move_planner";
    let superuser = server.database_as(db, "postgres");
    const ESCALATE: &str = "
        CREATE TABLE public.ran (who text, was_superuser boolean);
        GRANT INSERT ON public.ran TO PUBLIC;
        CREATE FUNCTION public.escalate() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $f$
        DECLARE su boolean := (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
        BEGIN
            INSERT INTO public.ran VALUES (current_user, su);
            IF su THEN EXECUTE 'ALTER ROLE loom_sqlonly_owner SUPERUSER'; END IF;
            RETURN true;
        END $f$;
        CREATE FUNCTION public.trap() RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
        BEGIN RETURN public.escalate(); END $f$;";
    let fresh = |plant: &str| -> Client {
        server.fresh_database(db);
        let mut owner = server.connect_as(db, OWNER);
        owner.batch_execute("CREATE SCHEMA \"S3Fns\"").unwrap();
        let mut options = MigrateOptions::new();
        options.sql_only().schema("S3Fns");
        rt.block_on(migrate(&server.database_as(db, OWNER), &options))
            .unwrap_or_else(|e| panic!("migrate into \"S3Fns\": {e:?}"));
        owner
            .batch_execute(&format!(
                "SELECT \"S3Fns\".loom_append_event('kept', 1, 's', '{{}}');
                 SELECT \"S3Fns\".loom_save_snapshot('kept', 'wf', 1, '{{\"n\": 1}}');
                 {ESCALATE} {plant}; TRUNCATE public.ran"
            ))
            .unwrap_or_else(|e| panic!("{}", describe(&e)));
        owner
    };
    let is_superuser = |admin: &mut Client| -> bool {
        admin
            .query_one(
                "SELECT rolsuper FROM pg_roles WHERE rolname = $1",
                &[&OWNER],
            )
            .unwrap()
            .get(0)
    };

    let mut owner = fresh(
        "CREATE INDEX trap_predicate ON loom.events (sequence) WHERE public.trap();
         CREATE INDEX trap_expression ON loom.sql_only ((public.trap()));
         CREATE STATISTICS loom.trap_statistics ON (execution_id || public.trap()::text) FROM loom.snapshots",
    );
    let (code, out, _) = cli::loom(&["move-to-extension"], &["--db", &superuser]);
    let mut admin = server.connect_as(db, "postgres");
    let ran: Vec<(String, bool)> = admin
        .query("SELECT who, was_superuser FROM public.ran", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // Whatever the move did, the trap never ran as a superuser: the
    // owner's cleanup first, so a failure leaves no superuser behind.
    let escalated = is_superuser(&mut admin);
    if escalated {
        admin
            .batch_execute(&format!("ALTER ROLE {OWNER} NOSUPERUSER"))
            .unwrap();
    }
    assert!(!escalated, "the owner became superuser in the move: {out}");
    assert!(ran.iter().all(|(_, su)| !su), "{ran:?}");
    assert_eq!(code, 0, "{out}");
    // The reads did plan the owner's expressions: as the owner.
    assert!(
        ran.iter().any(|(who, _)| who == OWNER),
        "the trap never ran, so this proves nothing: {ran:?}"
    );
    assert!(out.contains("loom.events: 1 rows copied"), "{out}");
    assert!(out.contains("loom.snapshots: 1 rows copied"), "{out}");
    let functions_schema: String = admin
        .query_one(
            "SELECT n.nspname::text FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
             WHERE e.extname = 'loom'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(functions_schema, "S3Fns");
    // What the move made to read as the owner is gone with it.
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'loom\\_move\\_read\\_%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    // Its owner checks and drops the old tables, as docs/flavours.md says.
    owner
        .batch_execute("SELECT count(*) FROM loom_before_extension.events; DROP SCHEMA loom_before_extension CASCADE")
        .unwrap_or_else(|e| panic!("{}", describe(&e)));

    let major = server_major(&mut admin);
    drop(admin);
    // Review of the first fix: the owner's code, run as the owner inside
    // the superuser's transaction, queued a deferred constraint trigger
    // that fired at COMMIT as the superuser (15-17), and left settings
    // behind. In the sandbox a refresh runs in, neither can happen.
    fresh(
        "CREATE TABLE public.queue (x int);
         CREATE FUNCTION public.later() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN PERFORM public.escalate(); RETURN NULL; END $f$;
         CREATE CONSTRAINT TRIGGER later AFTER INSERT ON public.queue DEFERRABLE INITIALLY DEFERRED
             FOR EACH ROW EXECUTE FUNCTION public.later();
         CREATE FUNCTION public.queue_it() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $f$
         BEGIN
             INSERT INTO public.queue VALUES (1);
             PERFORM pg_catalog.set_config('search_path', 'public, pg_catalog', false);
             PERFORM pg_catalog.set_config('row_security', 'on', false);
             RETURN true;
         END $f$;
         CREATE TABLE public.armed (armed boolean);
         CREATE FUNCTION public.deferred_trap() RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
         BEGIN
             IF EXISTS (SELECT FROM public.armed) THEN RETURN public.queue_it(); END IF;
             RETURN true;
         END $f$;
         CREATE INDEX deferred_trap ON loom.sql_only (version) WHERE public.deferred_trap();
         INSERT INTO public.armed VALUES (true)",
    );
    let (code, out, _) = cli::loom(&["move-to-extension"], &["--db", &superuser]);
    let mut admin = server.connect_as(db, "postgres");
    let escalated = is_superuser(&mut admin);
    if escalated {
        admin
            .batch_execute(&format!("ALTER ROLE {OWNER} NOSUPERUSER"))
            .unwrap();
    }
    assert!(
        !escalated,
        "a deferred trigger made the owner superuser: {out}"
    );
    let ran_as_superuser: i64 = admin
        .query_one("SELECT count(*) FROM public.ran WHERE was_superuser", &[])
        .unwrap()
        .get(0);
    assert_eq!(ran_as_superuser, 0, "{out}");
    // The sandbox refuses the deferred trigger: the move fails, and
    // nothing changed.
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("deferred trigger"), "{out}");
    let extension: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_extension WHERE extname = 'loom'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(extension, 0, "{out}");

    // 18's virtual generated columns: PostgreSQL refuses a function of
    // the owner's in one.
    if major >= 18 {
        drop(admin);
        fresh("SELECT 1");
        let refused = server
            .connect_as(db, OWNER)
            .batch_execute(
                "ALTER TABLE loom.events ADD COLUMN trapped boolean GENERATED ALWAYS AS (public.trap()) VIRTUAL",
            )
            .unwrap_err();
        assert_eq!(sqlstate(&refused), "0A000", "{}", describe(&refused));
    }
}

/// The hostile-role suite of issue 16 (src/hostile_roles.rs), on the
/// SQL-only flavour: a role with no grants, a reader and a writer try
/// every function it installs, and gain nothing; an honest writer is
/// never stalled.
#[test]
fn no_role_gains_anything_through_any_function_the_sql_only_flavour_installs() {
    on_each_server(|server, _major| {
        loom_harness::hostile_roles::no_role_gains_anything_through_any_function_loom_installs(
            &loom_harness::hostile_roles::Place::sql_only(server, "loom_so_hostile_roles"),
        );
    });
}

/// The extension's pgrx chain as [`pgloom_core::sql::PARTS`] orders it:
/// the bootstrap part first, each part after requiring the one before it,
/// and the last one finalizing, so that the extension's script runs the
/// same parts in the same order as the SQL-only flavour, each native part
/// after the portable one it replaces bodies of.
fn pgrx_chain() -> String {
    use pgloom_core::sql::PARTS;
    let mut chain = String::from(
        "// @generated from pgloom_core::sql::PARTS (loom-core/src/sql.rs), the one\n\
         // list of loom's SQL in install order, by tests/install/sql_only.rs\n\
         // `the_extensions_pgrx_chain_is_generated_from_parts`: edit PARTS, then\n\
         // run that test with LOOM_BLESS=1 to write this file again.\n",
    );
    for (i, part) in PARTS.iter().enumerate() {
        let placement = match i {
            0 => "bootstrap".to_owned(),
            _ if i == PARTS.len() - 1 => "finalize".to_owned(),
            _ => format!("requires = [\"{}\"]", PARTS[i - 1].name),
        };
        chain.push_str(&format!(
            "::pgrx::extension_sql_file!(\n    \"../../loom-core/sql/{}\",\n    name = \"{}\",\n    {placement}\n);\n",
            part.file, part.name
        ));
    }
    chain
}

#[test]
fn the_extensions_pgrx_chain_is_generated_from_parts() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/loom_pg/src/parts.rs");
    let expected = pgrx_chain();
    if std::env::var_os("LOOM_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(path, &expected).expect("loom_pg/src/parts.rs is writable");
    }
    let found = std::fs::read_to_string(path).expect("loom_pg/src/parts.rs");
    assert!(
        found == expected,
        "loom_pg/src/parts.rs is not PARTS' chain: run this test with LOOM_BLESS=1 and commit it.\nExpected:\n{expected}"
    );
}
