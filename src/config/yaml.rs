//! YAML loading with errors that name the key path (`policy.token_budget.max_tokens`), which
//! serde-saphyr alone reports only as line and column.

use serde::de::DeserializeOwned;

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
                format!(
                    "{path}: {}",
                    strip_position(&first_line(&inner.to_string()))
                )
            });
            inner
        })
    });
    match result {
        Ok(v) => Ok(v),
        Err(e) => Err(path_err.unwrap_or_else(|| first_line(&e.to_string()))),
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim().to_string()
}

/// serde-saphyr prefixes messages with `error: line L column C: `; with a key path that is
/// noise, but keep the position for syntax errors where no path exists.
fn strip_position(s: &str) -> String {
    let s = s.strip_prefix("error: ").unwrap_or(s);
    if s.starts_with("line ")
        && let Some(idx) = s.find(": ")
    {
        return s[idx + 2..].to_string();
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
        assert!(err.starts_with("budget.max_tokens: "), "{err}");
    }

    #[test]
    fn unknown_key_names_the_key_path() {
        let err = parse::<Outer>("budget:\n  max_tokenz: 3\n").unwrap_err();
        assert!(err.contains("budget"), "{err}");
        assert!(err.contains("max_tokenz"), "{err}");
    }
}
