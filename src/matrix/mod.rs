//! The support matrix: rows per client and per router in `matrices/`, rendered as Markdown.
//!
//! - [`data`]: the strict data model of `clients.yaml` and `routers.yaml` ([`ClientsFile`],
//!   [`RoutersFile`]) and the rules a row must keep.
//! - [`render`](mod@render): the data as `SUPPORT.md`, deterministic to the byte.
//! - [`analyze`]: the ID stability findings read out of a probe shape log (what `measure` writes
//!   into a row and `render --check` reads again from its evidence).
//! - [`check`]: compares a committed `SUPPORT.md` with what the data renders.
//! - [`evidence`]: turns probe shape logs into rows, and checks each measured row against its
//!   committed evidence by classifying it again.
//! - [`outdated`]: asks the package registries for each measured client's latest version and
//!   lists the rows measured on an older one.
//!
//! # Guarantees
//! - The same data renders the same bytes on every machine.
//! - A measured row names the exact version it measured and its evidence; a reported row names
//!   its source and claims no version.
//! - `render --check` fails (exit 1) when `SUPPORT.md` differs from the data by one byte, or when
//!   a measured row disagrees with what its evidence classifies to.

pub mod analyze;
pub mod check;
pub mod data;
pub mod evidence;
pub mod outdated;
pub mod render;

pub use data::{ClientRow, ClientsFile, How, Matrix, MatrixError, RoutersFile};
pub use render::render;

use std::path::Path;

/// What `render` found.
#[derive(Debug)]
pub enum RenderOutcome {
    /// `SUPPORT.md` was written (or already held exactly the rendered text).
    Written {
        /// Whether the file changed.
        changed: bool,
    },
    /// `--check`: the committed file is exactly what the data renders.
    UpToDate,
    /// `--check`: it differs.
    Differs(check::Difference),
    /// A measured row disagrees with its evidence; nothing was written.
    EvidenceDisagrees(evidence::EvidenceError),
}

/// Loads the data in `dir` and renders `dir/SUPPORT.md`; with `check`, only compares.
pub fn render_dir(dir: &Path, check_only: bool) -> Result<RenderOutcome, MatrixError> {
    let matrix = Matrix::load(dir)?;
    if let Err(e) = evidence::check_rows(dir, &matrix.clients) {
        return Ok(RenderOutcome::EvidenceDisagrees(e));
    }
    let text = render(&matrix);
    let path = dir.join(data::SUPPORT_FILE);
    let committed = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(MatrixError::Io {
                action: "read",
                path,
                source,
            });
        }
    };
    if check_only {
        return Ok(
            match check::compare(&text, committed.as_deref().unwrap_or("")) {
                None => RenderOutcome::UpToDate,
                Some(d) => RenderOutcome::Differs(d),
            },
        );
    }
    let changed = committed.as_deref() != Some(text.as_str());
    if changed {
        std::fs::write(&path, &text).map_err(|source| MatrixError::Io {
            action: "write",
            path: path.clone(),
            source,
        })?;
    }
    Ok(RenderOutcome::Written { changed })
}

/// Turns probe logs into rows: one per client with at least one `tools/call`, each with its
/// records copied to `dir/evidence/<client>-<version>.jsonl`; then renders `SUPPORT.md`.
/// Returns the rows written.
pub fn add_logs(
    dir: &Path,
    logs: &[std::path::PathBuf],
    date: &str,
) -> Result<Vec<ClientRow>, evidence::EvidenceError> {
    use crate::classify;
    let (records, bad) =
        classify::read_logs(logs).map_err(|source| evidence::EvidenceError::Read {
            row: "(new)".into(),
            source,
        })?;
    if let Some(first) = bad.first() {
        return Err(evidence::EvidenceError::BadLine {
            row: "(new)".into(),
            line: first.to_string(),
        });
    }
    let clients_path = dir.join(data::CLIENTS_FILE);
    let mut file = ClientsFile::load(&clients_path)?;
    let mut added = Vec::new();
    for verdict in classify::classify(&records) {
        let Some(mut observed) = evidence::observed(&verdict) else {
            continue;
        };
        let id = data::slug(&[&observed.name, &observed.version]);
        let connections: std::collections::BTreeSet<&str> = records
            .iter()
            .filter(|r| {
                r.client
                    .as_ref()
                    .map(|c| (c.name.as_str(), c.version.as_str()))
                    == Some((observed.name.as_str(), observed.version.as_str()))
            })
            .map(|r| r.connection.as_str())
            .collect();
        let own: Vec<crate::probe::Record> = records
            .iter()
            .filter(|r| connections.contains(r.connection.as_str()))
            .cloned()
            .collect();
        observed.protocol = evidence::protocol_of(&own);
        let mut lines = String::new();
        for r in &own {
            lines.push_str(&serde_json::to_string(r).expect("records serialize"));
            lines.push('\n');
        }
        let name = format!("{}/{id}.jsonl", data::EVIDENCE_DIR);
        data::write_text(&dir.join(&name), &lines)?;
        let row = evidence::row_from_observed(
            &observed,
            id,
            "MCP client (probe log)".into(),
            date.to_owned(),
            How::Measured {
                command: "callid matrix add".into(),
                evidence: vec![name],
            },
        );
        evidence::check_row(dir, &row)?;
        file.upsert(row.clone());
        added.push(row);
    }
    file.save(&clients_path)?;
    render_dir(dir, false)?;
    Ok(added)
}

/// The part of a `callid conform --format json` report the router table needs; other fields are
/// ignored, so the report may grow.
#[derive(Debug, serde::Deserialize)]
struct ConformReport {
    target: String,
    checks: Vec<ConformCheck>,
    /// The signal that cut the run short (reports of a finished run have `null` or no field).
    #[serde(default)]
    interrupted: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct ConformCheck {
    id: String,
    verdict: data::CheckVerdict,
}

/// Whether `text` is a `callid conform --format json` report rather than a probe log.
pub fn is_conform_report(text: &str) -> bool {
    text.trim_start().starts_with('{')
        && serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .is_some_and(|v| v.get("checks").is_some_and(serde_json::Value::is_array))
}

/// Turns a `callid conform --format json` report into a row of `routers.yaml` (replacing the
/// row with the same id, whose `command` it keeps) and renders `SUPPORT.md`. The built-in reference router's row (target
/// starting with `callid`) carries this build's version.
pub fn add_conform_report(
    dir: &Path,
    report: &Path,
    date: &str,
) -> Result<data::RouterRow, MatrixError> {
    let text = std::fs::read_to_string(report).map_err(|source| MatrixError::Io {
        action: "read",
        path: report.to_owned(),
        source,
    })?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let parsed: ConformReport =
        serde_path_to_error::deserialize(de).map_err(|e| MatrixError::Parse {
            file: report.to_owned(),
            path: e.path().to_string(),
            message: e.into_inner().to_string(),
        })?;
    if let Some(signal) = &parsed.interrupted {
        return Err(MatrixError::Parse {
            file: report.to_owned(),
            path: "interrupted".into(),
            message: format!(
                "the run was interrupted by {signal}, so its unfinished checks say nothing about \
                 the router; add the report of a run that went to the end"
            ),
        });
    }
    let row = data::RouterRow {
        id: data::slug(&[&parsed.target]),
        router: parsed.target.clone(),
        version: parsed
            .target
            .starts_with("callid")
            .then(|| env!("CARGO_PKG_VERSION").to_owned()),
        date: Some(date.to_owned()),
        command: "callid conform --format json".into(),
        checks: parsed
            .checks
            .into_iter()
            .map(|c| data::RouterCheck {
                id: c.id,
                verdict: c.verdict,
            })
            .collect(),
    };
    let path = dir.join(data::ROUTERS_FILE);
    let mut file = if path.exists() {
        RoutersFile::load(&path)?
    } else {
        RoutersFile {
            version: data::FORMAT_VERSION,
            routers: Vec::new(),
        }
    };
    // A re-measured row keeps the command it was measured with (the report does not know how
    // conform was invoked: `--target`, `--allow-incomplete`, an install step).
    let row = match file.routers.iter_mut().find(|r| r.id == row.id) {
        Some(slot) => {
            let row = data::RouterRow {
                command: std::mem::take(&mut slot.command),
                ..row
            };
            *slot = row.clone();
            row
        }
        None => {
            file.routers.push(row.clone());
            row
        }
    };
    file.save(&path)?;
    render_dir(dir, false)?;
    Ok(row)
}
