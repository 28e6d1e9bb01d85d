//! Migration 0009 fills `reply_items` from the Responses replies stored before it (the sweep
//! audit: after an upgrade, a reference to such a reply was not resolved). The migration files
//! themselves are run, in order, on a database that holds a reply stored by version 8.

mod common;

use std::path::Path;

const DIR: &str = env!("CARGO_MANIFEST_DIR");

/// The files of `migrations/<db>/`, in order, up to and including `last`.
fn migration_files(db: &str, last: u32) -> Vec<String> {
    let dir = Path::new(DIR).join("migrations").join(db);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n[..4].parse::<u32>().is_ok_and(|v| v <= last))
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| std::fs::read_to_string(dir.join(n)).unwrap())
        .collect()
}

const REPLY: &str = r#"{"type":"message","id":"msg_before","role":"assistant","content":[{"type":"output_text","text":"stored by version 8","annotations":[]}]}"#;
const CHAT_REPLY: &str = r#"{"role":"assistant","content":"a chat reply has no item id"}"#;

#[test]
fn replies_stored_before_0009_are_found_by_their_item_id_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        for sql in migration_files("sqlite", 8) {
            conn.execute_batch(&sql).unwrap();
        }
        conn.execute_batch(&format!(
            "INSERT INTO sessions (tenant, id, key_hash, created_at, updated_at) VALUES ('t', 's', 'k1', 0, 0);
             INSERT INTO messages (tenant, session_id, id, seq, origin, reply_in_prefix, body, created_at)
               VALUES ('t', 's', x'01', 0, 'reply', 1, '{REPLY}', 0),
                      ('t', 's', x'02', 1, 'reply', 1, '{CHAT_REPLY}', 0);"
        ))
        .unwrap();
        let sql = migration_files("sqlite", 9).pop().unwrap();
        conn.execute_batch(&sql).unwrap();
        let rows: Vec<(String, String)> = conn
            .prepare("SELECT item_id, key_hash FROM reply_items")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows, [("msg_before".to_string(), "k1".to_string())]);
    }
}

#[tokio::test]
async fn replies_stored_before_0009_are_found_by_their_item_id_on_postgres() {
    let Some(db) = common::pg::PgTestDb::create().await else {
        return;
    };
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for sql in migration_files("postgres", 8) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let seed = format!(
        "INSERT INTO sessions (tenant, id, key_hash, created_at, updated_at) VALUES ('t', 's', 'k1', 0, 0);
         INSERT INTO messages (tenant, session_id, id, seq, origin, reply_in_prefix, body, created_at)
           VALUES ('t', 's', '\\x01', 0, 'reply', true, '{REPLY}', 0),
                  ('t', 's', '\\x02', 1, 'reply', true, '{CHAT_REPLY}', 0);"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(seed))
        .execute(&mut conn)
        .await
        .unwrap();
    let sql = migration_files("postgres", 9).pop().unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .unwrap();
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT item_id, key_hash FROM reply_items")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, [("msg_before".to_string(), "k1".to_string())]);
}
