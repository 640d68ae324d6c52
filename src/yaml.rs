//! Strict YAML input: the parser's message for an error found at a path.
//!
//! Scenario, profile, policy and matrix files are loaded through `serde_path_to_error`, whose
//! path (`clients[1].verdict`) the caller prints beside the message. The YAML parser starts its
//! own message with the same path, so printing both said it twice (`transport: transport: unknown
//! variant`); [`message`] is the parser's message without it.

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
    #[allow(dead_code)]
    struct Step {
        charges: u32,
    }

    fn error(text: &str) -> (String, String) {
        let de = serde_yaml::Deserializer::from_str(text);
        let err = serde_path_to_error::deserialize::<_, Doc>(de).unwrap_err();
        (err.path().to_string(), super::message(&err))
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
}
