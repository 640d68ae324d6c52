//! Placeholder expansion: the `{name}` tokens of a profile, the names a field may use, and
//! [`Vars`], the values one scenario fills them with.

use super::shell::shell_quote;

/// The `args` element that expands into the stdio upstream's words.
pub const UPSTREAM_ARGV: &str = "{upstream_argv}";

/// The placeholders a profile may use, for error messages.
pub const PLACEHOLDERS: &[&str] = &[
    "callid",
    "state_dir",
    "registry",
    "provider_url",
    "port",
    "profile_dir",
    "handle",
    "upstream_url",
    "upstream_command",
    "upstream_argv",
    "check_slug",
    "env:NAME",
];

/// The placeholders known in a field: every one but `{handle}`, which only an operator command
/// knows.
pub(super) fn known_placeholders(operator: bool) -> Vec<&'static str> {
    PLACEHOLDERS
        .iter()
        .copied()
        .filter(|p| operator || *p != "handle")
        .collect()
}

/// Whether `name` can name an environment variable (`{env:NAME}`): a letter or `_`, then
/// letters, digits and `_`.
pub(super) fn is_env_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The `{name}` tokens of `text` (a name of letters, digits and `_`, or `env:` and one).
pub(super) fn placeholders_in(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end)
                if end > 0
                    && after[..end]
                        .strip_prefix("env:")
                        .unwrap_or(&after[..end])
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                found.push(&after[..end]);
                rest = &after[end + 1..];
            }
            _ => rest = after,
        }
    }
    found
}

/// Values of the placeholders for one scenario.
#[derive(Debug, Clone, Default)]
pub struct Vars {
    /// `{callid}`.
    pub callid: String,
    /// `{state_dir}`.
    pub state_dir: String,
    /// `{registry}`.
    pub registry: String,
    /// `{provider_url}`.
    pub provider_url: String,
    /// `{port}`.
    pub port: String,
    /// `{profile_dir}`.
    pub profile_dir: String,
    /// `{handle}`.
    pub handle: String,
    /// `{outcome}` (the `resolve` command only): `charged` or `not-charged`.
    pub outcome: String,
    /// `{check_slug}`.
    pub check_slug: String,
    /// `{trust_keys}` (the checks that sign envelopes only).
    pub trust_keys: String,
    /// `{signing_public_key}` (the checks that sign envelopes only).
    pub signing_public_key: String,
    /// `{upstream_url}`.
    pub upstream_url: String,
    /// `{upstream_argv}`: the stdio upstream's program and arguments (`{upstream_command}` is
    /// them quoted into one line).
    pub upstream_argv: Vec<String>,
}

impl Vars {
    /// `{upstream_command}`: [`Vars::upstream_argv`] as one POSIX shell line.
    pub fn upstream_command(&self) -> String {
        self.upstream_argv
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The router's arguments: every placeholder replaced, and an element exactly
    /// `{upstream_argv}` replaced by the stdio upstream's words.
    pub fn apply_args(&self, args: &[String]) -> Vec<String> {
        let mut out = Vec::with_capacity(args.len());
        for a in args {
            if a == UPSTREAM_ARGV {
                out.extend(self.upstream_argv.iter().cloned());
            } else {
                out.push(self.apply(a));
            }
        }
        out
    }

    /// Replaces every known placeholder in `text`.
    pub fn apply(&self, text: &str) -> String {
        let mut text = text
            .replace("{upstream_url}", &self.upstream_url)
            .replace("{upstream_command}", &self.upstream_command())
            .replace("{callid}", &self.callid)
            .replace("{state_dir}", &self.state_dir)
            .replace("{registry}", &self.registry)
            .replace("{provider_url}", &self.provider_url)
            .replace("{port}", &self.port)
            .replace("{profile_dir}", &self.profile_dir)
            .replace("{handle}", &self.handle)
            .replace("{outcome}", &self.outcome)
            .replace("{check_slug}", &self.check_slug)
            .replace("{trust_keys}", &self.trust_keys)
            .replace("{signing_public_key}", &self.signing_public_key);
        for name in placeholders_in(&text.clone()) {
            if let Some(var) = name.strip_prefix("env:") {
                text = text.replace(
                    &format!("{{{name}}}"),
                    &std::env::var(var).unwrap_or_default(),
                );
            }
        }
        text
    }
}
