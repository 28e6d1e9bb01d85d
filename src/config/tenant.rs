//! A tenant file (`config/tenants/<name>.yaml`): which keys select the tenant, where its
//! upstream is, how sessions are found, its rewrite policy and its tool roles.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::yaml::empty_as_default;
use crate::context::Policy;

/// A tenant file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    pub keys: Keys,
    #[serde(default, deserialize_with = "empty_as_default")]
    pub upstream: UpstreamSection,
    #[serde(default, deserialize_with = "empty_as_default")]
    pub session: SessionSection,
    #[serde(default, deserialize_with = "empty_as_default")]
    pub policy: Policy,
    #[serde(default, deserialize_with = "empty_as_default")]
    pub tools: ToolsSection,
}

/// `keys: any` or a list of hashed proxy keys.
#[derive(Debug, Clone, PartialEq)]
pub enum Keys {
    /// Accept any Authorization and forward it upstream unchanged.
    Any,
    /// Proxy keys that select this tenant; the client's key is never forwarded.
    Listed(Vec<KeyEntry>),
}

/// A visitor rather than `#[serde(untagged)]`: an untagged enum buffers the value and, when no
/// variant fits, reports one generic error, so a misspelt key inside a list entry lost its path
/// (`keys[0].rol`). Here the list's entries are read as `KeyEntry` directly, each with its own
/// error and path.
impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeysVisitor;

        impl<'de> serde::de::Visitor<'de> for KeysVisitor {
            type Value = Keys;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`any` or a list of {sha256: <hex>, role: <name>} entries")
            }

            fn visit_str<E: serde::de::Error>(self, w: &str) -> Result<Keys, E> {
                if w == "any" {
                    Ok(Keys::Any)
                } else {
                    Err(E::custom(format!(
                        "expected `any` or a list of {{sha256, role}} entries, found `{w}`"
                    )))
                }
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Keys, A::Error> {
                let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(entry) = seq.next_element::<KeyEntry>()? {
                    list.push(entry);
                }
                Ok(Keys::Listed(list))
            }
        }

        d.deserialize_any(KeysVisitor)
    }
}

/// One proxy key, by the hex sha256 of the full key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub sha256: String,
    #[serde(default)]
    pub role: Option<String>,
}

/// `upstream:` — the provider this tenant talks to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// Overridden by `CTXPROXY_UPSTREAM_URL` when that is set.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// With listed keys: the variable holding the upstream key to send. Optional: without it
    /// (or while the variable is unset) no Authorization goes upstream, e.g. for a local model
    /// server that needs none.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default = "default_connect_timeout_s")]
    pub connect_timeout_s: u64,
    /// Whole request; for streams, the longest wait between two chunks.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
}

impl Default for UpstreamSection {
    fn default() -> Self {
        UpstreamSection {
            base_url: default_base_url(),
            api_key_env: None,
            connect_timeout_s: default_connect_timeout_s(),
            timeout_s: default_timeout_s(),
        }
    }
}

/// Where the client sends its history from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryMode {
    /// The client resends the whole history each turn.
    #[default]
    Client,
    /// The client sends only new messages; the proxy prepends the stored history.
    Server,
}

impl HistoryMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "client" => Some(HistoryMode::Client),
            "server" => Some(HistoryMode::Server),
            _ => None,
        }
    }
}

/// `session:` — how requests are tied to stored conversations.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSection {
    #[serde(default = "default_session_header")]
    pub header: String,
    #[serde(default)]
    pub history: HistoryMode,
    #[serde(default = "default_true")]
    pub auto: bool,
}

impl Default for SessionSection {
    fn default() -> Self {
        SessionSection {
            header: default_session_header(),
            history: HistoryMode::Client,
            auto: true,
        }
    }
}

/// `tools:` — tool access per role (SPEC section 6).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsSection {
    /// Role name → tool-name globs it may use.
    #[serde(default)]
    pub roles: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub default_role: Option<String>,
    #[serde(default)]
    pub role_from_header: bool,
    /// On by default: SPEC section 6 shows `scrub_history: true`, and the values its YAML
    /// blocks show are the defaults.
    #[serde(default = "default_true")]
    pub scrub_history: bool,
}

impl Default for ToolsSection {
    fn default() -> Self {
        ToolsSection {
            roles: BTreeMap::new(),
            default_role: None,
            role_from_header: false,
            scrub_history: true,
        }
    }
}

fn default_base_url() -> String {
    "https://api.openai.com/v1".into()
}
fn default_connect_timeout_s() -> u64 {
    10
}
fn default_timeout_s() -> u64 {
    600
}
fn default_session_header() -> String {
    "x-session-id".into()
}
fn default_true() -> bool {
    true
}
