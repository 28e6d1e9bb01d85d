//! One conformance suite for every `Store` backend: each behaviour is a generic async function
//! over a `Fixture` (an `Arc<dyn Store>` plus its URL), run once on a fresh temporary SQLite
//! file and once on a fresh PostgreSQL database (see `common/pg.rs` for skipping rules).

#[path = "store_conformance/admin.rs"]
mod admin;
// Included by path (not `mod common;`) so this suite does not depend on, or collide with, the
// HTTP harness in tests/common/mod.rs; that file may `pub mod pg;` to share the helper.
#[path = "store_conformance/leases.rs"]
mod leases;
#[path = "common/pg.rs"]
mod pg;
#[path = "store_conformance/tree.rs"]
mod tree;
#[path = "store_conformance/turns.rs"]
mod turns;

use std::sync::Arc;

use ctxproxy::store::{self, NewMessage, Origin, Scope, Store};
use serde_json::{Value, json};

/// A migrated store on a database of its own.
pub struct Fixture {
    pub store: Arc<dyn Store>,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<pg::PgTestDb>,
}

impl Fixture {
    async fn sqlite() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        // A subdirectory that does not exist yet: connect must create it.
        let url = format!("sqlite://{}/data/store.db?mode=rwc", dir.path().display());
        let store = store::connect(&url, 4).await.expect("open sqlite");
        store.migrate().await.expect("migrate");
        Fixture {
            store,
            url,
            _dir: Some(dir),
            _pg: None,
        }
    }

    async fn postgres() -> Option<Fixture> {
        let db = pg::PgTestDb::create().await?;
        let store = store::connect(&db.url, 4).await.expect("connect postgres");
        store.migrate().await.expect("migrate");
        Some(Fixture {
            store,
            url: db.url.clone(),
            _dir: None,
            _pg: Some(db),
        })
    }

    /// Another store instance (its own pool) on the same database, as a second process would be.
    pub async fn second_store(&self) -> Arc<dyn Store> {
        store::connect(&self.url, 4).await.expect("second store")
    }

    async fn finish(self) {
        self.store.close().await;
    }
}

/// Generates `<behaviour>::sqlite` and `<behaviour>::postgres` tests.
macro_rules! conformance {
    ($($module:ident :: $name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let fx = super::Fixture::sqlite().await;
                super::$module::$name(&fx).await;
                fx.finish().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(fx) = super::Fixture::postgres().await else { return };
                super::$module::$name(&fx).await;
                fx.finish().await;
            }
        }
    )*};
}

conformance!(
    tree::append_is_idempotent_and_keeps_order,
    tree::ten_tool_turns_are_stored_once_in_order,
    tree::divergence_starts_a_branch_and_head_is_last_written,
    tree::unknown_fields_round_trip_by_value,
    tree::auto_match_finds_longest_prefix_with_a_reply,
    tree::auto_match_is_isolated_by_tenant_and_scope,
    tree::auto_match_handles_long_conversations,
    admin::tenants_with_the_same_session_id_are_isolated,
    admin::session_list_is_keyset_paginated_newest_first,
    admin::delete_removes_the_session_and_everything_in_it,
    admin::request_records_are_listed_oldest_first,
    admin::summaries_keep_history_and_follow_the_branch,
    admin::response_ids_resolve_within_their_tenant,
    admin::migrate_twice_is_a_no_op,
    leases::summary_lease_is_exclusive_until_released_or_expired,
    leases::session_lease_is_exclusive_and_expired_one_is_taken_over,
    leases::session_lease_serialises_turns_across_two_stores,
    leases::a_busy_process_does_not_starve_another_s_waiter,
    leases::a_dropped_waiter_withdraws_its_claim,
    leases::lost_database_is_store_unavailable,
    turns::a_turn_stores_request_reply_record_and_response_id,
    turns::a_turn_waits_for_the_lease_before_appending,
    turns::a_waiting_turn_is_not_held_up_by_its_own_first_try,
    turns::a_failed_open_holds_nothing,
    turns::a_failing_reply_still_leaves_the_record_and_frees_the_lease,
    turns::a_close_nothing_of_which_was_stored_is_handed_back,
    turns::a_close_whose_record_failed_is_handed_back_and_done_again_once,
    turns::reply_items_are_found_by_their_id_for_their_key,
);

/// A chat message with the given role and text.
pub fn msg(role: &str, text: &str) -> Value {
    json!({"role": role, "content": text})
}

/// Appends `bodies` (origin per body: assistant = reply, else client) as the client would resend
/// them: the whole conversation from the root.
pub async fn send(store: &dyn Store, tenant: &str, session: &str, bodies: &[Value]) {
    let mut parent = None;
    let mut chain = Vec::new();
    for b in bodies {
        let origin = if b["role"] == "assistant" {
            Origin::Reply
        } else {
            Origin::Client
        };
        let m = NewMessage::chain(parent.as_ref(), std::slice::from_ref(b), origin).remove(0);
        parent = Some(m.id);
        chain.push(m);
    }
    store
        .append_messages(tenant, session, None, &chain)
        .await
        .expect("append");
}

/// The default scope used by tests that do not care about scoping.
pub fn scope() -> Scope {
    Scope {
        key_hash: Some("k1".into()),
        user: None,
    }
}

/// A SQLite path that cannot be created (its parent is a file) fails as `StoreUnavailable`.
#[tokio::test]
async fn sqlite_at_an_unusable_path_is_store_unavailable() {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let url = format!("sqlite://{}/sub/x.db?mode=rwc", file.path().display());
    match store::connect(&url, 1).await {
        Err(ctxproxy::Error::StoreUnavailable(_)) => {}
        Err(other) => panic!("expected StoreUnavailable, got {other:?}"),
        Ok(_) => panic!("expected StoreUnavailable, got a store"),
    }
}

/// Unknown URL schemes are a configuration error.
#[tokio::test]
async fn unknown_scheme_is_a_config_error() {
    assert!(matches!(
        store::connect("mysql://x/y", 1).await,
        Err(ctxproxy::Error::Config(_))
    ));
}
