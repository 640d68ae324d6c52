//! Scrubbing: no private operation key leaves the router in any response.
//!
//! [`Scrubber::scrub`] walks a JSON value recursively (object keys and values, array items,
//! strings) and rewrites every string that contains a private key: the exact keys it was given,
//! and anything that starts with the configured key prefix (so a key of another operation that
//! some layer echoed is caught too). The router passes every reply through it: results, errors,
//! `_meta`, status answers.
//!
//! # Guarantee
//! After [`Scrubber::scrub`], no string in the value contains any of the given keys or the key
//! prefix. Public handles use a different prefix and are kept.

use crate::keys::OperationKey;
use serde_json::Value;

/// What a private key is replaced with.
pub const REDACTED: &str = "[redacted-operation-key]";

/// Rewrites private keys out of JSON values.
#[derive(Debug, Clone)]
pub struct Scrubber {
    prefix: String,
}

impl Scrubber {
    /// A scrubber for keys that start with `prefix` (e.g. `hubu:operation:v1:`).
    pub fn new(prefix: &str) -> Self {
        Scrubber {
            prefix: prefix.to_string(),
        }
    }

    /// Scrubs `value` in place of `keys` and of anything that starts with the key prefix;
    /// returns how many strings were rewritten.
    pub fn scrub(&self, value: &mut Value, keys: &[&OperationKey]) -> usize {
        match value {
            Value::String(s) => usize::from(self.scrub_string(s, keys)),
            Value::Array(items) => items.iter_mut().map(|v| self.scrub(v, keys)).sum(),
            Value::Object(map) => {
                let mut count = 0;
                let dirty: Vec<String> = map
                    .keys()
                    .filter(|k| self.contains_key(k, keys))
                    .cloned()
                    .collect();
                for k in dirty {
                    let v = map.remove(&k).expect("key listed above");
                    let mut clean = k;
                    self.scrub_string(&mut clean, keys);
                    map.insert(clean, v);
                    count += 1;
                }
                count + map.values_mut().map(|v| self.scrub(v, keys)).sum::<usize>()
            }
            _ => 0,
        }
    }

    fn contains_key(&self, s: &str, keys: &[&OperationKey]) -> bool {
        // A string shorter than what is searched for cannot hold it: most of a reply's strings
        // (statuses, codes, handles) are, and skipping them saves building a searcher each.
        let holds =
            |needle: &str| !needle.is_empty() && s.len() >= needle.len() && s.contains(needle);
        holds(&self.prefix) || keys.iter().any(|k| holds(k.expose()))
    }

    /// Rewrites one string; returns whether it changed.
    pub fn scrub_string(&self, s: &mut String, keys: &[&OperationKey]) -> bool {
        if !self.contains_key(s, keys) {
            return false;
        }
        let mut out = s.clone();
        for k in keys {
            if !k.expose().is_empty() {
                out = out.replace(k.expose(), REDACTED);
            }
        }
        if !self.prefix.is_empty() {
            // A key is the prefix followed by its platform and UUID: `[A-Za-z0-9._:-]*`.
            while let Some(start) = out.find(&self.prefix) {
                let tail = &out[start + self.prefix.len()..];
                let len = tail
                    .find(|c: char| {
                        !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
                    })
                    .unwrap_or(tail.len());
                out.replace_range(start..start + self.prefix.len() + len, REDACTED);
            }
        }
        *s = out;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::DEFAULT_KEY_PREFIX;
    use serde_json::json;

    #[test]
    fn scrubs_every_place_a_key_can_hide() {
        let key = OperationKey::generate(DEFAULT_KEY_PREFIX, "codex");
        let other = OperationKey::from_stored("custom-secret-77".into());
        let k = key.expose();
        let mut v = json!({
            "text": format!("failed for {k}."),
            "nested": [{"deep": [k, "ok"]}, {"x": format!("a {} b", other.expose())}],
            k: "key as a member name",
            "foreign": "hubu:operation:v1:claude-code:1234-abcd in another message",
            "handle": "hubu:public-operation:v1:5a7e",
            "n": 3
        });
        let n = Scrubber::new(DEFAULT_KEY_PREFIX).scrub(&mut v, &[&key, &other]);
        assert_eq!(n, 5);
        let text = v.to_string();
        assert!(!text.contains(DEFAULT_KEY_PREFIX), "{text}");
        assert!(!text.contains("custom-secret-77"), "{text}");
        assert!(text.contains("hubu:public-operation:v1:5a7e"));
        assert_eq!(v["text"], json!(format!("failed for {REDACTED}.")));
        assert_eq!(
            v["foreign"],
            json!(format!("{REDACTED} in another message"))
        );
    }
}
