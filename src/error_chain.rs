//! The one way an error and its causes become text for a person.
//!
//! `anyhow`'s `{:#}` joins every `source()` with `: `; an error type that writes its cause into
//! its own message *and* returns it from `source()` then says the cause twice
//! (`...(os error 2): ...(os error 2)`). Error types here do one or the other; [`format()`] also
//! refuses to repeat a cause whose text is already said, so an error from a dependency that does
//! both still reads once.

/// `err` and its causes joined by `: `, each said once: a cause whose text is already part of the
/// text before it is skipped.
pub fn format(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::format;

    #[derive(Debug, thiserror::Error)]
    #[error("failed to read `x`")]
    struct Sourced(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("failed to read `x`: {0}")]
    struct Both(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("loading the profile")]
    struct Outer(#[source] Both);

    fn missing() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::NotFound)
    }

    #[test]
    fn each_cause_once() {
        assert_eq!(
            format(&Sourced(missing())),
            "failed to read `x`: entity not found"
        );
        assert_eq!(
            format(&Both(missing())),
            "failed to read `x`: entity not found"
        );
        assert_eq!(
            format(&Outer(Both(missing()))),
            "loading the profile: failed to read `x`: entity not found"
        );
        let anyhow_err = anyhow::Error::new(Sourced(missing())).context("running `classify`");
        assert_eq!(
            format(anyhow_err.as_ref()),
            "running `classify`: failed to read `x`: entity not found"
        );
    }
}
