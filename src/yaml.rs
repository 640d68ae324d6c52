//! Strict YAML input: every YAML file callid reads (scenarios, target profiles, router and
//! gateway policies, identity source tables, the support matrix) is loaded by [`from_str`] or
//! [`from_value`], so every loading error says where it is and what is wrong the same way.
//!
//! Strictness is the types' part (`#[serde(deny_unknown_fields)]`, internally tagged enums);
//! this module's part is the error: loading goes through `serde_path_to_error`, whose path
//! (`clients[1].verdict`, `.` for the whole document) the caller prints beside the message. The
//! YAML parser starts its own message with the same path, so printing both said it twice
//! (`transport: transport: unknown variant`); [`message`] is the parser's message without it.
//! [`YamlError::unknown_name`] reads an unknown key or value back out of it, with every valid
//! name, so a loader can name the nearest one.
//!
//! # Duplicate keys
//! A key given twice in one mapping, at any depth, is refused, naming the key, the mapping's path
//! and both lines ([`from_str`]). The parser alone refuses one only where the target is a struct
//! (`duplicate field`, one line) or a [`serde_yaml::Value`]; a map (`tools:`, `env:`) kept the
//! last entry and silently dropped the first. Keys compare by their scalar value (`1` and `"1"`
//! are one key, as they are once loaded into a string-keyed map); a key that is itself a
//! sequence or mapping is not compared. The parser applies no `<<` merge, so `<<` is an ordinary
//! key: two of them in one mapping are a duplicate like any other. [`from_value`] needs no check:
//! a [`serde_yaml::Value`] cannot hold a duplicate (loading one refuses it).

use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, Visitor};
use std::cell::RefCell;

/// Why a YAML document did not load: where, and what the parser said (its path said once).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{path}`: {message}")]
pub struct YamlError {
    /// Where in the document (`steps[2].expect.charges`; `.` for the document itself).
    pub path: String,
    /// What is wrong, without the path.
    pub message: String,
}

/// A key or value outside a closed set, read back from the parser's message (``unknown field
/// `restat`, expected one of `restart`, `kill` at line 3 column 5``), so a loader can say which
/// valid name is nearest ([`crate::text::nearest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// `key` (a field of a strict mapping) or `value` (a variant of a closed set of words).
    pub what: &'static str,
    /// The name as written.
    pub name: String,
    /// Every valid name, in the type's order.
    pub valid: Vec<String>,
    /// Where the parser saw it (`line 3 column 5`), when it said.
    pub location: Option<String>,
}

impl YamlError {
    /// The unknown key or value this error is about, if it is about one.
    pub fn unknown_name(&self) -> Option<UnknownName> {
        let (what, rest) = if let Some(rest) = self.message.strip_prefix("unknown field `") {
            ("key", rest)
        } else {
            ("value", self.message.strip_prefix("unknown variant `")?)
        };
        let (name, rest) = rest.split_once("`, ")?;
        let (expected, location) = match rest.rsplit_once(" at line ") {
            Some((expected, at)) => (expected, Some(format!("line {at}"))),
            None => (rest, None),
        };
        // `expected one of `a`, `b``, `expected `a` or `b``, `expected `a``, or `there are no
        // fields`: the valid names are the backticked words.
        let valid = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        Some(UnknownName {
            what,
            name: name.to_owned(),
            valid,
            location,
        })
    }
}

/// Loads a `T` from YAML text; a key given twice in one mapping is refused (see the module doc).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    if let Some(duplicate) = duplicate_key(text) {
        return Err(duplicate);
    }
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
        .map_err(|e| error(&e))
}

/// Loads a `T` from a YAML value already parsed (a part of a larger document); the path is
/// relative to that value.
pub fn from_value<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, YamlError> {
    serde_path_to_error::deserialize(value).map_err(|e| error(&e))
}

/// The first key of `text` (in document order of its second appearance) given twice in one
/// mapping, as the error to report; `None` when there is none or the text does not parse (the
/// load that follows reports that). Two walks of the parser's events, the second only when the
/// first found one: a walk stops at the key it looks for with an error, which the parser marks
/// with that key's line.
fn duplicate_key(text: &str) -> Option<YamlError> {
    let again = walk(text, Hunt::Again);
    let found = again.found?;
    let first = walk(
        text,
        Hunt::First {
            mapping: found.mapping,
            key: found.key.clone(),
        },
    );
    let line = |line: Option<usize>| line.map_or_else(|| "?".to_string(), |l| l.to_string());
    Some(YamlError {
        path: if found.path.is_empty() {
            ".".into()
        } else {
            found.path
        },
        message: format!(
            "duplicate key `{}`, first on line {} and again on line {}; a key may appear once: \
             merge the two entries",
            found.key,
            line(first.line),
            line(again.line)
        ),
    })
}

/// What a walk stops at.
enum Hunt {
    /// The first key seen a second time in its mapping.
    Again,
    /// The first appearance of `key` in the `mapping`-th mapping (in document order).
    First { mapping: usize, key: String },
}

/// A key found twice: its mapping's path and document-order number.
struct Found {
    path: String,
    mapping: usize,
    key: String,
}

/// What a walk saw.
struct Walked {
    found: Option<Found>,
    /// The line of the key the walk stopped at (1-based).
    line: Option<usize>,
}

struct WalkState {
    hunt: Hunt,
    mappings: usize,
    found: Option<Found>,
}

fn walk(text: &str, hunt: Hunt) -> Walked {
    let state = RefCell::new(WalkState {
        hunt,
        mappings: 0,
        found: None,
    });
    let result = Node {
        state: &state,
        path: String::new(),
    }
    .deserialize(serde_yaml::Deserializer::from_str(text));
    let line = result.err().and_then(|e| e.location()).map(|l| l.line());
    let state = state.into_inner();
    let stopped = state.found.is_some() || matches!(state.hunt, Hunt::First { .. });
    Walked {
        found: state.found,
        line: line.filter(|_| stopped),
    }
}

/// A walk's stop: an error the parser marks with the current key's line.
const STOP: &str = "callid: duplicate key";

/// A value at `path` (`""` for the document).
struct Node<'s> {
    state: &'s RefCell<WalkState>,
    path: String,
}

impl Node<'_> {
    fn child(&self, step: &str) -> Node<'_> {
        let path = match (self.path.is_empty(), step.starts_with('[')) {
            (true, _) | (false, true) => format!("{}{step}", self.path),
            (false, false) => format!("{}.{step}", self.path),
        };
        Node {
            state: self.state,
            path,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_i128<E>(self, _: i128) -> Result<(), E> {
        Ok(())
    }

    fn visit_u128<E>(self, _: u128) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        while seq
            .next_element_seed(self.child(&format!("[{index}]")))?
            .is_some()
        {
            index += 1;
        }
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mapping = {
            let mut state = self.state.borrow_mut();
            state.mappings += 1;
            state.mappings - 1
        };
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key_seed(Key {
            node: &self,
            mapping,
            seen: &mut seen,
        })? {
            let step = key.unwrap_or_else(|| "?".into());
            map.next_value_seed(self.child(&step))?;
        }
        Ok(())
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use serde::de::VariantAccess as _;
        let (IgnoredAny, variant) = data.variant()?;
        variant.newtype_variant_seed(self)
    }
}

/// A key of the `mapping`-th mapping, at `node`: its text, or `None` for a sequence or mapping
/// used as a key (walked, not compared).
struct Key<'n, 's> {
    node: &'n Node<'s>,
    mapping: usize,
    seen: &'n mut std::collections::HashSet<String>,
}

impl Key<'_, '_> {
    fn scalar<E: serde::de::Error>(self, text: String) -> Result<Option<String>, E> {
        let mut state = self.node.state.borrow_mut();
        let stop = match &state.hunt {
            Hunt::Again => self.seen.contains(&text),
            Hunt::First { mapping, key } => *mapping == self.mapping && *key == text,
        };
        if stop {
            if matches!(state.hunt, Hunt::Again) {
                state.found = Some(Found {
                    path: self.node.path.clone(),
                    mapping: self.mapping,
                    key: text,
                });
            }
            return Err(E::custom(STOP));
        }
        self.seen.insert(text.clone());
        Ok(Some(text))
    }
}

impl<'de> DeserializeSeed<'de> for Key<'_, '_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Option<String>, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_, '_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Option<String>, E> {
        self.scalar(v.to_string())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Option<String>, E> {
        self.scalar(v.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Option<String>, E> {
        self.scalar(v.to_string())
    }

    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Option<String>, E> {
        self.scalar(v.to_string())
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Option<String>, E> {
        self.scalar(v.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Option<String>, E> {
        self.scalar(v.to_string())
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Option<String>, E> {
        self.scalar(v.to_string())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Option<String>, E> {
        self.scalar("null".into())
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Option<String>, E> {
        self.scalar("null".into())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Option<String>, A::Error> {
        self.node.child("?").visit_seq(seq).map(|()| None)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Option<String>, A::Error> {
        self.node.child("?").visit_map(map).map(|()| None)
    }
}

fn error(err: &serde_path_to_error::Error<serde_yaml::Error>) -> YamlError {
    let path = err.path().to_string();
    YamlError {
        path: if path.is_empty() { ".".into() } else { path },
        message: message(err),
    }
}

/// The parser's message for `err`, without the path it starts with when that path is the
/// error's path or a parent of it (the caller prints `err.path()` itself).
pub fn message(err: &serde_path_to_error::Error<serde_yaml::Error>) -> String {
    let text = err.inner().to_string();
    let path = err.path().to_string();
    // The parser's own path is the caller's or a parent of it (`steps[0]` for an unknown field
    // at `steps[0].extra`).
    match text.split_once(": ") {
        Some((own, rest)) if !own.contains(char::is_whitespace) && path.starts_with(own) => {
            rest.to_owned()
        }
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        transport: Transport,
        steps: Vec<Step>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Transport {
        Stdio,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Step {
        charges: u32,
    }

    fn error(text: &str) -> (String, String) {
        let de = serde_yaml::Deserializer::from_str(text);
        let err = serde_path_to_error::deserialize::<_, Doc>(de).unwrap_err();
        (err.path().to_string(), super::message(&err))
    }

    #[test]
    fn from_str_and_from_value_say_where_and_what() {
        let err = super::from_str::<Doc>("transport: stdio\nsteps:\n- charges: x\n").unwrap_err();
        assert_eq!(err.path, "steps[0].charges");
        assert!(
            err.message.starts_with("invalid type: string \"x\""),
            "{err}"
        );
        let err = super::from_str::<Doc>("- 1\n").unwrap_err();
        assert_eq!(err.path, ".");
        assert!(err.message.starts_with("invalid type: sequence"), "{err}");
        let err = super::from_str::<Doc>("transport: stdio\nsteps: [\n").unwrap_err();
        assert!(
            err.message.contains("line"),
            "a syntax error says where: {err}"
        );
        let value: serde_yaml::Value = super::from_str("- charges: 1\n  extra: 2\n").unwrap();
        let err = super::from_value::<Vec<Step>>(value).unwrap_err();
        assert_eq!(err.path, "[0].extra");
        assert!(err.message.starts_with("unknown field `extra`"), "{err}");
        assert_eq!(err.to_string(), format!("at `[0].extra`: {}", err.message));
        let ok: Doc = super::from_str("transport: stdio\nsteps: [{charges: 2}]\n").unwrap();
        assert_eq!(ok.steps[0].charges, 2);
    }

    #[test]
    fn a_key_given_twice_is_refused_at_any_depth_naming_both_lines() {
        let dup = |text: &str| super::from_str::<serde_yaml::Value>(text).unwrap_err();
        let table = [
            // The top level.
            ("a: 1\nb: 2\na: 3\n", ".", "a", 1, 3),
            // A nested map (what a struct field of map type reads).
            (
                "tools:\n  pay:\n    price: 5\n  free: {}\n  pay:\n    price: 1\n",
                "tools",
                "pay",
                2,
                5,
            ),
            // In a list item, in flow style, and a quoted spelling of the same key.
            (
                "steps:\n- x: 1\n- {y: 1,\n   y: 2}\n",
                "steps[1]",
                "y",
                3,
                4,
            ),
            ("env:\n  \"A\": 1\n  A: 2\n", "env", "A", 2, 3),
            ("ports:\n  1: a\n  '1': b\n", "ports", "1", 2, 3),
            // `<<` is a plain key to this parser: two merges in one mapping are two of it.
            (
                "base: &b {x: 1}\nmore: &m {y: 1}\nitem:\n  <<: *b\n  <<: *m\n",
                "item",
                "<<",
                4,
                5,
            ),
            // Inside an anchored mapping, and the second of two duplicates in document order is
            // not the one reported.
            ("a: &x\n  k: 1\n  k: 2\nb: 1\nb: 2\n", "a", "k", 2, 3),
        ];
        for (text, path, key, first, again) in table {
            let err = dup(text);
            assert_eq!(
                (err.path.as_str(), err.message.as_str()),
                (
                    path,
                    format!(
                        "duplicate key `{key}`, first on line {first} and again on line {again}; \
                         a key may appear once: merge the two entries"
                    )
                    .as_str()
                ),
                "{text}"
            );
        }
        // The same key in two mappings, or as a value, is no duplicate; syntax errors stay the
        // parser's.
        let ok: serde_yaml::Value =
            super::from_str("a: {k: 1}\nb: {k: 1}\nc: [k, k]\nd: k\n").unwrap();
        assert_eq!(ok["b"]["k"], serde_yaml::Value::from(1));
        let err = super::from_str::<serde_yaml::Value>("a: 1\nb: [\n").unwrap_err();
        assert!(
            !err.message.contains("duplicate") && err.message.contains("line"),
            "{err}"
        );
    }

    #[test]
    fn a_duplicate_that_a_map_would_swallow_is_refused_before_the_types_see_it() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Policy {
            tools: std::collections::BTreeMap<String, u32>,
        }
        let text = "tools:\n  pay: 1\n  pay: 2\n";
        let last_wins: Policy = serde_yaml::from_str(text).unwrap();
        assert_eq!(last_wins.tools["pay"], 2, "the parser alone keeps the last");
        let err = super::from_str::<Policy>(text).unwrap_err();
        assert_eq!(err.path, "tools");
        assert!(
            err.message
                .starts_with("duplicate key `pay`, first on line 2 and again on line 3"),
            "{err}"
        );
        let err = super::from_str::<Policy>("tools: {}\ntools: {}\n").unwrap_err();
        assert_eq!(err.path, ".");
        assert!(
            err.message
                .starts_with("duplicate key `tools`, first on line 1 and again on line 2"),
            "{err}"
        );
    }

    #[test]
    fn the_path_is_said_once() {
        let (path, message) = error("transport: carrier-pigeon\nsteps: []\n");
        assert_eq!(path, "transport");
        assert!(
            message.starts_with("unknown variant `carrier-pigeon`, expected `stdio`"),
            "{message}"
        );
        let (path, message) = error("transport: stdio\nsteps:\n- charges: 1\n  extra: 2\n");
        assert_eq!(path, "steps[0].extra");
        assert!(
            message.starts_with("unknown field `extra`, expected `charges`"),
            "{message}"
        );
        let (path, message) = error("transport: stdio\nsteps:\n- charges: -1\n");
        assert_eq!(path, "steps[0].charges");
        assert!(
            message.starts_with("invalid type: integer `-1`"),
            "{message}"
        );
    }

    #[test]
    fn an_unknown_key_or_value_is_read_back_with_every_valid_name() {
        let err = super::from_str::<Doc>("transport: stdio\nsteps:\n- charges: 1\n  chargs: 2\n")
            .unwrap_err();
        let unknown = err.unknown_name().unwrap();
        assert_eq!(unknown.what, "key");
        assert_eq!(unknown.name, "chargs");
        assert_eq!(unknown.valid, ["charges"]);
        assert_eq!(unknown.location.as_deref(), Some("line 4 column 3"));
        let err = super::from_str::<Doc>("transport: carrier-pigeon\nsteps: []\n").unwrap_err();
        let unknown = err.unknown_name().unwrap();
        assert_eq!(unknown.what, "value");
        assert_eq!(unknown.name, "carrier-pigeon");
        assert_eq!(unknown.valid, ["stdio"]);
        let err = super::from_str::<Doc>("transport: stdio\nsteps: []\nextra: 1\n").unwrap_err();
        assert_eq!(err.unknown_name().unwrap().valid, ["transport", "steps"]);
        let err = super::from_str::<Doc>("transport: stdio\nsteps:\n- charges: x\n").unwrap_err();
        assert_eq!(err.unknown_name(), None);
    }
}
