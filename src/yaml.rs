//! Loading YAML into typed structs with errors a person can act on.
//!
//! Every config error names the file, the line and column where YAML knows it, the field path
//! (`backends[1].engine.max_batch`) and what to do about it. Both the simulator fleet file and the
//! gateway config load through here, so they answer mistakes the same way.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

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
}

impl ConfigError {
    /// An error found after parsing, at a field path.
    pub fn at(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            location: None,
            path: path.into(),
            message: message.into(),
        }
    }

    /// The same error, attributed to `file`.
    #[must_use]
    pub fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_path_buf());
        self
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
        write!(f, ": {}", self.message)
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
        }
    })
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
    fn wrong_type_error_names_the_field() {
        let err = from_str::<Outer>("items:\n  - size: many\n").unwrap_err();
        assert_eq!(err.path, "items[0].size");
        assert!(err.message.contains("invalid type"), "{}", err.message);
    }
}
