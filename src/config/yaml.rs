//! YAML loading with errors that name the key path (`policy.token_budget.max_tokens`), which
//! serde-saphyr alone reports only as line and column. Type errors are reworded for people
//! editing YAML (`expected an integer` rather than serde-saphyr's `invalid u64`): SPEC section 1
//! quotes that wording for check-config.

use serde::de::DeserializeOwned;
use serde_saphyr::Error as YamlError;

/// Parses `text` into `T`; the error names the key path and the YAML position.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut path_err: Option<String> = None;
    let result = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize::<_, T>(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            path_err = Some(if path == "." || path.is_empty() {
                first_line(&inner.to_string())
            } else {
                let message = plain_message(&inner)
                    .unwrap_or_else(|| strip_position(&first_line(&inner.to_string())));
                format!("{path}: {message}")
            });
            inner
        })
    });
    match result {
        Ok(v) => Ok(v),
        Err(e) => Err(path_err.unwrap_or_else(|| first_line(&e.to_string()))),
    }
}

/// The wording for type errors, by what the field expected. serde-saphyr names Rust types
/// (`u64`, `floating point`); a config author thinks in integers, numbers and booleans.
fn plain_message(err: &YamlError) -> Option<String> {
    let mut err = err;
    while let YamlError::WithSnippet { error, .. } | YamlError::AliasError { error, .. } = err {
        err = error;
    }
    let expected = match err {
        YamlError::InvalidScalar { ty, .. } => match *ty {
            "u8" | "u16" | "u32" | "u64" | "u128" | "usize" | "i8" | "i16" | "i32" | "i64"
            | "i128" | "isize" => "an integer",
            "f32" | "f64" | "floating point" => "a number",
            "boolean" | "bool" => "a boolean",
            "char" => "a single character",
            _ => return None,
        },
        YamlError::InvalidBooleanStrict { .. } => "a boolean",
        YamlError::NullIntoString { .. } => "a string",
        // serde-saphyr reads every scalar (string, number, boolean) through one path, so a list
        // or mapping where any scalar belongs says "string scalar" even for an integer field;
        // naming a string there would mislead.
        YamlError::Unexpected { expected, .. } => match *expected {
            "string scalar" => "a single value, not a list or mapping",
            "sequence start" => "a list",
            "mapping start" => "a mapping",
            _ => return None,
        },
        _ => return None,
    };
    Some(format!("expected {expected}"))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim().to_string()
}

/// serde-saphyr adds the position to messages (`... at line L, column C`, or as a prefix
/// `error: line L column C: ` in older versions); with a key path that is noise, but keep the
/// position for syntax errors where no path exists.
fn strip_position(s: &str) -> String {
    let s = s.strip_prefix("error: ").unwrap_or(s);
    if s.starts_with("line ")
        && let Some(idx) = s.find(": ")
    {
        return s[idx + 2..].to_string();
    }
    if let Some(idx) = s.rfind(" at line ")
        && s[idx..].contains(", column ")
    {
        return s[..idx].to_string();
    }
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[allow(dead_code)]
        max_tokens: u64,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[allow(dead_code)]
        budget: Inner,
    }

    #[test]
    fn wrong_type_names_the_key_path() {
        let err = parse::<Outer>("budget:\n  max_tokens: abc\n").unwrap_err();
        assert_eq!(err, "budget.max_tokens: expected an integer");
        let err = parse::<Outer>("budget:\n  max_tokens: -3\n").unwrap_err();
        assert_eq!(err, "budget.max_tokens: expected an integer");
    }

    #[test]
    fn unknown_key_names_the_key_path() {
        let err = parse::<Outer>("budget:\n  max_tokenz: 3\n").unwrap_err();
        assert!(err.contains("budget"), "{err}");
        assert!(err.contains("max_tokenz"), "{err}");
    }
}
