//! JSON text as Python's `json.dumps` writes it: `", "` between entries and `": "` after keys,
//! keys in the order they came. SPEC 5 is written in its terms: compressed tool results look
//! like this (`"_compressed": true`), and the tokens of a request's `tools` are those of "its
//! JSON", which is this text with Python's default `ensure_ascii` (every character outside
//! printable ASCII as `\uXXXX`). Compressed results keep their text as it is
//! (`ensure_ascii=False`): an escaped character costs the model several tokens for one.

use serde_json::Value;

/// `value` written with `", "` and `": "` separators, its text as it is
/// (`json.dumps(value, ensure_ascii=False)`).
pub fn python_dumps(value: &Value) -> String {
    write(value, Spaced { ascii: false })
}

/// `value` as `json.dumps(value)` writes it by default: [`python_dumps`] with every character
/// outside printable ASCII escaped as Python escapes it (`\u00e9`, a surrogate pair beyond the
/// BMP, `\u007f`).
pub fn python_dumps_ascii(value: &Value) -> String {
    write(value, Spaced { ascii: true })
}

fn write(value: &Value, formatter: Spaced) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    // Writing a `Value` into a Vec cannot fail, and the output is UTF-8.
    let _ = serde::Serialize::serialize(value, &mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// `", "` before every entry but the first.
fn separate<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first { Ok(()) } else { w.write_all(b", ") }
}

struct Spaced {
    /// Escape what lies outside printable ASCII, as `ensure_ascii` does.
    ascii: bool,
}

impl serde_json::ser::Formatter for Spaced {
    /// The parts of a string that need no JSON escape; quotes, backslashes and control
    /// characters are escaped by serde_json as Python escapes them.
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ascii || fragment.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if (' '..='~').contains(&c) {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(w, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }
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

    /// What Python 3 prints for `json.dumps(v)` and `json.dumps(v, ensure_ascii=False)`.
    #[test]
    fn escapes_as_ensure_ascii_does() {
        let v = json!({"d": "Café 東京 😀 \u{7f}\t\"q\" \\ \u{1}"});
        assert_eq!(
            python_dumps_ascii(&v),
            r#"{"d": "Caf\u00e9 \u6771\u4eac \ud83d\ude00 \u007f\t\"q\" \\ \u0001"}"#
        );
        assert_eq!(
            python_dumps(&v),
            "{\"d\": \"Café 東京 😀 \u{7f}\\t\\\"q\\\" \\\\ \\u0001\"}"
        );
        assert_eq!(
            python_dumps_ascii(&json!({"a": [1, "b"]})),
            r#"{"a": [1, "b"]}"#
        );
    }
}
