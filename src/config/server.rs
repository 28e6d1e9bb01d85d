//! The server file (`config/ctxproxy.yaml`): listen address, limits, database, admin token,
//! where tenants live, the default policy and the model table.

use std::path::PathBuf;

use serde::Deserialize;

use super::yaml::empty_as_default;
use crate::context::Policy;
use crate::tokens::ModelOverrides;

/// The whole server file. Every section has defaults so an empty file is valid, and `default()`
/// is what an empty file reads as.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    #[serde(default, deserialize_with = "empty_as_default")]
    pub server: ServerSection,
    #[serde(default, deserialize_with = "empty_as_default")]
    pub database: DatabaseSection,
    #[serde(default, deserialize_with = "empty_as_default")]
    pub admin: AdminSection,
    #[serde(default = "default_tenants_dir")]
    pub tenants_dir: PathBuf,
    /// A policy merged under every tenant's own.
    #[serde(default, deserialize_with = "empty_as_default")]
    pub defaults: Policy,
    /// Glob on the request's model → the facts the pipeline needs; first match wins, then the
    /// built-in table.
    #[serde(default, deserialize_with = "empty_as_default")]
    pub models: ModelOverrides,
}

impl Default for ServerFile {
    fn default() -> Self {
        ServerFile {
            server: ServerSection::default(),
            database: DatabaseSection::default(),
            admin: AdminSection::default(),
            tenants_dir: default_tenants_dir(),
            defaults: Policy::default(),
            models: ModelOverrides::default(),
        }
    }
}

/// `server:` — the HTTP side.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    #[serde(default = "default_shutdown_grace_s")]
    pub shutdown_grace_s: u64,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            listen: default_listen(),
            max_body_bytes: default_max_body_bytes(),
            shutdown_grace_s: default_shutdown_grace_s(),
        }
    }
}

/// `database:` — where conversations are stored.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSection {
    #[serde(default = "default_database_url")]
    pub url: String,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
}

impl Default for DatabaseSection {
    fn default() -> Self {
        DatabaseSection {
            url: default_database_url(),
            max_connections: default_max_connections(),
        }
    }
}

/// `admin:` — the admin API is disabled while the named variable is unset.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    #[serde(default = "default_admin_token_env")]
    pub token_env: String,
}

impl Default for AdminSection {
    fn default() -> Self {
        AdminSection {
            token_env: default_admin_token_env(),
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_max_body_bytes() -> usize {
    32 * 1024 * 1024
}
fn default_shutdown_grace_s() -> u64 {
    30
}
fn default_database_url() -> String {
    "sqlite://data/ctxproxy.db".into()
}
fn default_max_connections() -> u32 {
    16
}
fn default_admin_token_env() -> String {
    "CTXPROXY_ADMIN_TOKEN".into()
}
fn default_tenants_dir() -> PathBuf {
    PathBuf::from("config/tenants")
}
