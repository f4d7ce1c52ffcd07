//! The top-level members of a JSON object, found without parsing their values.
//!
//! Classify needs a handful of top-level keys (`model`, `stream`, ...) and their byte spans, and
//! nothing inside `messages`, which is nearly all of a real body. A full parser pays for every
//! escape in the prompt, all of it on the request's way to its first token (`benches/peek.rs`;
//! docs/benchmarks/overhead.md, "Request size"). Here a string is skipped by searching for its next
//! quote or backslash (a word at a time, then [`memchr::memchr2`]), and a nested value by
//! counting brackets outside strings.
//!
//! What is checked: the body is one object; its keys are strings followed by `:`; members are
//! separated by `,`; strings are closed; brackets are closed by their own kind, at most
//! [`MAX_DEPTH`] deep; nothing but whitespace follows the object. What is not: the contents of
//! values (numbers, literals, escapes, control characters) — the caller parses the few values it
//! reads, and the rest is the backend's to judge. For valid JSON the members and spans are
//! exactly a parser's (a property test checks them against serde_json).

use std::ops::Range;

/// Nesting deeper than this, the body's object included, is refused, as serde_json refuses it.
pub(crate) const MAX_DEPTH: usize = 128;

/// One top-level member: its key as written (between the quotes, escapes not decoded) and its
/// value's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// The key's bytes inside its quotes.
    pub key: Range<usize>,
    /// The value's bytes, from its first byte to its last.
    pub value: Range<usize>,
}

/// Why a body is not a JSON object, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SkimError {
    what: &'static str,
    at: usize,
}

impl SkimError {
    /// The message with the line and column (1-based, in bytes) where the body went wrong.
    pub(crate) fn describe(&self, body: &[u8]) -> String {
        let before = &body[..self.at.min(body.len())];
        let line = memchr::memchr_iter(b'\n', before).count() + 1;
        let column = before.len() - memchr::memrchr(b'\n', before).map_or(0, |i| i + 1) + 1;
        format!("{} at line {line} column {column}", self.what)
    }
}

/// The members of the object `body` holds, in order; the first error ends them.
pub(crate) fn members(body: &[u8]) -> Members<'_> {
    Members {
        body,
        at: 0,
        state: State::Start,
    }
}

/// See [`members`].
#[derive(Debug)]
pub(crate) struct Members<'a> {
    body: &'a [u8],
    at: usize,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    First,
    Next,
    Done,
}

impl Iterator for Members<'_> {
    type Item = Result<Member, SkimError>;

    fn next(&mut self) -> Option<Self::Item> {
        let result = self.step();
        match result {
            Ok(Some(member)) => Some(Ok(member)),
            Ok(None) => {
                self.state = State::Done;
                None
            }
            Err(e) => {
                self.state = State::Done;
                Some(Err(e))
            }
        }
    }
}

impl Members<'_> {
    fn step(&mut self) -> Result<Option<Member>, SkimError> {
        match self.state {
            State::Done => return Ok(None),
            State::Start => {
                self.skip_whitespace();
                if self.peek() != Some(b'{') {
                    return Err(self.error("expected `{`: the body must be a JSON object"));
                }
                self.at += 1;
                self.state = State::First;
            }
            State::First | State::Next => {}
        }
        self.skip_whitespace();
        match (self.peek(), self.state) {
            (Some(b'}'), _) => {
                self.at += 1;
                self.skip_whitespace();
                return match self.peek() {
                    None => Ok(None),
                    Some(_) => Err(self.error("trailing characters after the object")),
                };
            }
            (Some(b','), State::Next) => {
                self.at += 1;
                self.skip_whitespace();
            }
            (None, _) => return Err(self.error("EOF while parsing an object")),
            (Some(_), State::Next) => return Err(self.error("expected `,` or `}`")),
            (Some(_), _) => {}
        }
        if self.peek() != Some(b'"') {
            return Err(self.error("expected `\"` to start a key"));
        }
        let key_start = self.at + 1;
        self.at = skip_string(self.body, key_start)?;
        let key = key_start..self.at - 1;
        self.skip_whitespace();
        if self.peek() != Some(b':') {
            return Err(self.error("expected `:` after a key"));
        }
        self.at += 1;
        self.skip_whitespace();
        let start = self.at;
        self.at = skip_value(self.body, start)?;
        self.state = State::Next;
        Ok(Some(Member {
            key,
            value: start..self.at,
        }))
    }

    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn error(&self, what: &'static str) -> SkimError {
        SkimError { what, at: self.at }
    }
}

/// From just inside a string's opening quote to just past its closing one.
fn skip_string(body: &[u8], mut at: usize) -> Result<usize, SkimError> {
    loop {
        match quote_or_backslash(body, at) {
            Some(i) if body[i] == b'"' => return Ok(i + 1),
            // A backslash and the byte it escapes (`\"`, `\\`, the `u` of `\uXXXX`).
            Some(i) => at = i + 2,
            None => {
                return Err(SkimError {
                    what: "EOF while parsing a string",
                    at: body.len(),
                });
            }
        }
    }
}

/// Bytes searched a word at a time before handing over to [`memchr::memchr2`].
const NEAR: usize = 32;

/// The first `"` or `\` at or after `at`. Escapes often come a few bytes apart (source code in a
/// prompt: a `\n` per line, a `\"` per string), and memchr's vector search costs ~15 ns to set up
/// whatever it finds, so the first [`NEAR`] bytes are searched here, eight at a time
/// (docs/benchmarks/overhead.md, "Request size").
fn quote_or_backslash(body: &[u8], mut at: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let near = at.saturating_add(NEAR);
    while at < near {
        let Some(word) = body.get(at..at + 8) else {
            break;
        };
        let w = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let (q, b) = (w ^ (ONES * u64::from(b'"')), w ^ (ONES * u64::from(b'\\')));
        // A zero byte's high bit (exact for the lowest one, which is all that is read).
        let hits = ((q.wrapping_sub(ONES) & !q) | (b.wrapping_sub(ONES) & !b)) & HIGH;
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    memchr::memchr2(b'"', b'\\', body.get(at..)?).map(|i| at + i)
}

/// From a value's first byte to just past its last.
fn skip_value(body: &[u8], at: usize) -> Result<usize, SkimError> {
    match body.get(at) {
        Some(b'"') => skip_string(body, at + 1),
        Some(b'{' | b'[') => skip_nested(body, at),
        Some(b',' | b'}' | b']' | b':') | None => Err(SkimError {
            what: "expected a value",
            at,
        }),
        // A number or a literal: the bytes up to the next structural byte or whitespace.
        Some(_) => Ok(body[at..]
            .iter()
            .position(|b| {
                matches!(
                    b,
                    b',' | b'}' | b']' | b'{' | b'[' | b':' | b'"' | b' ' | b'\t' | b'\n' | b'\r'
                )
            })
            .map_or(body.len(), |n| at + n)),
    }
}

/// From an object's or array's opening bracket to just past its closing one. Which kind of
/// bracket is open at each depth is one bit of `kinds` (set for `[`).
fn skip_nested(body: &[u8], mut at: usize) -> Result<usize, SkimError> {
    let mut kinds = 0u128;
    let mut depth = 0usize;
    while let Some(&b) = body.get(at) {
        match b {
            b'"' => {
                at = skip_string(body, at + 1)?;
                continue;
            }
            b'{' | b'[' => {
                // The body's own object is one level.
                if depth + 1 == MAX_DEPTH {
                    return Err(SkimError {
                        what: "nesting deeper than 128 levels",
                        at,
                    });
                }
                kinds = (kinds << 1) | u128::from(b == b'[');
                depth += 1;
            }
            b'}' | b']' => {
                if kinds & 1 != u128::from(b == b']') {
                    return Err(SkimError {
                        what: "a bracket closed by the other kind",
                        at,
                    });
                }
                kinds >>= 1;
                depth -= 1;
                if depth == 0 {
                    return Ok(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
    Err(SkimError {
        what: "EOF while parsing a value",
        at: body.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn skim(body: &[u8]) -> Result<Vec<(String, Value)>, String> {
        members(body)
            .map(|m| {
                let m = m.map_err(|e| e.describe(body))?;
                let quoted = &body[m.key.start - 1..m.key.end + 1];
                let key: String = serde_json::from_slice(quoted).map_err(|e| e.to_string())?;
                let value: Value =
                    serde_json::from_slice(&body[m.value]).map_err(|e| e.to_string())?;
                Ok((key, value))
            })
            .collect()
    }

    fn error(body: &str) -> String {
        match skim(body.as_bytes()) {
            Err(e) => e,
            Ok(members) => panic!("{body} skimmed as {members:?}"),
        }
    }

    #[test]
    fn members_and_their_spans_are_found_past_escapes_and_nesting() {
        let body = br#" { "messages" : [{"content":"a \"quoted\" } ] \\"}, [1, {"x":[]}]],
            "model":"m\u0041", "n": -1.5e3 ,"t":true,"z":null}  "#;
        let found = skim(body).unwrap();
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["messages", "model", "n", "t", "z"]);
        assert_eq!(found[1].1, "mA");
        assert_eq!(found[2].1, -1500.0);
        let spans: Vec<Member> = members(body).map(Result::unwrap).collect();
        assert_eq!(&body[spans[1].value.clone()], br#""m\u0041""#);
        assert_eq!(&body[spans[4].value.clone()], b"null");
        assert!(skim(b"{}").unwrap().is_empty() && skim(b"\n{ }\n").unwrap().is_empty());
    }

    #[test]
    fn escapes_anywhere_in_a_long_string_are_skipped() {
        // Either side of each word and of the hand-over to memchr.
        for before in 0..80 {
            for escape in [r#"\""#, r#"\\"#, r#"\\\""#, r#"\n"#, r#"\u0022"#] {
                let text = format!("{}{escape}{}", "x".repeat(before), "y".repeat(before % 7));
                let body = format!(r#"{{"a":"{text}","b":"{escape}","c":1}}"#);
                let found = skim(body.as_bytes()).unwrap();
                let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
                assert_eq!(keys, ["a", "b", "c"], "{body}");
            }
        }
    }

    #[test]
    fn bodies_that_are_not_one_object_are_refused_with_where() {
        assert_eq!(
            error(""),
            "expected `{`: the body must be a JSON object at line 1 column 1"
        );
        assert!(error("[1]").starts_with("expected `{`"));
        assert_eq!(
            error("{\n  \"a\":1,\n  x"),
            "expected `\"` to start a key at line 3 column 3"
        );
        assert!(error(r#"{"a":1"#).starts_with("EOF while parsing an object"));
        assert!(error(r#"{"a":1 "b":2}"#).starts_with("expected `,` or `}`"));
        assert!(error(r#"{"a":1"b":2}"#).starts_with("expected `,` or `}`"));
        assert!(error(r#"{"a" 1}"#).starts_with("expected `:`"));
        assert!(error(r#"{"a":}"#).starts_with("expected a value"));
        assert!(error(r#"{"a":1,}"#).starts_with("expected `\"` to start a key"));
        assert!(error(r#"{"a":"b}"#).starts_with("EOF while parsing a string"));
        assert!(error(r#"{"a":"b\"}"#).starts_with("EOF while parsing a string"));
        assert!(error(r#"{"a":[{"b":1]}"#).starts_with("a bracket closed by the other kind"));
        assert!(error(r#"{"a":[[1]}"#).starts_with("a bracket closed by the other kind"));
        assert!(error(r#"{"a":[1"#).starts_with("EOF while parsing a value"));
        assert!(error(r#"{"a":1} {}"#).starts_with("trailing characters"));
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(128), "]".repeat(128));
        assert!(error(&deep).starts_with("nesting deeper than 128"));
        let fine = format!("{{\"a\":{}{}}}", "[".repeat(127), "]".repeat(127));
        assert_eq!(skim(fine.as_bytes()).unwrap().len(), 1);
    }

    /// Any JSON value, nested a few levels, with strings that need escapes.
    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "(\\PC|[\"\\\\\n\t\u{1}])*".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("(\\PC|[\"\\\\])*", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn members_of_any_object_are_the_parsers(
            object in prop::collection::btree_map("(\\PC|[\"\\\\])*", json(), 0..8),
            pretty in any::<bool>(),
        ) {
            let object: serde_json::Map<String, Value> = object.into_iter().collect();
            let value = Value::Object(object.clone());
            let body = if pretty {
                serde_json::to_vec_pretty(&value)
            } else {
                serde_json::to_vec(&value)
            }.unwrap();
            let found = skim(&body).unwrap();
            // As the parser reads each value back (floats do not always round-trip).
            let expected: Vec<(String, Value)> = object
                .into_iter()
                .map(|(k, v)| (k, serde_json::from_slice(&serde_json::to_vec(&v).unwrap()).unwrap()))
                .collect();
            prop_assert_eq!(found, expected);
        }

        #[test]
        fn any_bytes_end_in_members_or_an_error_without_panicking(body in prop::collection::vec(any::<u8>(), 0..64)) {
            for member in members(&body) {
                match member {
                    Ok(m) => prop_assert!(m.key.end <= body.len() && m.value.end <= body.len()),
                    Err(e) => { e.describe(&body); }
                }
            }
        }
    }
}
