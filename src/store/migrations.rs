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
];

/// Version 0 is not a migration but the row runners lock to exclude each other.
pub(crate) const LOCK_ROW: i64 = 0;

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
