//! A policy file (`--policy FILE`): reading one, and why one cannot be used ([`PolicyError`]).
//!
//! What a policy says is each user's own: the router's is when a person must approve an image
//! and the budget ([`crate::router::policy`]), the gateway's which tools spend and what each
//! costs ([`crate::gateway::policy`]). Both files are read here, so both fail with the same
//! messages: a file that cannot be read, and a document that is not a policy, named by the
//! path of the field at fault (strict YAML, unknown fields refused, [`crate::yaml`]). An empty
//! file is the default policy.

use serde::de::DeserializeOwned;
use std::path::Path;

/// Why a policy file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file cannot be read.
    #[error("cannot read policy file `{path}`")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid policy.
    #[error("policy file `{path}` is invalid at `{at}`: {message}")]
    Parse {
        /// The file.
        path: String,
        /// Where in the document.
        at: String,
        /// What is wrong.
        message: String,
    },
}

impl PolicyError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        match self {
            PolicyError::Read { .. } => "policy_unreadable",
            PolicyError::Parse { .. } => "policy_invalid",
        }
    }
}

/// Reads the YAML policy file at `path`.
pub fn load<T: DeserializeOwned + Default>(path: &Path) -> Result<T, PolicyError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
        path: origin.clone(),
        source,
    })?;
    parse(&text, &origin)
}

/// Parses a YAML policy document (`origin` names it in errors); an empty one is the default.
pub fn parse<T: DeserializeOwned + Default>(text: &str, origin: &str) -> Result<T, PolicyError> {
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    crate::yaml::from_str(text).map_err(|e| PolicyError::Parse {
        path: origin.to_string(),
        at: e.path,
        message: e.message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Limits {
        #[serde(default)]
        budget_cents: Option<u64>,
    }

    #[test]
    fn a_policy_file_is_read_or_refused_by_path_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, "budget_cents: 5\n").unwrap();
        assert_eq!(
            load::<Limits>(&file).unwrap(),
            Limits {
                budget_cents: Some(5)
            }
        );
        std::fs::write(&file, "  \n").unwrap();
        assert_eq!(load::<Limits>(&file).unwrap(), Limits::default());
        let missing = dir.path().join("none.yaml");
        let err = load::<Limits>(&missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("cannot read policy file `{}`", missing.display())
        );
        assert_eq!(err.code(), "policy_unreadable");
        let err = parse::<Limits>("budget: 3\n", "p.yaml").unwrap_err();
        assert_eq!(err.code(), "policy_invalid");
        assert_eq!(
            err.to_string(),
            "policy file `p.yaml` is invalid at `budget`: unknown field `budget`, expected \
             `budget_cents`"
        );
    }

    /// Every variant, with its code, as a person reads it.
    #[test]
    fn every_policy_error_has_a_code_and_a_message() {
        let all = [
            PolicyError::Read {
                path: "policy.yaml".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
            PolicyError::Parse {
                path: "policy.yaml".into(),
                at: "tools.x".into(),
                message: "give `price_cents` or `price_pointer`, not both".into(),
            },
        ];
        let text: Vec<String> = all
            .iter()
            .map(|e| format!("{}: {}", e.code(), crate::error_chain::format(e)))
            .collect();
        insta::assert_snapshot!("policy_errors", text.join("\n"));
    }
}
