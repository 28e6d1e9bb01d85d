//! Configuration: the server file, the tenant files and the model table, loaded into one
//! immutable [`Config`] snapshot. The running proxy holds it in an `ArcSwap`; a request takes one
//! snapshot at its start and finishes on it even if a reload swaps in another.

pub mod server;
pub mod tenant;
mod validate;
pub mod watch;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::context::Policy;
use crate::tokens::{ModelFacts, ModelTable};
pub use server::ServerFile;
pub use tenant::{HistoryMode, Keys, TenantFile};

/// The environment variables that override the server file (SPEC section 2).
pub mod env {
    pub const CONFIG: &str = "CTXPROXY_CONFIG";
    pub const LISTEN: &str = "CTXPROXY_LISTEN";
    pub const DATABASE_URL: &str = "CTXPROXY_DATABASE_URL";
    pub const UPSTREAM_URL: &str = "CTXPROXY_UPSTREAM_URL";
    pub const LOG: &str = "CTXPROXY_LOG";
    pub const LOG_FORMAT: &str = "CTXPROXY_LOG_FORMAT";
}

/// The default location of the server file.
pub const DEFAULT_CONFIG_PATH: &str = "config/ctxproxy.yaml";

/// One problem found while loading: the file it is in and what is wrong, with its key path.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub file: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

/// A tenant ready to serve: its file, its policy merged over the defaults, its resolved upstream.
#[derive(Debug)]
pub struct Tenant {
    /// The file stem; used as a metric label and in the store.
    pub name: String,
    pub file: TenantFile,
    /// `policy` merged over the server's `defaults`.
    pub policy: Policy,
    /// The upstream base URL, without a trailing slash.
    pub upstream_base: String,
    /// With listed keys: the key sent upstream in place of the client's.
    pub upstream_key: Option<String>,
}

impl Tenant {
    /// True when the client's own Authorization is forwarded (`keys: any`).
    pub fn forwards_client_key(&self) -> bool {
        self.file.keys == Keys::Any
    }
}

/// The tenant a request's key selected, and the role bound to that key, if any.
#[derive(Debug, Clone)]
pub struct Selected {
    pub tenant: Arc<Tenant>,
    pub key_role: Option<String>,
}

/// A loaded, validated configuration.
#[derive(Debug)]
pub struct Config {
    /// Where the server file was read from.
    pub path: PathBuf,
    /// The server file with environment overrides applied.
    pub server: ServerFile,
    pub tenants: Vec<Arc<Tenant>>,
    /// The admin token, read from the variable named by `admin.token_env`.
    pub admin_token: Option<String>,
    /// The `models:` entries over the built-in model table.
    pub models: Models,
    by_key: HashMap<[u8; 32], (usize, Option<String>)>,
    any_tenant: Option<usize>,
}

/// The model table in force (a newtype so `Config` stays `Debug`).
pub struct Models(pub ModelTable);

impl fmt::Debug for Models {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Models(..)")
    }
}

impl Models {
    /// Context window and encoding for a request's model.
    pub fn lookup(&self, model: &str) -> ModelFacts {
        self.0.lookup(model)
    }
}

/// The result of a successful load: the configuration and warnings that did not stop it.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<Problem>,
    /// On a reload ([`Config::reload_over`]), the problems of tenant files whose last good
    /// version stays in force (or which, new, are left out) until they are fixed.
    pub held_back: Vec<Problem>,
}

/// A failed load: every problem found in every file, and the warnings found beside them.
#[derive(Debug)]
pub struct LoadError {
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

impl Config {
    /// The database of the server file at `path` (with `CTXPROXY_DATABASE_URL`), for `migrate`,
    /// which needs nothing else: a broken tenant file must not stop a separate migration step.
    pub fn load_database(path: &Path) -> Result<server::DatabaseSection, LoadError> {
        let mut problems = Vec::new();
        let file_label = path.display().to_string();
        let mut server: ServerFile =
            read_yaml(path, &file_label, &mut problems).unwrap_or_default();
        apply_env_overrides(&mut server);
        if let Err(e) = crate::store::check_url(&server.database.url) {
            problems.push(Problem {
                file: file_label,
                message: format!("database.url: {e}"),
            });
        }
        if problems.is_empty() {
            Ok(server.database)
        } else {
            Err(LoadError {
                problems,
                warnings: Vec::new(),
            })
        }
    }

    /// Loads the server file at `path` and every tenant file; every problem is reported. A
    /// server file with problems does not stop the tenant files being checked: they are read
    /// from its `tenants_dir` if that much of it could be read, else from the default one.
    pub fn load(path: &Path) -> Result<Loaded, LoadError> {
        Self::load_over(path, None)
    }

    /// A reload: [`Config::load`], except that a tenant file with problems of its own leaves
    /// that tenant's last good version (from `last_good`) in force, or, a new file, leaves it
    /// out, instead of failing the whole load: a typo in one tenant's file must not hold back
    /// another's change, such as a revoked key. Its problems are in [`Loaded::held_back`].
    /// Problems of the server file, or between tenants (a shared key), still fail it.
    pub fn reload_over(path: &Path, last_good: &Config) -> Result<Loaded, LoadError> {
        Self::load_over(path, Some(last_good))
    }

    fn load_over(path: &Path, last_good: Option<&Config>) -> Result<Loaded, LoadError> {
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let file_label = path.display().to_string();
        let mut server: ServerFile =
            read_yaml(path, &file_label, &mut problems).unwrap_or_default();
        // A server file with problems may have meant another tenants directory than the
        // default; then a default one that is not there is no problem of its own.
        let guessed_dir =
            !problems.is_empty() && server.tenants_dir == ServerFile::default().tenants_dir;
        let url_from_env = apply_env_overrides(&mut server);
        if let Err(e) = crate::store::check_url(&server.database.url) {
            let from = if url_from_env {
                format!(" (from {})", env::DATABASE_URL)
            } else {
                String::new()
            };
            problems.push(Problem {
                file: file_label.clone(),
                message: format!("database.url{from}: {e}"),
            });
        }
        if let Err(e) = server.server.listen.parse::<std::net::SocketAddr>() {
            let from = if std::env::var(env::LISTEN).is_ok_and(|v| !v.is_empty()) {
                format!(" (from {})", env::LISTEN)
            } else {
                String::new()
            };
            problems.push(Problem {
                file: file_label.clone(),
                message: format!(
                    "server.listen{from}: expected an address such as 127.0.0.1:8080 ({e})"
                ),
            });
        }
        for (pattern, _) in &server.models.0 {
            if let Err(e) = globset::Glob::new(pattern) {
                problems.push(Problem {
                    file: file_label.clone(),
                    message: format!("models.{pattern}: invalid glob: {e}"),
                });
            }
        }
        for message in validate::server_problems(&server) {
            problems.push(Problem {
                file: file_label.clone(),
                message,
            });
        }
        let read: Vec<String> = problems.iter().map(|p| p.message.clone()).collect();
        for message in validate::policy_problems(&server.defaults, "defaults", &read) {
            problems.push(Problem {
                file: file_label.clone(),
                message,
            });
        }
        for message in validate::policy_warnings(&server.defaults, "defaults") {
            warnings.push(Problem {
                file: file_label.clone(),
                message,
            });
        }
        let models = ModelTable::new(&server.models).unwrap_or_else(|_| ModelTable::built_in());

        // The watcher watches the folder the process started with: a reload reads the tenants
        // from there too, or a file removed from a new folder would stay served unseen.
        if let Some(last) = last_good
            && last.server.tenants_dir != server.tenants_dir
        {
            warnings.push(Problem {
                file: file_label.clone(),
                message: format!(
                    "tenants_dir: changed to {}; it takes effect after a restart (tenants are still read from {})",
                    server.tenants_dir.display(),
                    last.server.tenants_dir.display()
                ),
            });
            server.tenants_dir = last.server.tenants_dir.clone();
        }
        let tenants_dir = server.tenants_dir.clone();
        let dir_label = tenants_dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| tenants_dir.display().to_string());
        let listed = std::fs::read_dir(&tenants_dir);
        let dir_read = listed.is_ok();
        let mut files = match listed {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_tenant_file(p))
                .collect::<Vec<_>>(),
            Err(_) if guessed_dir => Vec::new(),
            Err(e) => {
                problems.push(Problem {
                    file: tenants_dir.display().to_string(),
                    message: format!("cannot read tenants_dir: {e}"),
                });
                Vec::new()
            }
        };
        files.sort();
        // Loads, but serves nothing: every request would be a 401.
        if files.is_empty() && dir_read {
            warnings.push(Problem {
                file: tenants_dir.display().to_string(),
                message: "no tenant files (*.yaml): every request will be refused with 401"
                    .to_string(),
            });
        }

        let upstream_override = std::env::var(env::UPSTREAM_URL)
            .ok()
            .filter(|s| !s.is_empty());
        let mut tenants = Vec::new();
        let mut held_back = Vec::new();
        // The stem is the tenant's name: `acme.yaml` and `acme.yml` would be two tenants sharing
        // one name, and so one set of sessions.
        let mut stems: HashMap<String, String> = HashMap::new();
        for file in files {
            let name = file
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            let label = format!(
                "{dir_label}/{}",
                file.file_name().unwrap_or_default().to_string_lossy()
            );
            if let Some(first) = stems.get(&name) {
                problems.push(Problem {
                    file: label.clone(),
                    message: format!(
                        "the tenant `{name}` is already defined by {first}; a tenant is named by its file name without the extension"
                    ),
                });
                continue;
            }
            stems.insert(name.clone(), label.clone());
            // A file with problems still goes on to the checks below with what of it could be
            // read, so its other problems and warnings are reported in the same run.
            let before = problems.len();
            if let Some((tf, emptied)) =
                read_yaml_emptying::<TenantFile>(&file, &label, &mut problems)
            {
                let read: Vec<String> = problems[before..]
                    .iter()
                    .map(|p| p.message.clone())
                    .collect();
                let (tenant, mut found, mut warns) = build_tenant(
                    name.clone(),
                    tf,
                    &server,
                    upstream_override.as_deref(),
                    &label,
                    &read,
                );
                // A list emptied in the reading is not the file's: what the checks say of it
                // (an empty `keys`, its entries) is not true of the file.
                for list in &emptied {
                    found.retain(|p| !speaks_of(&p.message, list));
                    warns.retain(|p| !speaks_of(&p.message, list));
                }
                problems.append(&mut found);
                warnings.append(&mut warns);
                tenants.push((label.clone(), Arc::new(tenant)));
            }
            if let Some(good) = last_good
                && problems.len() > before
            {
                held_back.extend(problems.drain(before..));
                if tenants.last().is_some_and(|(l, _)| *l == label) {
                    tenants.pop();
                }
                if let Some(kept) = good.tenant(&name) {
                    tenants.push((label, kept.clone()));
                }
            }
        }

        let mut by_key: HashMap<[u8; 32], (usize, Option<String>)> = HashMap::new();
        let mut any_tenant: Option<(usize, String)> = None;
        for (idx, (label, tenant)) in tenants.iter().enumerate() {
            match &tenant.file.keys {
                Keys::Any => {
                    if let Some((_, other)) = &any_tenant {
                        problems.push(Problem {
                            file: label.clone(),
                            message: format!(
                                "keys: `any` is already claimed by {other}; at most one tenant may accept any key"
                            ),
                        });
                    } else {
                        any_tenant = Some((idx, label.clone()));
                    }
                }
                Keys::Listed(list) => {
                    for (i, entry) in list.iter().enumerate() {
                        let Some(hash) = parse_sha256(&entry.sha256) else {
                            problems.push(Problem {
                                file: label.clone(),
                                message: format!(
                                    "keys[{i}].sha256: expected 64 hex characters (the sha256 of the key)"
                                ),
                            });
                            continue;
                        };
                        if let Some((other, _)) = by_key.get(&hash) {
                            let message = if *other == idx {
                                format!("keys[{i}].sha256: the same key is listed twice")
                            } else {
                                let other_label = &tenants[*other].0;
                                format!(
                                    "keys[{i}].sha256: the same key is listed by {other_label}; two tenants may not share a key"
                                )
                            };
                            problems.push(Problem {
                                file: label.clone(),
                                message,
                            });
                            continue;
                        }
                        by_key.insert(hash, (idx, entry.role.clone()));
                    }
                }
            }
        }

        if !problems.is_empty() {
            // Nothing is reloaded then: the held-back files' problems are reported with the rest.
            problems.append(&mut held_back);
            return Err(LoadError { problems, warnings });
        }
        let admin_token = std::env::var(&server.admin.token_env)
            .ok()
            .filter(|t| !t.is_empty());
        Ok(Loaded {
            config: Config {
                path: path.to_path_buf(),
                server,
                tenants: tenants.into_iter().map(|(_, t)| t).collect(),
                admin_token,
                models: Models(models),
                by_key,
                any_tenant: any_tenant.map(|(i, _)| i),
            },
            warnings,
            held_back,
        })
    }

    /// The `keys: any` tenant, which takes a request no listed key selects.
    pub fn keys_any_tenant(&self) -> Option<Selected> {
        self.any_tenant.map(|idx| Selected {
            tenant: self.tenants[idx].clone(),
            key_role: None,
        })
    }

    /// The tenant that lists `key` among its keys, with the key's role.
    pub fn listed_tenant(&self, key: &str) -> Option<Selected> {
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_key.get(&hash).map(|(idx, role)| Selected {
            tenant: self.tenants[*idx].clone(),
            key_role: role.clone(),
        })
    }

    /// A tenant by name (admin routes).
    pub fn tenant(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.tenants.iter().find(|t| t.name == name)
    }
}

/// Reads one YAML file, adding each of its problems to `problems` under `label`. The value is
/// what could be read (bad entries at their defaults) even when there were problems; `None`
/// when the file could not be read or parsed at all.
fn read_yaml<T: serde::de::DeserializeOwned>(
    file: &Path,
    label: &str,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    match read_yaml_emptying(file, label, problems) {
        Some((value, emptied)) if emptied.is_empty() => Some(value),
        _ => None,
    }
}

/// [`read_yaml`], except that a list which lost a bad entry is emptied in the value rather than
/// the value given up (`yaml::parse_all_emptying`): the rest of the file is still checked. The
/// key paths of the emptied lists come with it; checks must not speak of them.
fn read_yaml_emptying<T: serde::de::DeserializeOwned>(
    file: &Path,
    label: &str,
    problems: &mut Vec<Problem>,
) -> Option<(T, Vec<String>)> {
    let problem = |message: String| Problem {
        file: label.to_string(),
        message,
    };
    match std::fs::read_to_string(file) {
        Ok(text) => {
            let parsed = yaml::parse_all_emptying(&text);
            problems.extend(parsed.problems.into_iter().map(problem));
            parsed.value.map(|value| (value, parsed.emptied))
        }
        Err(e) => {
            problems.push(problem(format!("cannot read: {e}")));
            None
        }
    }
}

/// Whether `message` (a problem or warning, `path: detail`) is about the list at `path`.
fn speaks_of(message: &str, path: &str) -> bool {
    message
        .strip_prefix(path)
        .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('[') || rest.starts_with('.'))
}

/// Applies the environment's overrides; true when the database URL came from it.
fn apply_env_overrides(server: &mut ServerFile) -> bool {
    if let Ok(v) = std::env::var(env::LISTEN)
        && !v.is_empty()
    {
        server.server.listen = v;
    }
    if let Ok(v) = std::env::var(env::DATABASE_URL)
        && !v.is_empty()
    {
        server.database.url = v;
        return true;
    }
    false
}

fn build_tenant(
    name: String,
    file: TenantFile,
    server: &ServerFile,
    upstream_override: Option<&str>,
    label: &str,
    read_problems: &[String],
) -> (Tenant, Vec<Problem>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let problem = |message: String| Problem {
        file: label.to_string(),
        message,
    };
    if matches!(&file.keys, Keys::Listed(keys) if keys.is_empty()) {
        warnings.push(problem(
            "keys: the list is empty, so no request can select this tenant".to_string(),
        ));
    }
    // A header no request can carry would never match: every request a new session.
    if axum::http::HeaderName::from_bytes(file.session.header.as_bytes()).is_err() {
        problems.push(problem(format!(
            "session.header: `{}` is not a valid HTTP header name",
            file.session.header
        )));
    }
    // A credential as a session id would be stored, listed by the admin API and echoed in
    // `x-ctxproxy-session`: secrets never appear there (SPEC 8).
    if validate::is_credential_header(&file.session.header) {
        problems.push(problem(format!(
            "session.header: `{}` carries credentials; a session id is stored, listed and echoed back",
            file.session.header
        )));
    }
    let base = upstream_override.unwrap_or(&file.upstream.base_url);
    let web = base.starts_with("http://") || base.starts_with("https://");
    // What the HTTP client will refuse on every request (an unclosed IPv6 bracket, a bad
    // port) or quietly turn into another path (a space) is refused here instead.
    let unusable = web
        && (reqwest::Url::parse(base).is_err()
            || base.chars().any(char::is_whitespace)
            // A fragment never goes to a server: every path would be cut at it.
            || base.contains('#'));
    if !web || unusable {
        problems.push(problem(format!(
            "upstream.base_url{}: expected an http:// or https:// URL, found `{}`",
            if upstream_override.is_some() {
                format!(" (from {})", env::UPSTREAM_URL)
            } else {
                String::new()
            },
            printable_url(base)
        )));
    }
    // `api_key_env` is optional with listed keys (SPEC 2 does not require it): without it no
    // Authorization goes upstream, which suits a local model server that needs none. A variable
    // that is named but unset is most likely a deployment mistake, so it is a warning, not a
    // problem: check-config runs where the secret often is not, and the tenant still loads.
    if matches!(file.keys, Keys::Any) && file.upstream.api_key_env.is_some() {
        warnings.push(problem(
            "upstream.api_key_env: not used with `keys: any`, which forwards the client's own Authorization (SPEC 2)".to_string(),
        ));
    }
    let upstream_key = file.upstream.api_key_env.as_ref().and_then(|var| {
        // Secrets mounted from files usually end in a newline, which no header may carry.
        let value = std::env::var(var)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        if value.is_none() && matches!(file.keys, Keys::Listed(_)) {
            warnings.push(problem(format!(
                "upstream.api_key_env: the variable {var} is not set; requests will reach the upstream without a key"
            )));
        }
        // Never quoted: the message must not carry any part of the secret.
        if value
            .as_ref()
            .is_some_and(|v| axum::http::HeaderValue::from_str(&format!("Bearer {v}")).is_err())
        {
            problems.push(problem(format!(
                "upstream.api_key_env: the value of {var} cannot be sent in an HTTP header (it holds a control or non-ASCII character)"
            )));
        }
        value
    });
    // A role missing from `tools.roles` does not stop the tenant: SPEC 6 says an unknown role
    // is 403, so requests acting as it are refused at request time (access::resolve_role). It
    // is almost always a typo, hence the warnings.
    let roles = &file.tools.roles;
    // Roles that could not be read (that problem is reported) are not known to be missing.
    let roles_unread = read_problems
        .iter()
        .any(|p| p.starts_with("tools.roles") || p.starts_with("tools:"));
    let outcome = if roles.is_empty() {
        "the tenant defines no tools.roles, so tool access is off"
    } else {
        "requests acting as it get 403"
    };
    if let Some(default_role) = &file.tools.default_role
        && !roles.contains_key(default_role)
        && !roles_unread
    {
        warnings.push(problem(format!(
            "tools.default_role: `{default_role}` is not one of tools.roles; {outcome}"
        )));
    }
    if let Keys::Listed(keys) = &file.keys
        && !roles_unread
    {
        for (i, k) in keys.iter().enumerate() {
            if let Some(role) = &k.role
                && !roles.contains_key(role)
            {
                warnings.push(problem(format!(
                    "keys[{i}].role: `{role}` is not one of tools.roles; {outcome}"
                )));
            }
        }
    }
    if !roles_unread {
        warnings.extend(validate::roleless_keys_warning(&file).map(problem));
    }
    for (role, globs) in roles {
        for g in globs {
            if let Err(e) = globset::Glob::new(g) {
                problems.push(problem(format!(
                    "tools.roles.{role}: invalid glob `{g}`: {e}"
                )));
            }
        }
    }
    problems.extend(
        validate::upstream_problems(&file.upstream)
            .into_iter()
            .map(problem),
    );
    problems.extend(
        validate::policy_problems(&file.policy, "policy", read_problems)
            .into_iter()
            .map(problem),
    );
    warnings.extend(
        validate::policy_warnings(&file.policy, "policy")
            .into_iter()
            .map(problem),
    );
    let policy = file.policy.merged_over(&server.defaults);
    let tenant = Tenant {
        name,
        upstream_base: base.trim_end_matches('/').to_string(),
        upstream_key,
        policy,
        file,
    };
    (tenant, problems, warnings)
}

fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s.trim().to_ascii_lowercase(), &mut out).ok()?;
    Some(out)
}

/// Whether `path` in the tenants folder is a tenant file: `*.yaml` (or `*.yml`), but not a
/// hidden one (an editor's `.acme.yaml`, macOS's `._acme.yaml`), which would otherwise become a
/// live tenant, or stop the whole configuration loading by clashing with a real one.
pub(crate) fn is_tenant_file(path: &std::path::Path) -> bool {
    let hidden = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'));
    !hidden && path.extension().is_some_and(|x| x == "yaml" || x == "yml")
}

/// A URL as it may be printed: credentials in it (`user:pass@`) and the values of its query
/// (`?api-key=…`, `?password=…`) are masked, the names kept. Secrets never appear in logs or
/// errors (SPEC 8), not even in a URL the proxy refuses.
pub fn printable_url(url: &str) -> String {
    let url = without_credentials(url);
    // A fragment may hold a token as well: it goes whole.
    let (url, fragment) = match url.split_once('#') {
        Some((url, _)) => (url, "#***"),
        None => (url.as_str(), ""),
    };
    let Some((base, query)) = url.split_once('?') else {
        return format!("{url}{fragment}");
    };
    let masked: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) => format!("{name}=***"),
            // A bare item may be a token in itself.
            None if pair.is_empty() => String::new(),
            None => "***".to_string(),
        })
        .collect();
    format!("{base}?{}{fragment}", masked.join("&"))
}

/// `url` with its credentials (`user:pass@`) masked.
fn without_credentials(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some(parts) => parts,
        None => ("", url),
    };
    // Up to the last `@` anywhere: a password may hold an unescaped `/`, `?` or `#` (the URL is
    // malformed then, which is why it is printed at all), and masking a little too much is safe.
    match rest.rfind('@') {
        Some(at) => {
            let sep = if scheme.is_empty() { "" } else { "://" };
            format!("{scheme}{sep}***@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{printable_url, without_credentials};

    #[test]
    fn urls_are_printed_without_credentials() {
        assert_eq!(
            without_credentials("ftp://user:secret@host/v1"),
            "ftp://***@host/v1"
        );
        assert_eq!(
            without_credentials("http://user:s3cr/et@h/v1"),
            "http://***@h/v1"
        );
        assert_eq!(without_credentials("http://u:p#ss@h/v1"), "http://***@h/v1");
        assert_eq!(without_credentials("http://host/v1"), "http://host/v1");
        assert_eq!(without_credentials("user:secret@host"), "***@host");
        assert_eq!(without_credentials("not a url"), "not a url");
    }

    /// The audit's case: a key in the query of `upstream.base_url` is not printed either.
    #[test]
    fn urls_are_printed_without_query_values() {
        assert_eq!(
            printable_url("ftp://bob:PASSW0RD@host/v1?api-key=QUERYSECRET&v=1#frag"),
            "ftp://***@host/v1?api-key=***&v=***#***"
        );
        assert_eq!(printable_url("https://h/v1#SECFRAG"), "https://h/v1#***");
        assert_eq!(
            printable_url("postgres://h/db?user=u&password=p"),
            "postgres://h/db?user=***&password=***"
        );
        assert_eq!(printable_url("sqlite://data/x.db"), "sqlite://data/x.db");
        assert_eq!(printable_url("http://h/v1?SECNOEQ"), "http://h/v1?***");
    }
}
