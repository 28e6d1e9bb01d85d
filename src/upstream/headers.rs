//! Which headers cross the proxy. Hop-by-hop headers never do (the fixed list, and whatever a
//! `Connection` header names, RFC 9110 7.6.1); the proxy's own `x-ctxproxy-*` headers stop here;
//! `Authorization` is swapped for keyed tenants.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// The headers a message's `Connection` header names: hop-by-hop for this message only.
pub fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect()
}

/// How the client's Authorization is treated upstream.
#[derive(Debug, Clone)]
pub enum UpstreamAuth {
    /// `keys: any`: forward the client's header unchanged.
    Forward,
    /// Listed keys: send this key instead (or none, when the variable is unset).
    Replace(Option<String>),
}

impl UpstreamAuth {
    /// How `tenant` authenticates upstream: `keys: any` forwards the client's key, listed keys
    /// send the tenant's own.
    pub fn of(tenant: &crate::config::Tenant) -> UpstreamAuth {
        if tenant.forwards_client_key() {
            UpstreamAuth::Forward
        } else {
            UpstreamAuth::Replace(tenant.upstream_key.clone())
        }
    }
}

/// The headers to send upstream for a client request. `keep_length` keeps `Content-Length`
/// (pass-through of an unchanged body); managed routes send a new body and drop it, and ask for
/// an uncompressed reply ([`PLAIN_REPLY`]) whatever the client accepts, for the store.
pub fn to_upstream(client: &HeaderMap, auth: &UpstreamAuth, managed: bool) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(client.len());
    let listed = connection_listed(client);
    let replaced = matches!(auth, UpstreamAuth::Replace(_));
    // Only a keyed tenant's client keys are kept from going on (`keys: any` forwards them).
    let client_keys: Vec<&[u8]> = if replaced {
        client_credentials(client).map(str::as_bytes).collect()
    } else {
        Vec::new()
    };
    for (name, value) in client {
        if is_hop_by_hop(name)
            || listed.contains(name)
            || name == header::HOST
            // The proxy answered `Expect: 100-continue` itself when it read the body.
            || name == header::EXPECT
            || name.as_str().starts_with("x-ctxproxy-")
            || name == header::AUTHORIZATION
        {
            continue;
        }
        // A managed body is the proxy's own plain JSON: the client's length and encoding were
        // of another body.
        if managed
            && (name == header::CONTENT_LENGTH
                || name == header::ACCEPT_ENCODING
                || name == header::CONTENT_ENCODING)
        {
            continue;
        }
        // With the tenant's own key upstream, the organisation and project are the key's: a
        // client must not pick another one the operator's key happens to belong to.
        if replaced && is_account_header(name) {
            continue;
        }
        // Nor does the client's key go on (SPEC 2) under another name: the key headers of
        // other APIs (Azure's `api-key`, `x-api-key`), or any header that carries it, in its
        // name or its value. A browser's WebSocket subprotocols lose only the one carrying it.
        if replaced && KEY_HEADERS.contains(&name.as_str()) {
            continue;
        }
        if !client_keys.is_empty() {
            if name == header::SEC_WEBSOCKET_PROTOCOL {
                if let Some(kept) = without_key_items(value, &client_keys) {
                    out.append(name.clone(), kept);
                }
                continue;
            }
            let carried = |b: &[u8]| client_keys.iter().any(|key| carries(b, key));
            if carried(name.as_str().as_bytes()) || carried(value.as_bytes()) {
                continue;
            }
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(v) = authorization(client, auth) {
        out.insert(header::AUTHORIZATION, v);
    }
    if managed {
        out.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        out.insert(header::ACCEPT_ENCODING, PLAIN_REPLY);
    }
    out
}

/// The `Accept-Encoding` of every request whose answer the proxy reads (managed routes, the
/// summariser): without the header a server may compress as it likes, and a compressed reply
/// could not be stored.
pub const PLAIN_REPLY: HeaderValue = HeaderValue::from_static("identity");

/// The `Authorization` a request goes upstream with: the client's when its key is forwarded,
/// else the tenant's key.
fn authorization(client: &HeaderMap, auth: &UpstreamAuth) -> Option<HeaderValue> {
    match auth {
        UpstreamAuth::Forward => client.get(header::AUTHORIZATION).cloned(),
        UpstreamAuth::Replace(Some(key)) => HeaderValue::from_str(&format!("Bearer {key}")).ok(),
        UpstreamAuth::Replace(None) => None,
    }
}

/// The credential headers alone, as [`to_upstream`] sends them, for a call the proxy makes on
/// the client's behalf (the summariser): the `Authorization`, and when the client's key is
/// forwarded its other key headers (Azure's `api-key`, `x-api-key`). Marked sensitive.
pub fn credentials(client: &HeaderMap, auth: &UpstreamAuth) -> HeaderMap {
    let mut out = HeaderMap::new();
    if let Some(v) = authorization(client, auth) {
        out.insert(header::AUTHORIZATION, v);
    }
    if matches!(auth, UpstreamAuth::Forward) {
        for name in KEY_HEADERS {
            if let Some(v) = client.get(name) {
                out.insert(name, v.clone());
            }
        }
    }
    for value in out.values_mut() {
        value.set_sensitive(true);
    }
    out
}

/// Whether a response's `Content-Length` still holds for the body the client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// The body is relayed byte for byte (pass-through): the length is the client's too.
    Keep,
    /// The proxy makes the body it sends: framing is hyper's business.
    Drop,
}

/// The upstream's response headers as relayed to the client.
/// For keyed tenants the operator's account headers (`openai-organization`, `openai-project`)
/// stay with the proxy, as they do on the way up.
pub fn to_client(upstream: &HeaderMap, length: Length, auth: &UpstreamAuth) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(upstream.len());
    let listed = connection_listed(upstream);
    for (name, value) in upstream {
        if is_hop_by_hop(name)
            || listed.contains(name)
            || (name == header::CONTENT_LENGTH && length == Length::Drop)
            || (matches!(auth, UpstreamAuth::Replace(_)) && is_account_header(name))
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// The headers that name the OpenAI account a key belongs to.
fn is_account_header(name: &HeaderName) -> bool {
    matches!(name.as_str(), "openai-organization" | "openai-project")
}

/// A query component as a server reading form encoding sees it: `+` a space, `%XX` its byte.
fn form_decoded(component: &str) -> Vec<u8> {
    let spaced = component.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).collect()
}

/// Headers other APIs take a key in (Azure's `api-key`, and `x-api-key`).
pub(crate) const KEY_HEADERS: [&str; 2] = ["api-key", "x-api-key"];

/// Whether a header or query value carries the client's key: holds it, for a key long enough
/// not to turn up by chance (provider keys are dozens of characters), or is it (an odd short
/// proxy key, which `1.0` or `abc1` must not be taken for).
fn carries(value: &[u8], key: &[u8]) -> bool {
    const BY_CHANCE: usize = 8;
    if key.len() < BY_CHANCE {
        let value = value.trim_ascii();
        return value == key
            || value
                .strip_prefix(b"Bearer ")
                .is_some_and(|v| v.trim_ascii() == key);
    }
    value.windows(key.len()).any(|w| w == key)
}

/// A comma-separated header value without the items that carry `key`; `None` when none is left.
fn without_key_items(value: &HeaderValue, keys: &[&[u8]]) -> Option<HeaderValue> {
    let kept: Vec<&[u8]> = value
        .as_bytes()
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|item| !item.is_empty() && !keys.iter().any(|key| carries(item, key)))
        .collect();
    HeaderValue::from_bytes(&kept.join(&b", "[..]))
        .ok()
        .filter(|v| !v.is_empty())
}

/// The client's query as it goes upstream. A keyed tenant's client key does not go on in it
/// either (SPEC 2): a parameter named as a key (`api-key`, `api_key`) or whose name or value
/// carries the client's key (percent- and form-decoded) is left out. Otherwise the query goes
/// as it came.
pub fn query_to_upstream(
    query: Option<&str>,
    client: &HeaderMap,
    auth: &UpstreamAuth,
) -> Option<String> {
    let query = query.filter(|q| !q.is_empty())?;
    if !matches!(auth, UpstreamAuth::Replace(_)) {
        return Some(query.to_string());
    }
    let client_keys: Vec<&[u8]> = client_credentials(client).map(str::as_bytes).collect();
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (name, value) = (form_decoded(name), form_decoded(value));
            let named_as_key = matches!(
                name.to_ascii_lowercase().as_slice(),
                b"api-key" | b"api_key"
            );
            !named_as_key
                && !client_keys
                    .iter()
                    .any(|key| carries(&name, key) || carries(&value, key))
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// The credential a client presents, however it does: the bearer token, else the whole
/// `Authorization` value (another scheme), else an `api-key` (Azure) or `x-api-key` header.
/// What tells one client of a `keys: any` tenant from another. An empty one (`Bearer ` with
/// no token, an empty header) presents nothing, so it is passed over like a missing one.
pub fn client_credential(headers: &HeaderMap) -> Option<&str> {
    client_credentials(headers).next()
}

/// Every credential a client presents, in [`client_credential`]'s order: a listed proxy key may
/// come in any of them (an `api-key` beside a `Basic` Authorization), and none may go upstream
/// for a keyed tenant.
pub fn client_credentials(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let others = std::iter::once(header::AUTHORIZATION.as_str())
        .chain(KEY_HEADERS)
        .filter_map(|name| headers.get(name)?.to_str().ok())
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("bearer"))
        // The bearer token's whole `Authorization` value is not another credential.
        .filter(|c| {
            !c.split_once(' ')
                .is_some_and(|(s, _)| s.eq_ignore_ascii_case("bearer"))
        });
    bearer(headers).into_iter().chain(others)
}

/// The bearer token of an Authorization header, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn an_empty_credential_is_no_credential_however_it_is_sent() {
        for empty in [
            &[("authorization", "Bearer ")][..],
            &[("authorization", "bearer")],
            &[("authorization", "")],
            &[("api-key", " ")],
            &[("x-api-key", "")],
            &[],
        ] {
            assert_eq!(client_credential(&headers(empty)), None, "{empty:?}");
        }
        let behind_empty_bearer = headers(&[("authorization", "Bearer "), ("api-key", "k1")]);
        assert_eq!(client_credential(&behind_empty_bearer), Some("k1"));
        let other_scheme = headers(&[("authorization", "Basic dXNlcg==")]);
        assert_eq!(client_credential(&other_scheme), Some("Basic dXNlcg=="));
        let bearer_first = headers(&[("authorization", "Bearer sk-1"), ("api-key", "k1")]);
        assert_eq!(client_credential(&bearer_first), Some("sk-1"));
    }

    #[test]
    fn headers_a_connection_header_names_do_not_cross_either_way() {
        let msg = headers(&[
            ("connection", "X-Drop-Me, keep-alive"),
            ("connection", "x-also"),
            ("x-drop-me", "1"),
            ("x-also", "2"),
            ("x-kept", "3"),
        ]);
        let up = to_upstream(&msg, &UpstreamAuth::Forward, false);
        let down = to_client(&msg, Length::Drop, &UpstreamAuth::Forward);
        for out in [up, down] {
            assert!(out.get("x-drop-me").is_none());
            assert!(out.get("x-also").is_none());
            assert!(out.get("connection").is_none());
            assert_eq!(out["x-kept"], "3");
        }
    }

    #[test]
    fn a_relayed_body_keeps_its_length_and_expect_stays_here() {
        let msg = headers(&[("content-length", "5000"), ("expect", "100-continue")]);
        assert_eq!(
            to_client(&msg, Length::Keep, &UpstreamAuth::Forward)["content-length"],
            "5000"
        );
        assert!(
            to_client(&msg, Length::Drop, &UpstreamAuth::Forward)
                .get("content-length")
                .is_none()
        );
        let up = to_upstream(&msg, &UpstreamAuth::Forward, false);
        assert!(up.get("expect").is_none());
        assert_eq!(up["content-length"], "5000");
    }

    #[test]
    fn a_keyed_tenant_s_client_cannot_pick_the_organisation_or_project() {
        let msg = headers(&[
            ("openai-organization", "org-other"),
            ("openai-project", "proj-other"),
            ("x-kept", "1"),
        ]);
        let keyed = to_upstream(&msg, &UpstreamAuth::Replace(Some("sk-op".into())), false);
        assert!(keyed.get("openai-organization").is_none());
        assert!(keyed.get("openai-project").is_none());
        assert_eq!(keyed["x-kept"], "1");
        let open = to_upstream(&msg, &UpstreamAuth::Forward, false);
        assert_eq!(open["openai-organization"], "org-other");
        assert_eq!(open["openai-project"], "proj-other");
    }

    /// The audit's case (SPEC 2: "the client's key is never forwarded"): a keyed tenant's
    /// client key does not go on under the key headers of other APIs, nor in any other header.
    #[test]
    fn a_keyed_tenant_s_client_key_goes_on_under_no_name() {
        let msg = headers(&[
            ("authorization", "Bearer sk-client-secret"),
            ("api-key", "sk-client-secret"),
            ("x-api-key", "anything"),
            ("x-custom-auth", "token=sk-client-secret"),
            ("x-kept", "1"),
        ]);
        let keyed = to_upstream(&msg, &UpstreamAuth::Replace(Some("sk-op".into())), false);
        assert_eq!(keyed["authorization"], "Bearer sk-op");
        for gone in ["api-key", "x-api-key", "x-custom-auth"] {
            assert!(keyed.get(gone).is_none(), "{gone}");
        }
        assert_eq!(keyed["x-kept"], "1");
        // A `keys: any` tenant forwards the client's own key: its headers go on as they came.
        let open = to_upstream(&msg, &UpstreamAuth::Forward, false);
        assert_eq!(open["api-key"], "sk-client-secret");
        assert_eq!(open["x-api-key"], "anything");

        // Nor in the query (the re-audit's case).
        let keyed = UpstreamAuth::Replace(Some("sk-op".into()));
        let query =
            Some("api-version=2024-10-21&api-key=x&token=sk-client-secret&q=%73k-client-secret");
        assert_eq!(
            query_to_upstream(query, &msg, &keyed).as_deref(),
            Some("api-version=2024-10-21")
        );
        assert_eq!(query_to_upstream(Some("api-key=x"), &msg, &keyed), None);
        // As a name, a bare item, or with form-encoded spaces around it (the final audit's).
        let query = Some("sk-client-secret&sk-client-secret=1&api-version=2");
        assert_eq!(
            query_to_upstream(query, &msg, &keyed).as_deref(),
            Some("api-version=2")
        );
        assert_eq!(
            query_to_upstream(query, &msg, &UpstreamAuth::Forward).as_deref(),
            query
        );
    }

    /// A proxy key presented as `api-key` (no Authorization) is the client's key as much as a
    /// bearer token: it goes on under no name, in no header and no query parameter.
    #[test]
    fn a_proxy_key_sent_as_api_key_goes_on_nowhere() {
        let msg = headers(&[("api-key", "sk-proxy-azure"), ("x-copy", "sk-proxy-azure")]);
        let auth = UpstreamAuth::Replace(Some("sk-op".into()));
        let out = to_upstream(&msg, &auth, true);
        assert!(out.get("api-key").is_none());
        assert!(out.get("x-copy").is_none());
        assert_eq!(out["authorization"], "Bearer sk-op");
        assert_eq!(
            query_to_upstream(Some("k=sk-proxy-azure&v=1"), &msg, &auth).as_deref(),
            Some("v=1")
        );
    }

    #[test]
    fn every_credential_presented_is_listed_bearer_first() {
        let all = |pairs: &[(&str, &str)]| {
            let h = headers(pairs);
            client_credentials(&h)
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            all(&[
                ("authorization", "Bearer sk-1"),
                ("api-key", "k1"),
                ("x-api-key", "k2")
            ]),
            ["sk-1", "k1", "k2"]
        );
        assert_eq!(
            all(&[("authorization", "Basic dXNlcg=="), ("api-key", "k1")]),
            ["Basic dXNlcg==", "k1"]
        );
        assert_eq!(
            all(&[("authorization", "Bearer "), ("x-api-key", " ")]),
            Vec::<String>::new()
        );
        // A keyed tenant forwards none of them, wherever they are carried.
        let msg = headers(&[
            ("authorization", "Basic dXNlcg=="),
            ("api-key", "k-listed"),
            ("x-echo", "k-listed"),
        ]);
        let out = to_upstream(&msg, &UpstreamAuth::Replace(Some("sk-op".into())), false);
        assert!(out.get("x-echo").is_none());
        assert!(out.get("api-key").is_none());
    }

    /// The re-audit's case: a short key is matched whole, not inside other values.
    #[test]
    fn a_short_client_key_is_not_found_inside_other_values() {
        let msg = headers(&[
            ("authorization", "Bearer 1"),
            ("user-agent", "myapp/1.0"),
            ("x-trace", "abc1def"),
            ("x-echo", "1"),
        ]);
        let keyed = to_upstream(&msg, &UpstreamAuth::Replace(Some("sk-op".into())), false);
        assert_eq!(keyed["user-agent"], "myapp/1.0");
        assert_eq!(keyed["x-trace"], "abc1def");
        assert!(keyed.get("x-echo").is_none());
        let auth = UpstreamAuth::Replace(Some("sk-op".into()));
        assert_eq!(
            query_to_upstream(Some("q=+1&r=1+&s=2"), &msg, &auth).as_deref(),
            Some("s=2")
        );
    }

    /// A keyed tenant's key in a header's name goes nowhere either; a browser's WebSocket
    /// subprotocols lose only the one that carries it (the final audit's cases).
    #[test]
    fn a_key_in_a_header_name_or_a_subprotocol_does_not_go_on() {
        let msg = headers(&[
            ("authorization", "Bearer sk-client-secret"),
            ("x-sk-client-secret", "1"),
            (
                "sec-websocket-protocol",
                "realtime, openai-insecure-api-key.sk-client-secret, openai-beta.realtime-v1",
            ),
        ]);
        let keyed = to_upstream(&msg, &UpstreamAuth::Replace(Some("sk-op".into())), false);
        assert!(keyed.get("x-sk-client-secret").is_none());
        assert_eq!(
            keyed["sec-websocket-protocol"],
            "realtime, openai-beta.realtime-v1"
        );
    }

    #[test]
    fn keyed_tenants_keep_the_account_headers_to_themselves() {
        let msg = headers(&[
            ("openai-organization", "org-operator"),
            ("x-request-id", "r"),
        ]);
        let keyed = UpstreamAuth::Replace(Some("sk-op".into()));
        let down = to_client(&msg, Length::Drop, &keyed);
        assert!(down.get("openai-organization").is_none());
        assert_eq!(down["x-request-id"], "r");
        let open = to_client(&msg, Length::Drop, &UpstreamAuth::Forward);
        assert_eq!(open["openai-organization"], "org-operator");
        let up = to_upstream(&headers(&[("content-encoding", "gzip")]), &keyed, true);
        assert!(up.get("content-encoding").is_none());
    }
}
