//! `callid measure --check` against the real pinned clients beside Codex and Claude Code (those
//! are in `matrix.rs`): the agent harnesses driven through a scripted Chat Completions or Gemini
//! endpoint, and the client libraries and tools without a model (the SDK rows). Each test runs
//! the real program when it is installed and says why not otherwise; with
//! `CALLID_REQUIRE_CLIENTS` set (CI sets it once the pinned install succeeded) a missing client
//! fails instead. A measured row that differs from the committed one fails either way.

use crate::common::{bin, repo};
use std::path::PathBuf;

/// What must be installed for `client` to be measured.
fn installed(what: &str) -> PathBuf {
    repo().join("matrices/clients").join(what)
}

fn measure_check(client: &str, needs: PathBuf, install_hint: &str, required_by: &str) {
    crate::common::measure::measure_check(client, &needs, install_hint, required_by, "- id: ");
}

const NPM: &str = "run `npm install --no-save --prefix matrices/clients`";

fn npm_client(client: &str, program: &str) {
    measure_check(
        client,
        installed(&format!("node_modules/.bin/{program}")),
        NPM,
        "CALLID_REQUIRE_CLIENTS",
    );
}

#[test]
fn measure_gemini_cli_matches_the_committed_row() {
    npm_client("gemini-cli", "gemini");
}

#[test]
fn measure_copilot_cli_matches_the_committed_row() {
    npm_client("copilot-cli", "copilot");
}

#[test]
fn measure_qwen_code_matches_the_committed_row() {
    npm_client("qwen-code", "qwen");
}

#[test]
fn measure_opencode_matches_the_committed_row() {
    npm_client("opencode", "opencode");
}

#[test]
fn measure_kilo_code_matches_the_committed_row() {
    npm_client("kilo-code", "kilo");
}

#[test]
fn measure_cline_matches_the_committed_row() {
    npm_client("cline", "cline");
}

#[test]
fn measure_continue_cli_matches_the_committed_row() {
    npm_client("continue-cli", "cn");
}

const VENV: &str =
    "run `.ci/run` (it makes the venv `matrices/clients/.venv` from `requirements.txt`)";

#[test]
fn measure_fast_agent_matches_the_committed_row() {
    measure_check(
        "fast-agent",
        installed(".venv/bin/fast-agent"),
        VENV,
        "CALLID_REQUIRE_PYTHON_CLIENTS",
    );
}

#[test]
fn measure_openai_agents_matches_the_committed_row() {
    measure_check(
        "openai-agents",
        installed(".venv/lib"),
        VENV,
        "CALLID_REQUIRE_PYTHON_CLIENTS",
    );
}

#[test]
fn measure_inspector_cli_matches_the_committed_row() {
    npm_client("inspector-cli", "mcp-inspector");
}

#[test]
fn measure_ts_sdk_matches_the_committed_row() {
    measure_check(
        "ts-sdk",
        installed("node_modules/@modelcontextprotocol/sdk"),
        NPM,
        "CALLID_REQUIRE_CLIENTS",
    );
}

#[test]
fn measure_python_sdk_matches_the_committed_row() {
    measure_check(
        "python-sdk",
        installed(".venv/bin/python"),
        VENV,
        "CALLID_REQUIRE_PYTHON_CLIENTS",
    );
}

#[test]
fn measure_rmcp_matches_the_committed_row() {
    // rmcp's client is built into callid: always there.
    measure_check("rmcp", bin(), "", "CALLID_REQUIRE_CLIENTS");
}
