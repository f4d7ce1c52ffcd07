//! Requests, both ways. A request is translated before it is sent, so on its first token's
//! path: the body is read as borrowed spans (an object's members as raw values, a string decoded
//! only where it is compared) and the translation written straight out, every field the client
//! sent either mapped, dropped as a documented hint, or refused by name. The reading and writing
//! are here; each direction's mapping in its own file.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::Refused;

mod responses;
mod to_chat;
mod to_messages;

pub use responses::{ChatRequest, HostedTools, responses_to_chat};
pub use to_chat::{Thinking, count_to_tokenize, messages_to_chat};
pub use to_messages::chat_to_messages;

fn refuse<T>(message: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(message.into()))
}

/// Where a value stands in the request (`messages[2].content[0].`), spelled out only when a
/// refusal names it.
#[derive(Clone, Copy)]
enum At<'p> {
    Root,
    Field(&'p At<'p>, &'static str),
    Item(&'p At<'p>, &'static str, usize),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Root => Ok(()),
            At::Field(parent, name) => write!(f, "{parent}{name}."),
            At::Item(parent, name, i) => write!(f, "{parent}{name}[{i}]."),
        }
    }
}

/// A string as it stands in the body where it has no escapes, decoded where it has.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Strings;
        impl<'de> Visitor<'de> for Strings {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
        }
        deserializer.deserialize_str(Strings)
    }
}

/// A JSON object's members as they stand in the body: each value raw, read further only where
/// the translation needs what is inside it.
struct Object<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Object<'de>, M::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(Text(key)) = map.next_key()? {
                    members.push((key, map.next_value()?));
                }
                Ok(Object(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

impl<'a> Object<'a> {
    /// The value of `key`: the last, where the client sent it twice, as a JSON parser keeps.
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|&(_, v)| v)
    }

    /// The value of `key` unless absent or `null`.
    fn given(&self, key: &str) -> Option<&'a RawValue> {
        self.get(key).filter(|v| v.get() != "null")
    }

    /// The first key not allowed by `allowed`, refused as one the target has no field for.
    fn only_where(
        &self,
        allowed: impl Fn(&str, &RawValue) -> bool,
        at: &At,
        target: &str,
    ) -> Result<(), Refused> {
        match self.0.iter().find(|(k, v)| !allowed(k, v)) {
            Some((k, _)) => refuse(format!(
                "`{at}{k}` cannot be expressed for {target} backend (no such field there); remove it or send this model's requests to a backend of the client's dialect"
            )),
            None => Ok(()),
        }
    }

    /// Refuses any key not in `known`.
    fn only(&self, known: &[&str], at: &At, target: &str) -> Result<(), Refused> {
        self.only_where(|k, _| known.contains(&k), at, target)
    }

    /// The string at `key`, decoded.
    fn str(&self, key: &str, at: &At) -> Result<Cow<'a, str>, Refused> {
        match self.get(key).and_then(text) {
            Some(s) => Ok(s),
            None => refuse(format!("`{at}{key}` must be a string")),
        }
    }

    /// The string at `key` as it stands, quotes included: copied, never decoded.
    fn raw_str(&self, key: &str, at: &At) -> Result<&'a RawValue, Refused> {
        match self.get(key).filter(|v| is(v, b'"')) {
            Some(s) => Ok(s),
            None => refuse(format!("`{at}{key}` must be a string")),
        }
    }
}

/// Whether a raw value is of the kind its first byte `first` starts (`"`, `{`, `[`).
fn is(raw: &RawValue, first: u8) -> bool {
    raw.get().as_bytes().first() == Some(&first)
}

fn text(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Text>(raw.get()).ok().map(|t| t.0)
}

/// The object `raw` is, or the refusal `otherwise` spells.
fn object<'a>(
    raw: &'a RawValue,
    otherwise: impl FnOnce() -> String,
) -> Result<Object<'a>, Refused> {
    serde_json::from_str(raw.get()).or_else(|_| refuse(otherwise()))
}

/// The object `raw` is, or a refusal saying that `{at}` must be one.
fn object_at<'a>(raw: &'a RawValue, at: &At) -> Result<Object<'a>, Refused> {
    object(raw, || format!("`{at}` must be an object"))
}

/// The items of the array `raw`, or a refusal saying that `name` must be one.
fn items<'a>(
    raw: Option<&'a RawValue>,
    name: &dyn fmt::Display,
) -> Result<Vec<&'a RawValue>, Refused> {
    match raw.map(|r| serde_json::from_str(r.get())) {
        Some(Ok(items)) => Ok(items),
        _ => refuse(format!("`{name}` must be an array")),
    }
}

/// The objects of the array `raw`, each read as its members in the same pass (an item's text
/// is not scanned again to read the item), or a refusal saying that `name` must be an array of
/// objects.
fn objects<'a>(raw: &'a RawValue, name: &dyn fmt::Display) -> Result<Vec<Object<'a>>, Refused> {
    serde_json::from_str(raw.get())
        .or_else(|_| refuse(format!("`{name}` must be an array of objects")))
}

/// JSON written as the translation goes: a comma before every member and item but the first.
struct Json(Vec<u8>);

impl Json {
    fn comma(&mut self) {
        if !matches!(self.0.last(), None | Some(b'{' | b'[' | b':')) {
            self.0.push(b',');
        }
    }

    /// Starts member `key` of the object being written: its value comes next.
    fn key(&mut self, key: &str) -> &mut Self {
        self.comma();
        self.0.push(b'"');
        self.0.extend_from_slice(key.as_bytes());
        self.0.extend_from_slice(b"\":");
        self
    }

    /// Starts the next item of the array being written.
    fn item(&mut self) -> &mut Self {
        self.comma();
        self
    }

    /// Writes JSON text as it is: a raw value of the client's, or a literal of ours.
    fn raw(&mut self, json: &str) -> &mut Self {
        self.0.extend_from_slice(json.as_bytes());
        self
    }

    fn value(&mut self, raw: &RawValue) -> &mut Self {
        self.raw(raw.get())
    }

    /// Writes `s` as a JSON string.
    fn str(&mut self, s: &str) -> &mut Self {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.0, s);
        self
    }

    fn open(&mut self, bracket: u8) -> &mut Self {
        self.0.push(bracket);
        self
    }

    fn close(&mut self, bracket: u8) -> &mut Self {
        self.open(bracket)
    }
}

fn body_object(body: &[u8]) -> Result<Object<'_>, Refused> {
    match serde_json::from_slice(body) {
        Ok(o) => Ok(o),
        _ => refuse("the body must be a JSON object to be translated"),
    }
}

fn put_text_part(out: &mut Json, text: &RawValue) {
    out.item()
        .raw(r#"{"type":"text","text":"#)
        .value(text)
        .close(b'}');
}

/// A part of an OpenAI user (or system) message.
enum Part<'a> {
    Text(&'a RawValue),
    ImageUrl(Cow<'a, str>),
}

fn put_parts(out: &mut Json, parts: &[Part]) {
    out.open(b'[');
    for part in parts {
        match part {
            Part::Text(t) => put_text_part(out, t),
            Part::ImageUrl(url) => {
                let image = out.item().raw(r#"{"type":"image_url","image_url":{"url":"#);
                image.str(url).raw("}}");
            }
        }
    }
    out.close(b']');
}
