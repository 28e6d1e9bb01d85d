//! A fresh PostgreSQL database per test. The server comes from `CTXPROXY_TEST_PG_URL`; databases
//! are created through `CTXPROXY_TEST_PG_ADMIN_URL` when set (as `.ci/run` does), else through
//! `CTXPROXY_TEST_PG_URL` itself (it must then be allowed to CREATE DATABASE). Unset means "skip
//! with a note", except under `CI=true`, where a missing database must fail the run rather than
//! silently test less.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The admin URL, or `None` (after a printed note) when PostgreSQL tests are to be skipped.
pub fn admin_url() -> Option<String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    match var("CTXPROXY_TEST_PG_URL") {
        Some(url) => Some(var("CTXPROXY_TEST_PG_ADMIN_URL").unwrap_or(url)),
        None => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("CTXPROXY_TEST_PG_URL must be set when CI=true");
            }
            eprintln!("note: CTXPROXY_TEST_PG_URL is unset; skipping the PostgreSQL variant");
            None
        }
    }
}

/// A database created for one test and dropped (forcibly) when this value is dropped.
pub struct PgTestDb {
    /// URL of the fresh database.
    pub url: String,
    admin_url: String,
    name: String,
}

impl PgTestDb {
    /// Creates a uniquely named database; `None` when PostgreSQL tests are skipped.
    pub async fn create() -> Option<PgTestDb> {
        let admin_url = admin_url()?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!(
            "ctxproxy_test_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos % 1_000_000_000
        );
        let mut admin = PgConnection::connect(&admin_url)
            .await
            .expect("connect to CTXPROXY_TEST_PG_URL");
        // Concurrent CREATE DATABASE can fail while another copies template1; retry a little.
        let mut attempt = 0;
        loop {
            let sql = format!("CREATE DATABASE \"{name}\"");
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut admin)
                .await
            {
                Ok(_) => break,
                Err(e) if attempt < 20 => {
                    attempt += 1;
                    eprintln!("retrying CREATE DATABASE: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("CREATE DATABASE {name}: {e}"),
            }
        }
        let _ = admin.close().await;
        Some(PgTestDb {
            url: with_database(&admin_url, &name),
            admin_url,
            name,
        })
    }
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        // Drop runs outside async; use a small runtime on its own thread.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let done = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut admin) = PgConnection::connect(&admin_url).await {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut admin)
                        .await;
                    let _ = admin.close().await;
                }
            });
        });
        let _ = done.join();
    }
}

/// `url` with its database name replaced by `name` (query string kept).
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_and_path = &base[scheme_end..];
    let host = host_and_path.split('/').next().unwrap_or(host_and_path);
    format!("{}{}/{}{}", &base[..scheme_end], host, name, query)
}
