//! Loading YAML into typed structs with errors a person can act on.
//!
//! Every config error names the file, the line and column where YAML knows it, the field path
//! (`backends[1].engine.max_batch`) and what to do about it. Both the simulator fleet file and the
//! gateway config load through here, so they answer mistakes the same way.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{DeserializeOwned, DeserializeSeed};

/// A config mistake: where it is and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, when the config came from one.
    pub file: Option<PathBuf>,
    /// 1-based line and column, when the YAML parser could tell.
    pub location: Option<(usize, usize)>,
    /// Dotted field path, e.g. `backends[0].engine.max_batch`; empty for the document root.
    pub path: String,
    /// What is wrong and, where there is one, the fix.
    pub message: String,
    /// The other errors found in the same run, each shown on a line of its own.
    pub also: Vec<ConfigError>,
}

impl ConfigError {
    /// An error found after parsing, at a field path.
    pub(crate) fn at(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            location: None,
            path: path.into(),
            message: message.into(),
            also: Vec::new(),
        }
    }

    /// The same error (and those it carries), attributed to `file`.
    #[must_use]
    pub(crate) fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_path_buf());
        self.also = std::mem::take(&mut self.also)
            .into_iter()
            .map(|e| e.in_file(file))
            .collect();
        self
    }

    /// How many errors this one stands for (itself and those it carries).
    pub(crate) fn count(&self) -> usize {
        1 + self.also.len()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self
            .file
            .as_deref()
            .map_or_else(|| "<config>".to_owned(), |p| p.display().to_string());
        write!(f, "{file}")?;
        if let Some((line, col)) = self.location {
            write!(f, ":{line}:{col}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)?;
        for other in &self.also {
            write!(f, "\n{other}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Parses `text` as YAML into `T`, reporting the failing field's path and position.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = tidy_path(&err.path().to_string());
        let inner = err.into_inner();
        let location = inner.location().map(|l| (l.line(), l.column()));
        ConfigError {
            file: None,
            location,
            path,
            message: strip_location(&inner.to_string()),
            also: Vec::new(),
        }
    })
}

/// Finds the line and column of the value at `path` (e.g. `backends[1].url`) in `text`, or of its
/// nearest ancestor that exists.
///
/// It re-reads the document with a visitor that walks down the path and fails on purpose at the
/// target: the YAML deserializer stamps that error with the node's position, which is exactly what
/// an error found after parsing (a duplicate name, a missing environment variable) lacks.
pub(crate) fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let segments = split_path(path);
    (0..=segments.len()).rev().find_map(|n| {
        let de = serde_yaml::Deserializer::from_str(text);
        match Finder(&segments[..n]).deserialize(de) {
            Err(e) if e.to_string().contains(HERE) => e.location().map(|l| (l.line(), l.column())),
            _ => None,
        }
    })
}

/// Attaches the file and the position of `err.path` in `text` to an error found after parsing.
pub fn place(mut err: ConfigError, file: &Path, text: &str) -> ConfigError {
    let also = std::mem::take(&mut err.also)
        .into_iter()
        .map(|e| place(e, file, text))
        .collect();
    let location = err.location.or_else(|| locate(text, &err.path));
    ConfigError {
        location,
        also,
        ..err.in_file(file)
    }
}

const HERE: &str = "tpsgate-locate-here";

#[derive(Debug, PartialEq)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

fn split_path(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Segment::Key(key));
        }
        while let Some((index, tail)) = rest.split_once(']') {
            if let Ok(i) = index.parse() {
                out.push(Segment::Index(i));
            }
            rest = tail.trim_start_matches('[');
        }
    }
    out
}

struct Finder<'p, 'a>(&'p [Segment<'a>]);

impl<'de> serde::de::DeserializeSeed<'de> for Finder<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        match self.0.first() {
            // Any visit fails with an "expected" naming HERE, stamped with this node's position.
            None => de.deserialize_any(Here),
            Some(Segment::Key(_)) => de.deserialize_map(self),
            Some(Segment::Index(_)) => de.deserialize_seq(self),
        }
    }
}

impl<'de> serde::de::Visitor<'de> for Finder<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping or sequence on the path")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some(Segment::Key(want)) = self.0.first() else {
            return Ok(());
        };
        while let Some(key) = map.next_key::<String>()? {
            if key == *want {
                map.next_value_seed(Finder(&self.0[1..]))?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some(Segment::Index(want)) = self.0.first() else {
            return Ok(());
        };
        let mut i = 0;
        while seq
            .next_element_seed(Skip(i == *want, &self.0[1..]))?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }
}

/// The target node: every visit is an error whose text names [`HERE`].
struct Here;

impl serde::de::Visitor<'_> for Here {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HERE)
    }
}

/// A sequence element: walked into when it is the wanted one, skipped otherwise.
struct Skip<'p, 'a>(bool, &'p [Segment<'a>]);

impl<'de> serde::de::DeserializeSeed<'de> for Skip<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        if self.0 {
            Finder(self.1).deserialize(de)
        } else {
            serde::de::IgnoredAny::deserialize(de).map(|_| ())
        }
    }
}

/// Reads and parses a YAML file; errors carry the file name.
pub fn from_file<T: DeserializeOwned>(file: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(file)
        .map_err(|err| ConfigError::at("", format!("cannot read the file: {err}")).in_file(file))?;
    from_str(&text).map_err(|e| e.in_file(file))
}

/// serde_path_to_error writes `.` for the root and `backends[0].x`; keep the latter, drop the former.
fn tidy_path(path: &str) -> String {
    if path == "." {
        String::new()
    } else {
        path.to_owned()
    }
}

/// serde_yaml wraps its messages as "PATH: message at line L column C"; we print the path and
/// the location ourselves.
fn strip_location(message: &str) -> String {
    let message = message.find(" at line ").map_or(message, |i| &message[..i]);
    match message.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') => rest.to_owned(),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[expect(dead_code, reason = "only parsed")]
        items: Vec<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[expect(dead_code, reason = "only parsed")]
        size: u32,
    }

    #[test]
    fn unknown_field_error_names_path_line_and_column() {
        let err = from_str::<Outer>("items:\n  - size: 1\n  - sise: 2\n").unwrap_err();
        assert_eq!(err.path, "items[1].sise");
        assert_eq!(err.location, Some((3, 5)));
        assert!(
            err.message.contains("unknown field `sise`"),
            "{}",
            err.message
        );
        let shown = err.in_file(Path::new("fleet.yaml")).to_string();
        assert!(
            shown.starts_with("fleet.yaml:3:5: items[1].sise: unknown field"),
            "{shown}"
        );
    }

    #[test]
    fn locate_finds_values_by_path_and_falls_back_to_the_parent() {
        let text =
            "a: 1\nlist:\n  - name: x\n    url: http://one\n  - name: y\n    url: ftp://two\n";
        assert_eq!(locate(text, "list[1].url"), Some((6, 10)));
        assert_eq!(locate(text, "list[0].name"), Some((3, 11)));
        assert_eq!(locate(text, "list[1].missing"), Some((5, 5)));
        assert_eq!(locate(text, "a"), Some((1, 4)));
    }

    #[test]
    fn wrong_type_error_names_the_field() {
        let err = from_str::<Outer>("items:\n  - size: many\n").unwrap_err();
        assert_eq!(err.path, "items[0].size");
        assert!(err.message.contains("invalid type"), "{}", err.message);
    }
}
