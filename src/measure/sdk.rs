//! Measures the MCP clients a developer reaches for: MCP Inspector's CLI, the TypeScript SDK
//! client, the Python SDK client and rmcp's client. None of them runs a model, so there is no
//! scripted endpoint: each makes two `tools/call`s of the probe's `capabilities` tool the way a
//! developer would write it, and the probe's log is classified into a row.
//!
//! The TypeScript and Python clients run through the small driver programs in
//! `matrices/clients/drivers/`, against the SDK versions pinned in `matrices/clients/`; the
//! Inspector CLI is the pinned npm package run as its users run it; rmcp's client runs in this
//! process, at the rmcp version callid is built with. The ID stability columns do not apply
//! (there is no model tool-call id to follow) and stay `not-measured`.

use super::{MeasureError, Measurement, run::RunError, today};
use crate::matrix::data::How;
use crate::matrix::evidence;
use crate::matrix::outdated::{Package, Registry};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The project-local venv, inside `matrices/clients/`, that holds the pinned Python clients.
pub const PYTHON_VENV: &str = ".venv";

/// Longest one driver run may take.
pub const DRIVER_TIMEOUT: Duration = Duration::from_secs(60);

/// An MCP client library or tool without a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdkClient {
    /// `@modelcontextprotocol/inspector` in `--cli` mode.
    Inspector,
    /// `@modelcontextprotocol/sdk`'s `Client`.
    TsSdk,
    /// PyPI `mcp`'s `ClientSession`.
    PythonSdk,
    /// rmcp's client (`ServiceExt::serve` over a child process).
    Rmcp,
}

impl SdkClient {
    /// Every client library or tool measured without a model.
    pub const ALL: [SdkClient; 4] = [
        SdkClient::Inspector,
        SdkClient::TsSdk,
        SdkClient::PythonSdk,
        SdkClient::Rmcp,
    ];

    /// The package the client comes from (rmcp's is the one callid is built with).
    pub fn package(self) -> Package {
        let (registry, name) = match self {
            SdkClient::Inspector => (Registry::Npm, "@modelcontextprotocol/inspector"),
            SdkClient::TsSdk => (Registry::Npm, "@modelcontextprotocol/sdk"),
            SdkClient::PythonSdk => (Registry::PyPi, "mcp"),
            SdkClient::Rmcp => (Registry::CratesIo, "rmcp"),
        };
        Package { registry, name }
    }

    /// Short name used in `--client`, row ids and evidence files.
    pub fn slug(self) -> &'static str {
        match self {
            SdkClient::Inspector => "inspector-cli",
            SdkClient::TsSdk => "ts-sdk",
            SdkClient::PythonSdk => "python-sdk",
            SdkClient::Rmcp => "rmcp",
        }
    }

    /// The row's display name and surface.
    pub fn display(self) -> (&'static str, &'static str) {
        match self {
            SdkClient::Inspector => (
                "MCP Inspector CLI",
                "`mcp-inspector --cli CMD --method tools/call`, stdio",
            ),
            SdkClient::TsSdk => (
                "MCP TypeScript SDK client",
                "`Client` with `StdioClientTransport`, `callTool`",
            ),
            SdkClient::PythonSdk => (
                "MCP Python SDK client",
                "`ClientSession` with `stdio_client`, `call_tool`",
            ),
            SdkClient::Rmcp => (
                "rmcp client",
                "`ServiceExt::serve` with `TokioChildProcess`, `call_tool`",
            ),
        }
    }
}

async fn run_driver(
    program: &Path,
    args: &[String],
    envs: &[(&str, String)],
    what: &str,
) -> Result<(), MeasureError> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|source| RunError::Io {
        what: format!("start `{}` ({what})", program.display()),
        source,
    })?;
    match tokio::time::timeout(DRIVER_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => Err(MeasureError::Driver {
            what: what.to_owned(),
            detail: format!(
                "exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(8)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        }),
        Ok(Err(source)) => Err(RunError::Io {
            what: format!("wait for `{}` ({what})", program.display()),
            source,
        }
        .into()),
        Err(_) => Err(MeasureError::Driver {
            what: what.to_owned(),
            detail: format!("no result within {} s", DRIVER_TIMEOUT.as_secs()),
        }),
    }
}

fn need(path: PathBuf, hint: &str) -> Result<PathBuf, MeasureError> {
    if path.exists() {
        Ok(path)
    } else {
        Err(MeasureError::Driver {
            what: format!("`{}`", path.display()),
            detail: format!("not found; {hint}"),
        })
    }
}

async fn rmcp_client(callid: &Path, log: &Path) -> Result<(), MeasureError> {
    use rmcp::ServiceExt as _;
    use rmcp::model::CallToolRequestParams;
    let mut command = tokio::process::Command::new(callid);
    command.arg("probe").arg("--log").arg(log);
    let fail = |e: String| MeasureError::Driver {
        what: "rmcp client".into(),
        detail: e,
    };
    let transport = rmcp::transport::TokioChildProcess::new(command)
        .map_err(|e| fail(format!("starting the probe: {e}")))?;
    let work = async {
        let client = ().serve(transport).await.map_err(|e| fail(e.to_string()))?;
        client
            .list_all_tools()
            .await
            .map_err(|e| fail(e.to_string()))?;
        for _ in 0..2 {
            client
                .call_tool(CallToolRequestParams::new("capabilities"))
                .await
                .map_err(|e| fail(e.to_string()))?;
        }
        client.cancel().await.map_err(|e| fail(e.to_string()))?;
        Ok::<(), MeasureError>(())
    };
    tokio::time::timeout(DRIVER_TIMEOUT, work)
        .await
        .map_err(|_| fail(format!("no result within {} s", DRIVER_TIMEOUT.as_secs())))?
}

/// Measures `client` with `callid` as the probe; `matrix_dir` holds `clients/` (the pinned
/// packages and the drivers).
pub async fn measure_sdk(
    client: SdkClient,
    matrix_dir: &Path,
    callid: &Path,
) -> Result<Measurement, MeasureError> {
    let home = tempfile::Builder::new()
        .prefix("callid-measure-")
        .tempdir()
        .map_err(|source| RunError::Io {
            what: "create a temporary directory".into(),
            source,
        })?;
    let log = home.path().join("probe.jsonl");
    let clients =
        std::path::absolute(matrix_dir.join("clients")).unwrap_or(matrix_dir.join("clients"));
    let server = [
        callid.display().to_string(),
        "probe".to_owned(),
        "--log".to_owned(),
        log.display().to_string(),
    ];
    let npm_hint =
        "install the pinned clients with `npm install --no-save --prefix matrices/clients`";
    match client {
        SdkClient::Inspector => {
            let bin = need(clients.join("node_modules/.bin/mcp-inspector"), npm_hint)?;
            let mut args = vec!["--cli".to_owned()];
            args.extend(server.iter().cloned());
            args.extend(
                ["--method", "tools/call", "--tool-name", "capabilities"].map(String::from),
            );
            // The CLI makes one call per run, as its users run it: twice, two connections.
            for _ in 0..2 {
                run_driver(&bin, &args, &[], "mcp-inspector --cli").await?;
            }
        }
        SdkClient::TsSdk => {
            need(
                clients.join("node_modules/@modelcontextprotocol/sdk"),
                npm_hint,
            )?;
            let driver = clients.join("drivers/ts-sdk-client.mjs");
            let mut args = vec![driver.display().to_string()];
            args.extend(server.iter().cloned());
            run_driver(Path::new("node"), &args, &[], "the TypeScript SDK driver").await?;
        }
        SdkClient::PythonSdk => {
            let python = need(
                clients.join(PYTHON_VENV).join("bin/python"),
                "make the venv with the pinned SDK: `python3 -m venv matrices/clients/.venv && \
                 matrices/clients/.venv/bin/python -m pip install -r \
                 matrices/clients/requirements.txt` (`.ci/run` does this)",
            )?;
            let driver = clients.join("drivers/python-sdk-client.py");
            let mut args = vec![driver.display().to_string()];
            args.extend(server.iter().cloned());
            run_driver(&python, &args, &[], "the Python SDK driver").await?;
        }
        SdkClient::Rmcp => rmcp_client(callid, &log).await?,
    }
    let row_id = format!("{}-client", client.slug());
    let records = evidence::read_evidence(&row_id, &log)?;
    let observed = evidence::single_client(&log, &records)?;
    let name = format!(
        "{}/{}-{}.jsonl",
        crate::matrix::data::EVIDENCE_DIR,
        client.slug(),
        observed.version
    );
    let (display, surface) = client.display();
    let mut row = evidence::row_from_observed(
        &observed,
        row_id,
        surface.to_owned(),
        today(),
        How::Measured {
            command: format!("callid measure --client {}", client.slug()),
            evidence: vec![name.clone()],
        },
    );
    row.client = display.to_owned();
    let base = "A client library or tool, not a harness: out of the box it sends no per-call ID; \
                a harness built on it must put one in `_meta` itself.";
    row.notes = Some(match row.notes.take() {
        Some(more) => format!("{base} {more}"),
        None => base.to_owned(),
    });
    let bytes = std::fs::read(&log).map_err(|source| RunError::Io {
        what: format!("read the probe log `{}`", log.display()),
        source,
    })?;
    Ok(Measurement {
        row,
        evidence: vec![(name, bytes)],
    })
}
