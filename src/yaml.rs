//! Strict YAML input: the parser's message for an error found at a path.
//!
//! Scenario, profile, policy and matrix files are loaded through `serde_path_to_error`, whose
//! path (`clients[1].verdict`) the caller prints beside the message. The YAML parser starts its
//! own message with the same path, so printing both said it twice (`transport: transport: unknown
//! variant`); [`message`] is the parser's message without it.

/// The parser's message for `err`, without the path it starts with (the caller prints
/// `err.path()` itself).
pub fn message(err: &serde_path_to_error::Error<serde_yaml::Error>) -> String {
    let text = err.inner().to_string();
    let path = err.path().to_string();
    match text.strip_prefix(&format!("{path}: ")) {
        Some(rest) => rest.to_owned(),
        None => text,
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
        let (path, message) = error("transport: stdio\nsteps:\n- charges: -1\n");
        assert_eq!(path, "steps[0].charges");
        assert!(!message.contains("steps[0]"), "{message}");
        assert!(
            message.starts_with("invalid value: integer `-1`"),
            "{message}"
        );
    }
}
