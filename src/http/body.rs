//! Reading request bodies: bounded by `max_body_bytes` (413 beyond it) and parsed as JSON with
//! errors that name the offending field, so even a parse error is OpenAI-shaped.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Refuses a body whose declared `Content-Length` is over `limit` before any of it is read (and
/// before hyper answers `Expect: 100-continue`).
pub fn check_declared_length(headers: &HeaderMap, limit: usize) -> Result<()> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(Error::RequestTooLarge { limit });
    }
    Ok(())
}

/// Reads the whole body, refusing more than `limit` bytes.
pub async fn read_limited(body: Body, limit: usize) -> Result<Bytes> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(Error::RequestTooLarge { limit })
        }
        Err(e) => Err(Error::invalid(
            format!("could not read the request body: {e}"),
            None,
        )),
    }
}

/// Parses a JSON body into `T`; the error's `param` is the path of the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    // Tracking the path costs on every field; only a body that fails needs it, so it is parsed
    // again with tracking only then.
    match serde_json::from_slice(bytes) {
        Ok(value) => Ok(value),
        Err(_) => Err(parse_error::<T>(bytes)),
    }
}

/// The error of a body that did not parse as `T`, with the path of the field at fault.
#[cold]
fn parse_error<T: DeserializeOwned>(bytes: &[u8]) -> Error {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let e = match serde_path_to_error::deserialize::<_, T>(&mut *de) {
        Err(e) => e,
        // It parsed as `T` this time: what failed was the text after it.
        Ok(_) => return syntax_error(de.end().err()),
    };
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return syntax_error(Some(inner));
    }
    let message = without_type_names(&inner.to_string());
    // serde reports a missing or repeated field at its parent; name the field itself.
    let param = match named_field(&message) {
        Some(field) if path == "." => Some(field.to_string()),
        Some(field) => Some(format!("{path}.{field}")),
        None if path == "." => None,
        None => Some(path),
    };
    let message = match &param {
        Some(p) => format!("Invalid value for '{p}': {message}"),
        None => format!("Invalid request body: {message}"),
    };
    Error::invalid(message, param)
}

fn syntax_error(inner: Option<serde_json::Error>) -> Error {
    let detail = inner.map_or_else(String::new, |e| format!(": {e}"));
    Error::invalid(
        format!("We could not parse the JSON body of your request{detail}"),
        None,
    )
}

/// serde's message with the proxy's own type names (`expected struct ChatRequest`) said as the
/// JSON the client must send (`expected an object`): the names mean nothing to a client.
fn without_type_names(message: &str) -> String {
    let Some((head, tail)) = message.split_once("expected struct ") else {
        return message.to_string();
    };
    let rest = tail.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
    format!("{head}expected an object{rest}")
}

/// The field a missing-field or duplicate-field message names.
fn named_field(message: &str) -> Option<&str> {
    let rest = message
        .strip_prefix("missing field `")
        .or_else(|| message.strip_prefix("duplicate field `"))?;
    rest.split('`').next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::ChatRequest;

    fn param_of(body: &str) -> Option<String> {
        match parse_json::<ChatRequest>(body.as_bytes()) {
            Err(Error::InvalidRequest { param, .. }) => param,
            other => panic!("expected invalid request, got {other:?}"),
        }
    }

    #[test]
    fn missing_model_names_model() {
        assert_eq!(param_of(r#"{"messages":[]}"#).as_deref(), Some("model"));
    }

    #[test]
    fn wrong_type_names_the_field_path() {
        let p = param_of(r#"{"model":"m","messages":[{"role":"user","tool_calls":5}]}"#);
        assert_eq!(p.as_deref(), Some("messages[0].tool_calls"));
    }

    #[test]
    fn the_proxy_s_type_names_are_not_in_messages() {
        for (body, param) in [
            ("[1]", None),
            (r#"{"model":"m","messages":["hi"]}"#, Some("messages[0]")),
        ] {
            match parse_json::<ChatRequest>(body.as_bytes()) {
                Err(Error::InvalidRequest { message, param: p }) => {
                    assert!(message.contains("expected an object"), "{message}");
                    assert!(!message.contains("struct"), "{message}");
                    assert_eq!(p.as_deref(), param);
                }
                other => panic!("expected invalid request, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_repeated_field_is_named_where_it_is() {
        let top = r#"{"model":"a","model":"b","messages":[]}"#;
        assert_eq!(param_of(top).as_deref(), Some("model"));
        let inner = r#"{"model":"m","messages":[{"role":"user","role":"user","content":"x"}]}"#;
        assert_eq!(param_of(inner).as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn not_json_has_no_param() {
        assert_eq!(param_of("{nope"), None);
    }

    #[test]
    fn text_after_the_body_is_a_syntax_error() {
        let body = r#"{"model":"m","messages":[]} trailing"#;
        match parse_json::<ChatRequest>(body.as_bytes()) {
            Err(Error::InvalidRequest { message, param }) => {
                assert!(message.contains("could not parse the JSON"), "{message}");
                assert_eq!(param, None);
            }
            other => panic!("expected invalid request, got {other:?}"),
        }
    }
}
