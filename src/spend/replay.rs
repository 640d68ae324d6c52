//! Recent completed replies, ready to send again: the pipeline's replay cache.
//!
//! A completed operation's reply never changes (its result is recorded once and is immutable),
//! so the pipeline keeps the reply of recently completed operations as it would send it on a
//! redelivery: rendered, marked replayed and scrubbed of private keys once, when it was recorded
//! (or first replayed from the registry). A redelivery that hits the cache still passes every
//! per-delivery check of the article (identity read from `_meta`, identity-like argument names
//! refused, the request hash computed and compared with the recorded one); only the registry
//! look-up, the rendering and the scrubbing are skipped. A hash that differs is never answered
//! from here: it goes to the registry, which refuses it (`request_mismatch`).
//!
//! # Guarantees
//! - Only a reply whose result is durably recorded is ever inserted (the pipeline inserts after
//!   the registry's commit returned), so a cached answer is always the durable record's answer.
//! - Memory is bounded: at most `max_entries` replies and `max_bytes` bytes of serialized reply
//!   JSON; the least recently used replies are evicted first. A reply larger than `max_bytes`
//!   alone is not cached. A cached reply is a typed `CallToolResult`, a few KiB of heap for a
//!   `generate_image` result: the default bounds keep the cache to a few MB, so the router stays
//!   within its resident-memory target (`callid bench --only router_rss`).
//! - Nothing invalidates an entry (results are immutable); eviction only costs the next
//!   redelivery a registry look-up.

use crate::canonical::RequestHash;
use rmcp::model::CallToolResult;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// How many replies the router keeps by default.
pub const DEFAULT_MAX_ENTRIES: usize = 256;
/// How many bytes of serialized replies the router keeps by default.
pub const DEFAULT_MAX_BYTES: usize = 1024 * 1024;

/// One cached reply: what it answers and the scrubbed `CallToolResult` to send.
#[derive(Debug)]
pub struct Cached {
    /// The recorded request hash; a redelivery must carry the same.
    pub request_hash: RequestHash,
    /// The reply, rendered as a replay and scrubbed.
    pub reply: CallToolResult,
    bytes: usize,
}

impl Cached {
    /// A reply to keep for `request_hash`.
    pub fn new(request_hash: RequestHash, reply: CallToolResult) -> Cached {
        let bytes =
            serde_json::to_string(&reply).map_or(0, |t| t.len()) + request_hash.as_str().len();
        Cached {
            request_hash,
            reply,
            bytes,
        }
    }
}

/// The key of a call identity: platform, key installation and harness call id, each
/// length-prefixed so that no two identities share a key.
pub fn key(platform: &str, installation: &str, call_id: &str) -> String {
    let mut k = String::with_capacity(platform.len() + installation.len() + call_id.len() + 24);
    for part in [platform, installation, call_id] {
        k.push_str(&part.len().to_string());
        k.push(':');
        k.push_str(part);
    }
    k
}

/// A bounded least-recently-used map from call identity to its completed reply.
#[derive(Debug)]
pub struct ReplayCache {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<String, (Arc<Cached>, u64)>,
    order: BTreeMap<u64, String>,
    clock: u64,
    bytes: usize,
}

impl ReplayCache {
    /// A cache of at most `max_entries` replies and `max_bytes` bytes.
    pub fn new(max_entries: usize, max_bytes: usize) -> ReplayCache {
        ReplayCache {
            max_entries,
            max_bytes,
            inner: Mutex::new(Lru::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reply cached for `key`, marked as just used.
    pub fn get(&self, key: &str) -> Option<Arc<Cached>> {
        let mut lru = self.lock();
        lru.clock += 1;
        let now = lru.clock;
        let (cached, old) = {
            let (cached, stamp) = lru.entries.get_mut(key)?;
            let old = std::mem::replace(stamp, now);
            (cached.clone(), old)
        };
        if let Some(k) = lru.order.remove(&old) {
            lru.order.insert(now, k);
        }
        Some(cached)
    }

    /// Keeps `cached` for `key` (replacing any older entry), then evicts the least recently used
    /// replies until the cache is within its bounds.
    pub fn insert(&self, key: String, cached: Arc<Cached>) {
        if cached.bytes > self.max_bytes || self.max_entries == 0 {
            return;
        }
        let mut lru = self.lock();
        lru.clock += 1;
        let now = lru.clock;
        lru.bytes += cached.bytes;
        if let Some((old, stamp)) = lru.entries.insert(key.clone(), (cached, now)) {
            lru.bytes -= old.bytes;
            lru.order.remove(&stamp);
        }
        lru.order.insert(now, key);
        while lru.entries.len() > self.max_entries || lru.bytes > self.max_bytes {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some((gone, _)) = lru.entries.remove(&oldest) {
                lru.bytes -= gone.bytes;
            }
        }
    }

    /// How many replies are cached.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Bytes of the cached replies (serialized JSON and hashes).
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl Default for ReplayCache {
    fn default() -> Self {
        ReplayCache::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cached(n: usize) -> Arc<Cached> {
        let args = json!({"n": n});
        Arc::new(Cached::new(
            crate::canonical::request_hash("t", &args).unwrap(),
            serde_json::from_value(json!({"structuredContent": {"n": n, "pad": "x".repeat(100)}}))
                .unwrap(),
        ))
    }

    #[test]
    fn keys_of_distinct_identities_never_collide() {
        assert_ne!(key("a:1", "", "x"), key("a", ":1", "x"));
        assert_ne!(key("a", "b", "c"), key("ab", "", "c"));
        assert_eq!(key("codex", "", "call_1"), key("codex", "", "call_1"));
    }

    #[test]
    fn stays_within_its_entry_bound_and_evicts_the_least_recently_used() {
        let cache = ReplayCache::new(3, usize::MAX);
        for n in 0..3 {
            cache.insert(n.to_string(), cached(n));
        }
        // Touch 0: 1 is now the least recently used.
        assert!(cache.get("0").is_some());
        cache.insert("3".into(), cached(3));
        assert_eq!(cache.len(), 3);
        assert!(cache.get("1").is_none());
        for k in ["0", "2", "3"] {
            assert!(cache.get(k).is_some(), "{k}");
        }
        for n in 4..1000 {
            cache.insert(n.to_string(), cached(n));
            assert!(cache.len() <= 3);
        }
        assert_eq!(
            cache
                .get("999")
                .unwrap()
                .reply
                .structured_content
                .as_ref()
                .unwrap()["n"],
            999
        );
    }

    #[test]
    fn stays_within_its_byte_bound_and_skips_oversized_replies() {
        let one = cached(0).bytes;
        let cache = ReplayCache::new(usize::MAX, one * 5 + one / 2);
        for n in 0..100 {
            cache.insert(n.to_string(), cached(n));
            assert!(cache.bytes() <= one * 5 + one / 2);
        }
        assert_eq!(cache.len(), 5);
        let tiny = ReplayCache::new(10, one - 1);
        tiny.insert("a".into(), cached(1));
        assert_eq!(tiny.len(), 0);
        assert_eq!(tiny.bytes(), 0);
        // Replacing an entry counts its bytes once.
        let cache = ReplayCache::new(10, usize::MAX);
        cache.insert("a".into(), cached(1));
        cache.insert("a".into(), cached(1));
        assert_eq!((cache.len(), cache.bytes()), (1, one));
    }
}
