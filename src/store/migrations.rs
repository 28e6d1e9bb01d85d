//! The schema migrations, embedded in the binary (it must not depend on the working directory).
//! Each backend runs them itself rather than through sqlx's `Migrator`, whose PostgreSQL
//! locking uses advisory locks; ours serialise on a row of `ctxproxy_migrations` instead, which
//! any PostgreSQL-compatible database supports.

use sha2::{Digest, Sha256};

/// One migration file.
pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// Hex sha256 of the SQL: an applied migration whose file changed afterwards is an error.
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.sql.as_bytes()))
    }
}

/// `migrations/sqlite/`, in order.
pub(crate) const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        description: "conversation store",
        sql: include_str!("../../migrations/sqlite/0001_conversation_store.sql"),
    },
    Migration {
        version: 2,
        description: "prefix index on replied rows only",
        sql: include_str!("../../migrations/sqlite/0002_prefix_index_replies_only.sql"),
    },
    Migration {
        version: 3,
        description: "usage in request records",
        sql: include_str!("../../migrations/sqlite/0003_request_usage.sql"),
    },
    Migration {
        version: 4,
        description: "upstream root of a response id",
        sql: include_str!("../../migrations/sqlite/0004_response_upstream_root.sql"),
    },
    Migration {
        version: 5,
        description: "client key of a response id",
        sql: include_str!("../../migrations/sqlite/0005_response_key.sql"),
    },
    Migration {
        version: 6,
        description: "tools a summary has seen",
        sql: include_str!("../../migrations/sqlite/0006_summary_tools_seen.sql"),
    },
    Migration {
        version: 7,
        description: "system messages a request sent in place of the stored ones",
        sql: include_str!("../../migrations/sqlite/0007_request_system.sql"),
    },
    Migration {
        version: 8,
        description: "claims on a session's next turn",
        sql: include_str!("../../migrations/sqlite/0008_session_lease_claim.sql"),
    },
    Migration {
        version: 9,
        description: "Responses reply items by their id",
        sql: include_str!("../../migrations/sqlite/0009_reply_items.sql"),
    },
];

/// `migrations/postgres/`, in order.
pub(crate) const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        description: "conversation store",
        sql: include_str!("../../migrations/postgres/0001_conversation_store.sql"),
    },
    Migration {
        version: 2,
        description: "prefix index on replied rows only",
        sql: include_str!("../../migrations/postgres/0002_prefix_index_replies_only.sql"),
    },
    Migration {
        version: 3,
        description: "usage in request records",
        sql: include_str!("../../migrations/postgres/0003_request_usage.sql"),
    },
    Migration {
        version: 4,
        description: "upstream root of a response id",
        sql: include_str!("../../migrations/postgres/0004_response_upstream_root.sql"),
    },
    Migration {
        version: 5,
        description: "client key of a response id",
        sql: include_str!("../../migrations/postgres/0005_response_key.sql"),
    },
    Migration {
        version: 6,
        description: "tools a summary has seen",
        sql: include_str!("../../migrations/postgres/0006_summary_tools_seen.sql"),
    },
    Migration {
        version: 7,
        description: "system messages a request sent in place of the stored ones",
        sql: include_str!("../../migrations/postgres/0007_request_system.sql"),
    },
    Migration {
        version: 8,
        description: "claims on a session's next turn",
        sql: include_str!("../../migrations/postgres/0008_session_lease_claim.sql"),
    },
    Migration {
        version: 9,
        description: "Responses reply items by their id",
        sql: include_str!("../../migrations/postgres/0009_reply_items.sql"),
    },
];

/// Version 0 is not a migration but the row runners lock to exclude each other.
pub(crate) const LOCK_ROW: i64 = 0;

/// Refuses a database that a newer ctxproxy migrated: this binary does not know what those
/// migrations added, and serving on would ignore it (an older binary dropped the upstream root
/// of a Responses chain, which then went upstream without it). `applied`: the versions in the
/// database; `known`: this binary's migrations.
pub(crate) fn refuse_newer(applied: &[i64], known: &[Migration]) -> crate::Result<()> {
    let ours = known.iter().map(|m| m.version).max().unwrap_or(0);
    match applied.iter().copied().filter(|&v| v > ours).max() {
        Some(newest) => Err(crate::Error::StoreUnavailable(format!(
            "the database has migration {newest}, newer than this ctxproxy knows (up to \
             {ours}): it was migrated by a newer version; run that version, or restore a \
             backup taken before the upgrade"
        ))),
        None => Ok(()),
    }
}

/// Checks an applied migration against the embedded one.
pub(crate) fn verify(m: &Migration, applied_checksum: &str) -> crate::Result<()> {
    if m.checksum() == applied_checksum {
        Ok(())
    } else {
        Err(crate::Error::StoreUnavailable(format!(
            "migration {} ({}) was changed after it was applied",
            m.version, m.description
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_migrated_by_a_newer_version_is_refused() {
        let ours = SQLITE.iter().map(|m| m.version).max().unwrap();
        assert!(refuse_newer(&[1, 2, ours], SQLITE).is_ok());
        assert!(refuse_newer(&[], POSTGRES).is_ok());
        let err = refuse_newer(&[1, ours + 1], SQLITE)
            .unwrap_err()
            .to_string();
        assert!(err.contains("newer"), "{err}");
    }
}
