//! `pg_upgrade` across majors with loom installed (issue 17): a PostgreSQL
//! 15 cluster holding loom's data (events under adversarial ids, snapshots
//! as JSONB and as both frame formats, refs, lineage) is upgraded to 18 by
//! the documented procedure: the same loom version installed for the new
//! major first, then `pg_upgrade`. Every row must come through, byte for
//! byte, and every kind of loom call must work on the new server.
//!
//! It needs two PostgreSQL builds of one family with loom installed in
//! each (Debian's 15 stores an attribute option other builds refuse):
//! `make test.pg_upgrade` installs loom into the relocatable 15.19 and 18.6
//! builds and runs it with `LOOM_PG_UPGRADE_OLD_BIN` and
//! `LOOM_PG_UPGRADE_NEW_BIN` set. A plain run lists it as ignored.

use std::path::PathBuf;

use loom_harness::cluster_control::{pgroot, run_postgres_program};
use loom_harness::scratch_server::{fresh_postgres_dir, ScratchServer};
use loom_harness::{adversarial_id, describe, LOOM_VERSION};
use postgres::Client;

const DB: &str = "loom_pg_upgrade";

fn bin(var: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{var} is not set: run `make test.pg_upgrade`"))
}

/// Every row of each of loom's tables, as text in a fixed order, hashed,
/// with the counts; and what loom's read functions return.
fn fingerprint(client: &mut Client) -> Vec<String> {
    let mut out = Vec::new();
    for table in [
        "events",
        "executions",
        "snapshots",
        "refs",
        "lineage",
        "feed_state",
        "feed_consumers",
        "claims",
    ] {
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*)::text || ' rows, md5 ' ||
                            coalesce(md5(string_agg(t::text, E'\\n' ORDER BY t::text COLLATE \"C\")), '-')
                     FROM loom.{table} t"
                ),
                &[],
            )
            .unwrap_or_else(|e| panic!("{table}: {}", describe(&e)));
        out.push(format!("loom.{table}: {}", row.get::<_, String>(0)));
    }
    let reads = [
        "SELECT string_agg(id, ',') FROM loom_list_executions(NULL, 100000) AS id",
        "SELECT string_agg(name, ',') FROM loom_list_refs(NULL, 100000) AS name",
        "SELECT string_agg(loom_snapshot_state_text(state_z), ',' ORDER BY id) FROM loom.snapshots WHERE state_z IS NOT NULL",
        "SELECT string_agg(s.state::text, ',' ORDER BY s.id) FROM loom.snapshots_decoded s",
        "SELECT string_agg(kind || ':' || payload::text, ',' ORDER BY sequence)
           FROM loom_read_events((SELECT min(execution_id COLLATE \"C\") FROM loom.events), NULL, 1000)",
        "SELECT extversion FROM pg_extension WHERE extname = 'loom'",
        "SELECT string_agg(feed_position || execution_id || sequence, ',') FROM loom_feed_read(NULL, 10000)",
    ];
    for sql in reads {
        let value: Option<String> = client
            .query_one(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)))
            .get(0);
        let value = value.unwrap_or_default();
        out.push(format!(
            "{sql}: {} bytes, digest {:x}",
            value.len(),
            digest(&value)
        ));
    }
    out
}

/// A small, stable digest for the fingerprint lines (not security).
fn digest(text: &str) -> u64 {
    // FNV-1a: enough to tell two texts apart in a test's output.
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// loom's data, written through its SQL API on the old server.
fn write_data(client: &mut Client) {
    client
        .batch_execute(
            "CREATE EXTENSION loom; SELECT loom_ensure_snapshot_zstd(); SELECT loom_feed_enable();
             SELECT loom_feed_create_consumer('projector');",
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    let ids: Vec<String> = (0..300).map(adversarial_id).collect();
    let (mut eids, mut seqs, mut kinds, mut payloads) = (vec![], vec![], vec![], vec![]);
    for id in &ids {
        for seq in 1..=4_i64 {
            eids.push(id.clone());
            seqs.push(seq);
            kinds.push(format!("step-{seq}"));
            payloads.push(serde_json::json!({"n": seq, "big": 12_345_678_901_234_567_i64, "ü": [1, 2.5, null]}));
        }
    }
    client
        .execute(
            "SELECT loom_append_events($1, $2, $3, $4)",
            &[&eids, &seqs, &kinds, &payloads],
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    for (i, id) in ids.iter().take(30).enumerate() {
        // zstd gives 0x02, or 0x01 where compressing would not make it smaller.
        let codec = ["none", "zstd"][i % 2];
        let state = format!(
            "{{\"turns\":[{{\"i\":{i},\"text\":\"{}\"}}],\"z\":1,\"a\":2}}",
            "x".repeat(i * 100)
        );
        client
            .execute(
                "SELECT loom_save_snapshot($1, 'wf', 2, $2, $3)",
                &[id, &state, &codec],
            )
            .unwrap_or_else(|e| panic!("{codec}: {}", describe(&e)));
    }
    for (i, id) in ids.iter().take(20).enumerate() {
        client
            .execute(
                "SELECT loom_put_ref($1, $2, 3)",
                &[&format!("ref/{i}/{id}"), id],
            )
            .unwrap_or_else(|e| panic!("{}", describe(&e)));
    }
    client
        .batch_execute(&format!(
            "INSERT INTO loom.lineage (execution_id, parent_execution_id, fork_sequence)
             VALUES ('{}', '{}', 2)",
            ids[1].replace('\'', "''"),
            ids[0].replace('\'', "''")
        ))
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
}

#[test]
#[ignore = "needs two PostgreSQL builds with loom installed: make test.pg_upgrade"]
fn pg_upgrade_from_15_to_18_keeps_every_row_and_every_call_works() {
    let old_bin = bin("LOOM_PG_UPGRADE_OLD_BIN");
    let new_bin = bin("LOOM_PG_UPGRADE_NEW_BIN");
    let root: PathBuf = pgroot().join("pg_upgrade");
    // A fresh pair each run (a server a killed run left is stopped first),
    // in en-US, the order users' databases have; pg_upgrade works in work/.
    let old = ScratchServer::init(
        &old_bin,
        root.join("old"),
        loom_harness::scratch_port("PG_UPGRADE_OLD"),
        &["--locale=en_US.UTF-8"],
    );
    old.start("");
    old.connect("postgres")
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .unwrap();
    let mut client = old.connect(DB);
    write_data(&mut client);
    let before = fingerprint(&mut client);
    let old_version: String = client
        .query_one("SHOW server_version_num", &[])
        .unwrap()
        .get(0);
    drop(client);
    old.stop();

    // The documented procedure: loom of the same version is installed for
    // the new major (make test.pg_upgrade did), then pg_upgrade.
    // 18's initdb turns data checksums on by default; pg_upgrade needs the
    // new cluster to match the old one, which has none.
    let new = ScratchServer::init(
        &new_bin,
        root.join("new"),
        loom_harness::scratch_port("PG_UPGRADE_NEW"),
        &["--locale=en_US.UTF-8", "--no-data-checksums"],
    );
    let work = root.join("work");
    fresh_postgres_dir(&work);
    let report = run_postgres_program(
        &new_bin,
        &work,
        "pg_upgrade",
        &[
            "-b",
            &old_bin,
            "-B",
            &new_bin,
            "-d",
            old.dir().to_str().unwrap(),
            "-D",
            new.dir().to_str().unwrap(),
            "-p",
            &old.port().to_string(),
            "-P",
            &new.port().to_string(),
            "-s",
            work.to_str().unwrap(),
        ],
    )
    .unwrap_or_else(|e| panic!("pg_upgrade: {e}"));
    assert!(report.contains("Upgrade Complete"), "{report}");

    new.start("");
    let mut client = new.connect(DB);
    let new_version: String = client
        .query_one("SHOW server_version_num", &[])
        .unwrap()
        .get(0);
    println!("pg_upgrade {old_version} -> {new_version}: loom {LOOM_VERSION}");
    let after = fingerprint(&mut client);
    for line in &after {
        println!("  {line}");
    }
    assert_eq!(
        before, after,
        "every row and every read must come through pg_upgrade"
    );

    // The feed goes on: pg_upgrade keeps transaction ids, so a new event
    // comes after every position from before.
    client
        .batch_execute("SELECT loom_feed_enable(); SELECT loom_append_event('fed-after-upgrade', 1, 'k', '{}');")
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    let (last, era): (String, i32) = {
        let row = client
            .query_one(
                "SELECT (SELECT feed_position FROM loom_feed_read(NULL, 10000) ORDER BY 1 DESC LIMIT 1),
                        (SELECT era FROM loom.feed_state)",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let new_event: String = client
        .query_one(
            "SELECT execution_id FROM loom_feed_read(NULL, 10000) WHERE feed_position = $1",
            &[&last],
        )
        .unwrap()
        .get(0);
    assert_eq!((new_event.as_str(), era), ("fed-after-upgrade", 1));
    // Every kind of call works on the new server: appends (new and
    // existing executions, duplicates refused), paging, snapshots in both
    // formats and their decoding, refs, retention, the (no-op) update.
    client
        .batch_execute(
            "SELECT loom_append_event('after-upgrade', 1, 'started', '{}');
             SELECT loom_append_events(ARRAY['after-upgrade', (SELECT min(execution_id COLLATE \"C\") FROM loom.events)],
                                       ARRAY[2, 99]::bigint[], ARRAY['x', 'y'], ARRAY['{}', '{}']::jsonb[]);
             SELECT loom_save_snapshot('after-upgrade', 'wf', 2, '{\"b\":1,\"a\":[1,2]}', 'zstd');
             SELECT loom_put_ref('after', 'after-upgrade', 2);
             SELECT loom_delete_events('after-upgrade', 1);
             ALTER EXTENSION loom UPDATE;",
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    let dup = client
        .batch_execute("SELECT loom_append_event('after-upgrade', 2, 'again', '{}')")
        .expect_err("a duplicate is refused");
    assert_eq!(
        dup.code().map(|c| c.code()),
        Some("23505"),
        "{}",
        describe(&dup)
    );
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM loom_list_executions(NULL, 100000)),
                    (SELECT loom_snapshot_state_text(state_z) FROM loom.snapshots WHERE execution_id = 'after-upgrade'),
                    (SELECT state->'a'->>1 FROM loom_load_snapshot('after-upgrade')),
                    (SELECT loom_compare_execution_ids('a_b', 'A1')),
                    (SELECT extversion FROM pg_extension WHERE extname = 'loom')",
            &[],
        )
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    assert_eq!(
        row.get::<_, i64>(0),
        302,
        "300 ids, the feed's new one and this one"
    );
    assert_eq!(row.get::<_, String>(1), "{\"b\":1,\"a\":[1,2]}");
    assert_eq!(row.get::<_, String>(2), "2");
    assert_eq!(row.get::<_, i32>(3), 1, "code point order: 'a' after 'A'");
    assert_eq!(row.get::<_, String>(4), LOOM_VERSION);
    drop(client);
    new.stop();
}
