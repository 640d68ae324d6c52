//! What the tap reads of a client message to decide on it, parsed without building the rest.
//!
//! The tap's decisions ([`super::tap`]) look at a handful of members: `id`, `method`, whether
//! `result` or `error` is present, and in `params` the `_meta` keys of protocol 2026-07-28,
//! `clientInfo`, `protocolVersion`, and the types of `params`, `params._meta` and
//! `params.arguments`. [`head`] parses a message into a [`Value`] holding exactly those members
//! (a member whose type is all that is read becomes an empty value of that type), and skips
//! everything else unparsed (serde's `IgnoredAny`: validated, never allocated). Building the
//! whole message as a `Value` on the reply path cost about as much as answering it; the whole
//! `Value` is now parsed by the record writer, off the reply path.
//!
//! # Guarantee
//! For a message [`head`] accepts, every question the tap asks of the head has the answer it
//! has on the whole message (`head_answers_as_the_whole_message`). It accepts only a JSON object;
//! anything else (malformed, not an object) is `None`, and the tap parses the whole message as
//! before. Skipped members are not held to serde_json's nesting limit; the tap takes the head's
//! path only for a message rmcp's own (depth-limited) parse accepts as well.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// The members of `text` the tap reads (see the module docs), or `None`.
pub fn head(text: &str) -> Option<Value> {
    let mut de = serde_json::Deserializer::from_str(text);
    let head = de.deserialize_map(Members(Level::Top)).ok()?;
    de.end().ok()?;
    Some(head)
}

/// Which object is being read.
#[derive(Clone, Copy)]
enum Level {
    /// The message.
    Top,
    /// Its `params`.
    Params,
    /// `params._meta`.
    Meta,
}

/// What to keep of a member.
enum Keep {
    /// The whole value.
    Whole,
    /// An empty value of its type.
    TypeOnly,
    /// The kept members of this object (an empty value of its type when it is not an object).
    Object(Level),
    /// Nothing: skipped.
    Skip,
}

fn keep(level: Level, key: &str) -> Keep {
    match (level, key) {
        (Level::Top, "id" | "method") => Keep::Whole,
        (Level::Top, "result" | "error") => Keep::TypeOnly,
        (Level::Top, "params") => Keep::Object(Level::Params),
        (Level::Params, "_meta") => Keep::Object(Level::Meta),
        (Level::Params, "clientInfo" | "protocolVersion") => Keep::Whole,
        (Level::Params, "arguments") => Keep::TypeOnly,
        (Level::Meta, super::record::PROTOCOL_VERSION_META_KEY)
        | (Level::Meta, super::record::CLIENT_INFO_META_KEY) => Keep::Whole,
        (Level::Meta, super::record::INLINE_CAPABILITIES_META_KEY) => Keep::TypeOnly,
        _ => Keep::Skip,
    }
}

/// Reads an object member by member, keeping what [`keep`] says.
struct Members(Level);

impl<'de> Visitor<'de> for Members {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<Key>()? {
            let kept = match keep(self.0, &key.0) {
                Keep::Whole => map.next_value::<Value>()?,
                Keep::TypeOnly => map.next_value_seed(TypeOnly)?,
                Keep::Object(level) => map.next_value_seed(Nested(level))?,
                Keep::Skip => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            // A repeated name keeps its last value, as `Value`'s own parse does.
            out.insert(key.0.into_owned(), kept);
        }
        Ok(Value::Object(out))
    }
}

/// A member name, borrowed from the text when it has no escapes.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// An object whose kept members are read at `level`; any other value becomes an empty value of
/// its type.
struct Nested(Level);

impl<'de> DeserializeSeed<'de> for Nested {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(NestedVisitor(self.0))
    }
}

struct NestedVisitor(Level);

impl<'de> Visitor<'de> for NestedVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Members(self.0).visit_map(map)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        TypeVisitor.visit_seq(seq)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        TypeVisitor.visit_bool(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        TypeVisitor.visit_i64(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        TypeVisitor.visit_u64(v)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        TypeVisitor.visit_f64(v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        TypeVisitor.visit_str(v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        TypeVisitor.visit_unit()
    }
}

/// Any value, kept as an empty value of its type.
struct TypeOnly;

impl<'de> DeserializeSeed<'de> for TypeOnly {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(TypeVisitor)
    }
}

struct TypeVisitor;

impl<'de> Visitor<'de> for TypeVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Bool(false))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Value, E> {
        Ok(Value::from(0))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Value, E> {
        Ok(Value::from(0))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Value, E> {
        Ok(Value::from(0))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Value, E> {
        Ok(Value::String(String::new()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Array(Vec::new()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Object(Map::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::record::{
        CLIENT_INFO_META_KEY, INLINE_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY,
    };
    use serde_json::json;

    /// The questions the tap asks of a message (`TapConnection::one_message`).
    fn answers(m: &Value) -> Vec<String> {
        let params = m.get("params");
        let meta = params.and_then(|p| p.get("_meta"));
        let q = |v: Option<&Value>| match v {
            None => "absent".to_string(),
            Some(v) => crate::shape::JsonType::of(v).name().to_string(),
        };
        vec![
            format!("{:?}", m.get("id")),
            format!("{:?}", m.get("method").and_then(Value::as_str)),
            format!("{}", m.get("result").is_some()),
            format!("{}", m.get("error").is_some()),
            q(params),
            q(meta),
            q(params.and_then(|p| p.get("arguments"))),
            format!("{:?}", params.and_then(|p| p.get("clientInfo"))),
            format!("{:?}", params.and_then(|p| p.get("protocolVersion"))),
            format!("{:?}", meta.and_then(|m| m.get(PROTOCOL_VERSION_META_KEY))),
            format!("{:?}", meta.and_then(|m| m.get(CLIENT_INFO_META_KEY))),
            q(meta.and_then(|m| m.get(INLINE_CAPABILITIES_META_KEY))),
        ]
    }

    #[test]
    fn head_answers_as_the_whole_message() {
        let cases = [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"a":[1,{"b":2}]},"_meta":{"callId":"c","x":{"y":[1,2]},"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"n","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"a":1}}}}"#,
            r#"{"jsonrpc":"2.0","id":"s","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"2"}}}"#,
            r#"{"jsonrpc":"2.0","id":null,"result":{"x":[1,2,3]}}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"m"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"id":1,"method":"tools/call","params":[1,2]}"#,
            r#"{"id":1,"method":"tools/call","params":{"_meta":"str","arguments":[1]}}"#,
            r#"{"id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":true},"arguments":7.5}}"#,
            r#"{"id":1,"method":"x","params":null}"#,
            r#"{"id":1,"method":5,"params":{"arguments":null,"_meta":null}}"#,
            r#"{"id":1,"id":2,"method":"a","method":"b","params":{"arguments":"s"}}"#,
            r#"{"id":{"o":1},"method":"m","params":{"arguments":false}}"#,
            r#"{"i\u0064":1,"method":"m\n","params":{"_m\u0065ta":{"k":1}}}"#,
            r#"{}"#,
        ];
        for text in cases {
            let whole: Value = serde_json::from_str(text).unwrap();
            let head = head(text).unwrap_or_else(|| panic!("accepted: {text}"));
            assert_eq!(answers(&head), answers(&whole), "{text}");
        }
    }

    #[test]
    fn anything_but_an_object_is_refused() {
        for text in [
            "[1]",
            "42",
            "\"s\"",
            "{not json",
            "{\"id\":1} trailing",
            "{\"id\":1,}",
        ] {
            assert_eq!(head(text), None, "{text}");
        }
        assert_eq!(
            head(r#"{"id":1,"params":{"x":"big"}}"#),
            Some(json!({"id": 1, "params": {}}))
        );
    }
}
