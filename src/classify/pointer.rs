//! The `_meta` key a JSON pointer of a record names: what [`super::analysis`] and
//! [`super::kinds`] both report a value under.

/// The key of the top-level `_meta` pointer `path` (`/callid~1id` is `callid/id`).
pub(crate) fn pointer_key(path: &str) -> String {
    path.trim_start_matches('/')
        .replace("~1", "/")
        .replace("~0", "~")
}
