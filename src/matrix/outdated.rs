//! Stale rows: asks each measured client's package registry for its latest version and lists
//! the rows measured on an older one ([`outdated`], `callid matrix outdated`).
//!
//! Each registry is asked through its own client, so the user's registry settings (a mirror, a
//! proxy, credentials) apply as they do for installing: npm through `npm view PKG version`, PyPI
//! through its JSON API (`https://pypi.org/pypi/PKG/json`, or `CALLID_PYPI_URL`) read by
//! `python3`, crates.io through `cargo info`.
//!
//! # Guarantees
//! - Read-only: nothing in the matrix directory is written.
//! - A registry that cannot be asked is never taken for "up to date": the command says which
//!   package it could not look up and why, and exits 2.
//! - Only measured rows whose command is `callid measure --client SLUG` are compared; the row's
//!   package comes from the client `SLUG` names ([`crate::measure::package_of`]).

use super::data::{ClientRow, How};
use std::cmp::Ordering;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Where `CALLID_PYPI_URL` points when unset: PyPI's JSON API.
pub const PYPI_URL: &str = "https://pypi.org/pypi";

/// How long one registry question may take before it counts as unreachable.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// A package registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    /// The npm registry, asked with `npm view`.
    Npm,
    /// PyPI, asked through its JSON API.
    PyPi,
    /// crates.io, asked with `cargo info`.
    CratesIo,
}

impl Registry {
    /// The registry's name as people say it.
    pub fn name(self) -> &'static str {
        match self {
            Registry::Npm => "npm",
            Registry::PyPi => "PyPI",
            Registry::CratesIo => "crates.io",
        }
    }
}

/// A client's package: which registry, and its name there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Package {
    /// The registry.
    pub registry: Registry,
    /// The package name.
    pub name: &'static str,
}

/// Why a registry could not say a package's latest version.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to ask {} for the latest version of `{}`: {detail}; check the network connection \
     (and the registry settings of `{}`), then run `callid matrix outdated` again",
    .package.registry.name(), .package.name, .tool
)]
pub struct RegistryError {
    /// The package asked about.
    pub package: Package,
    /// The program that asked (`npm`, `python3`, `cargo`).
    pub tool: &'static str,
    /// What went wrong, in the tool's words.
    pub detail: String,
}

impl RegistryError {
    /// Stable machine code.
    pub fn code(&self) -> &'static str {
        "registry_unreachable"
    }
}

/// One measured row compared with its registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compared {
    /// The row id.
    pub row: String,
    /// The client's name.
    pub client: String,
    /// The `--client` value that measures it again.
    pub slug: String,
    /// The package.
    pub package: Package,
    /// The version the row was measured on.
    pub measured: String,
    /// The registry's latest version.
    pub latest: String,
}

impl Compared {
    /// Whether the row was measured on an older version than the latest.
    pub fn is_stale(&self) -> bool {
        compare_versions(&self.measured, &self.latest) == Ordering::Less
    }
}

/// Every measured row of `rows` that `package_of` knows, compared with the latest version
/// `latest` reports for its package. Stops at the first registry that cannot be asked.
pub fn outdated(
    rows: &[ClientRow],
    package_of: impl Fn(&str) -> Option<Package>,
    mut latest: impl FnMut(Package) -> Result<String, RegistryError>,
) -> Result<Vec<Compared>, RegistryError> {
    let mut out = Vec::new();
    for row in rows {
        let How::Measured { command, .. } = &row.how else {
            continue;
        };
        let Some(slug) = command.strip_prefix("callid measure --client ") else {
            continue;
        };
        let (Some(package), Some(measured)) = (package_of(slug), row.version.as_ref()) else {
            continue;
        };
        out.push(Compared {
            row: row.id.clone(),
            client: row.client.clone(),
            slug: slug.to_owned(),
            package,
            measured: measured.clone(),
            latest: latest(package)?,
        });
    }
    Ok(out)
}

/// Compares two dotted versions part by part, numbers as numbers (`7.10.0` > `7.8.1`); a
/// pre-release suffix (`1.0.0-rc.1`) sorts before the release.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let split = |v: &str| -> (Vec<u64>, bool) {
        let (core, pre) = match v.split_once(['-', '+']) {
            Some((core, rest)) => (core, !rest.is_empty() && v.contains('-')),
            None => (v, false),
        };
        (
            core.split('.')
                .map(|p| {
                    p.trim_start_matches('v')
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect::<String>()
                        .parse()
                        .unwrap_or(0)
                })
                .collect(),
            pre,
        )
    };
    let (a_core, a_pre) = split(a);
    let (b_core, b_pre) = split(b);
    let len = a_core.len().max(b_core.len());
    for i in 0..len {
        let (x, y) = (
            a_core.get(i).copied().unwrap_or(0),
            b_core.get(i).copied().unwrap_or(0),
        );
        if x != y {
            return x.cmp(&y);
        }
    }
    // Same release: a pre-release comes before it.
    b_pre.cmp(&a_pre)
}

/// Asks `package`'s registry for its latest version, through the registry's own client.
pub fn latest_version(package: Package) -> Result<String, RegistryError> {
    let fail = |tool: &'static str, detail: String| RegistryError {
        package,
        tool,
        detail,
    };
    let (tool, mut cmd) = match package.registry {
        Registry::Npm => {
            let mut cmd = Command::new("npm");
            cmd.args(["view", package.name, "version", "--fetch-retries=0"])
                .arg(format!("--fetch-timeout={}", QUERY_TIMEOUT.as_millis()));
            ("npm", cmd)
        }
        Registry::PyPi => {
            let base = std::env::var("CALLID_PYPI_URL").unwrap_or_else(|_| PYPI_URL.to_owned());
            let url = format!("{}/{}/json", base.trim_end_matches('/'), package.name);
            let mut cmd = Command::new("python3");
            cmd.args(["-c", PYPI_QUERY, &url, &QUERY_TIMEOUT.as_secs().to_string()]);
            ("python3", cmd)
        }
        Registry::CratesIo => {
            let mut cmd = Command::new("cargo");
            // Outside any workspace, so cargo reports the registry's version, not a lock file's.
            cmd.args(["info", package.name, "--quiet"])
                .current_dir(std::env::temp_dir());
            ("cargo", cmd)
        }
    };
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(tool, format!("`{tool}` could not be started ({e})")))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(fail(tool, tool_error(&stderr)));
    }
    let version = match package.registry {
        Registry::CratesIo => stdout
            .lines()
            .find_map(|l| l.strip_prefix("version: "))
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_owned),
        Registry::Npm | Registry::PyPi => stdout
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .map(str::to_owned),
    };
    version
        .filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .ok_or_else(|| {
            fail(
                tool,
                format!("no version in its answer {:?}", stdout.trim()),
            )
        })
}

/// The Python program that prints `info.version` of a PyPI JSON API document (argv: URL,
/// timeout in seconds).
const PYPI_QUERY: &str = r"import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as r:
    print(json.load(r)['info']['version'])";

/// The line of a registry client's error output that says what went wrong.
fn tool_error(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(|l| l.trim_start_matches("npm error").trim())
        .filter(|l| !l.is_empty() && !l.starts_with("at ") && !l.starts_with("A complete log"))
        .collect();
    lines
        .iter()
        .find(|l| l.contains("reason:") || l.contains("Not Found") || l.contains("Error:"))
        .or(lines.last())
        .map(|l| (*l).to_owned())
        .unwrap_or_else(|| "it failed without saying why".into())
}

/// The matrix's measured rows compared with their registries (what `callid matrix outdated`
/// prints).
pub fn outdated_dir(
    dir: &Path,
    package_of: impl Fn(&str) -> Option<Package>,
) -> Result<Result<Vec<Compared>, RegistryError>, super::MatrixError> {
    let file = super::ClientsFile::load(&dir.join(super::data::CLIENTS_FILE))?;
    Ok(outdated(&file.clients, package_of, latest_version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_numbers() {
        let cases = [
            ("7.7.7", "7.8.1", Ordering::Less),
            ("7.10.0", "7.8.1", Ordering::Greater),
            ("0.171.0", "0.171.0", Ordering::Equal),
            ("1.0", "1.0.0", Ordering::Equal),
            ("1.0.0-rc.1", "1.0.0", Ordering::Less),
            ("2.1.332", "2.1.40", Ordering::Greater),
            ("v1.2.3", "1.2.4", Ordering::Less),
        ];
        for (a, b, want) in cases {
            assert_eq!(compare_versions(a, b), want, "{a} vs {b}");
        }
    }

    #[test]
    fn only_measured_rows_of_known_clients_are_compared() {
        let yaml = r"
- id: kilo-code-cli
  client: Kilo Code CLI
  surface: s
  version: 7.7.7
  verdict: rejected
  how: {kind: measured, command: callid measure --client kilo-code, evidence: [e.jsonl]}
- id: codex-cli
  client: Codex CLI
  surface: s
  version: 0.171.0
  verdict: accepted
  how: {kind: measured, command: callid measure --client codex, evidence: [e.jsonl]}
- id: added
  client: Some client
  surface: s
  version: 1.0.0
  verdict: rejected
  how: {kind: measured, command: callid matrix add, evidence: [e.jsonl]}
- id: goose
  client: goose
  surface: s
  verdict: rejected
  how: {kind: reported, source: x}
";
        let rows: Vec<ClientRow> = serde_yaml::from_str(yaml).unwrap();
        let package_of = |slug: &str| {
            Some(Package {
                registry: Registry::Npm,
                name: match slug {
                    "kilo-code" => "@kilocode/cli",
                    "codex" => "@openai/codex",
                    _ => return None,
                },
            })
        };
        let mut asked = Vec::new();
        let compared = outdated(&rows, package_of, |p| {
            asked.push(p.name);
            Ok(if p.name == "@kilocode/cli" {
                "7.8.1"
            } else {
                "0.171.0"
            }
            .to_owned())
        })
        .unwrap();
        assert_eq!(asked, ["@kilocode/cli", "@openai/codex"]);
        let stale: Vec<&str> = compared
            .iter()
            .filter(|c| c.is_stale())
            .map(|c| c.row.as_str())
            .collect();
        assert_eq!(stale, ["kilo-code-cli"]);
        // A registry that cannot be asked stops the comparison: it is never "up to date".
        let err = outdated(&rows, package_of, |p| {
            Err(RegistryError {
                package: p,
                tool: "npm",
                detail: "connect ECONNREFUSED".into(),
            })
        })
        .unwrap_err();
        assert_eq!(err.package.name, "@kilocode/cli");
    }

    #[test]
    fn the_telling_line_of_a_registry_error() {
        let npm = "npm error code ECONNREFUSED\nnpm error syscall connect\nnpm error FetchError: \
                   request to http://127.0.0.1:1/x failed, reason: connect ECONNREFUSED \
                   127.0.0.1:1\nnpm error     at ClientRequest.<anonymous> (x.js:1:1)\n";
        assert_eq!(
            tool_error(npm),
            "FetchError: request to http://127.0.0.1:1/x failed, reason: connect ECONNREFUSED 127.0.0.1:1"
        );
        let py = "Traceback (most recent call last):\n  File \"<string>\", line 2\nurllib.error.URLError: <urlopen error [Errno 111] Connection refused>\n";
        assert_eq!(
            tool_error(py),
            "urllib.error.URLError: <urlopen error [Errno 111] Connection refused>"
        );
        assert_eq!(tool_error(""), "it failed without saying why");
    }
}
