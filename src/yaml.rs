//! Strict YAML input: every YAML file callid reads (scenarios, target profiles, router and
//! gateway policies, identity source tables, the support matrix) is loaded by [`from_str`] or
//! [`from_value`], so every loading error says where it is and what is wrong the same way.
//!
//! Strictness is the types' part (`#[serde(deny_unknown_fields)]`, internally tagged enums);
//! this module's part is the error: loading goes through `serde_path_to_error`, whose path
//! (`clients[1].verdict`, `.` for the whole document) the caller prints beside the message. The
//! YAML parser starts its own message with the same path, so printing both said it twice
//! (`transport: transport: unknown variant`); [`message`] is the parser's message without it.

use serde::de::DeserializeOwned;

/// Why a YAML document did not load: where, and what the parser said (its path said once).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{path}`: {message}")]
pub struct YamlError {
    /// Where in the document (`steps[2].expect.charges`; `.` for the document itself).
    pub path: String,
    /// What is wrong, without the path.
    pub message: String,
}

/// Loads a `T` from YAML text.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
        .map_err(|e| error(&e))
}

/// Loads a `T` from a YAML value already parsed (a part of a larger document); the path is
/// relative to that value.
pub fn from_value<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, YamlError> {
    serde_path_to_error::deserialize(value).map_err(|e| error(&e))
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
