//! The support matrix: rows per client and per router in `matrices/`, rendered as Markdown.
//!
//! - [`data`]: the strict data model of `clients.yaml` and `routers.yaml` ([`ClientsFile`],
//!   [`RoutersFile`]) and the rules a row must keep.
//! - [`render`](mod@render): the data as `SUPPORT.md`, deterministic to the byte.
//! - [`check`]: compares a committed `SUPPORT.md` with what the data renders.
//! - [`evidence`]: turns probe shape logs into rows, and checks each measured row against its
//!   committed evidence by classifying it again.
//!
//! # Guarantees
//! - The same data renders the same bytes on every machine.
//! - A measured row names the exact version it measured and its evidence; a reported row names
//!   its source and claims no version.
//! - `render --check` fails (exit 1) when `SUPPORT.md` differs from the data by one byte, or when
//!   a measured row disagrees with what its evidence classifies to.

pub mod check;
pub mod data;
pub mod render;

pub use data::{ClientRow, ClientsFile, How, Matrix, MatrixError, RoutersFile, Stability, Verdict};
pub use render::render;

use std::path::Path;

/// What `render` found.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// Loads the data in `dir` and renders `dir/SUPPORT.md`; with `check`, only compares.
pub fn render_dir(dir: &Path, check_only: bool) -> Result<RenderOutcome, MatrixError> {
    let matrix = Matrix::load(dir)?;
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
        return Ok(match check::compare(&text, committed.as_deref().unwrap_or("")) {
            None => RenderOutcome::UpToDate,
            Some(d) => RenderOutcome::Differs(d),
        });
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
