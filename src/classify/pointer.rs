//! The `_meta` key a JSON pointer of a record names, and the pointer of a key: what
//! [`super::analysis`] and [`super::kinds`] both report a value under. A key is escaped as one
//! RFC 6901 reference token by the one rule of [`crate::canonical::push_pointer_token`].

/// The key of the top-level `_meta` pointer `path` (`/callid~1id` is `callid/id`).
pub(crate) fn pointer_key(path: &str) -> String {
    path.trim_start_matches('/')
        .replace("~1", "/")
        .replace("~0", "~")
}

/// The top-level `_meta` pointer of `key` (`callid/id` is `/callid~1id`): [`pointer_key`]'s
/// inverse.
pub(crate) fn key_pointer(key: &str) -> String {
    let mut path = String::with_capacity(key.len() + 1);
    path.push('/');
    crate::canonical::push_pointer_token(&mut path, key);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_and_its_pointer_convert_both_ways() {
        for (key, pointer) in [
            ("callId", "/callId"),
            ("callid/id", "/callid~1id"),
            ("a~b", "/a~0b"),
            ("~1", "/~01"),
            ("/~/", "/~1~0~1"),
            ("", "/"),
        ] {
            assert_eq!(key_pointer(key), pointer, "{key}");
            assert_eq!(pointer_key(pointer), key, "{pointer}");
        }
    }
}
