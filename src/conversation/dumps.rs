//! JSON text as Python's `json.dumps` writes it by default: `", "` between entries and `": "`
//! after keys, keys in the order they came. SPEC 5 is written in its terms: compressed tool
//! results look like this (`"_compressed": true`), and the tokens of a request's `tools` are
//! those of "its JSON", which is this text.

use serde_json::Value;

/// `value` written with `", "` and `": "` separators.
pub fn python_dumps(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    // Writing a `Value` into a Vec cannot fail, and the output is UTF-8.
    let _ = serde::Serialize::serialize(value, &mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// `", "` before every entry but the first.
fn separate<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first { Ok(()) } else { w.write_all(b", ") }
}

struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separate(w, first)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separate(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_as_python_json_dumps() {
        let v = json!({"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2]}}});
        assert_eq!(
            python_dumps(&v),
            r#"{"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2]}}}"#
        );
        assert_eq!(python_dumps(&json!([])), "[]");
        assert_eq!(python_dumps(&json!({})), "{}");
    }
}
