"""The probe a user would write with the Python `mcp` SDK: the baseline of `callid bench`'s
probe-throughput row.

It does what `callid probe` does for one `tools/call`, in the plainest idiomatic Python: a
`capabilities` tool that reads the request's `_meta`, decides which trusted identity source it
carries (Codex `callId`, Claude Code `claudecode/toolUseId`, or the platform envelope), records
one JSON line with the shape of every `_meta` key (path, type, length, 12-hex SHA-256 digest of
the value, never the value) to the log named by `CALLID_PY_PROBE_LOG`, and answers the verdict
and the keys it saw. Diagnostics go to stderr; stdout is the protocol.

`callid bench` writes this file to a temporary directory and starts it with a Python that can
`import mcp`; it is not part of the Rust build.
"""

import hashlib
import json
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

SOURCES = {
    "callId": "codex",
    "claudecode/toolUseId": "claude-code",
    "hubu.dev/platform-invocation": None,
}
LOG_PATH = os.environ.get("CALLID_PY_PROBE_LOG")
LOG = open(LOG_PATH, "a", encoding="utf-8") if LOG_PATH else None

server = MCPServer("python-probe", version="0.1.0")


def json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def digest(value):
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def shape(value, path, entries, depth=0):
    kind = json_type(value)
    if kind == "string":
        length = len(value.encode("utf-8"))
    elif kind in ("array", "object"):
        length = len(value)
    else:
        length = None
    entries.append({"path": path, "type": kind, "len": length, "digest": digest(value)})
    if kind == "object" and depth < 16:
        for key, child in value.items():
            token = key.replace("~", "~0").replace("/", "~1")
            shape(child, f"{path}/{token}", entries, depth + 1)


@server.tool()
def capabilities(ctx: Context) -> dict:
    """Report this call's identity verdict and the `_meta` keys seen (never values)."""
    meta = dict(ctx.request_context.meta or {})
    present = [key for key in SOURCES if key in meta]
    if len(present) == 1:
        verdict, source = "accepted", present[0]
    elif not present:
        verdict, source = "rejected: missing_identity", None
    else:
        verdict, source = "rejected: ambiguous_identity", None
    entries = []
    for key, value in meta.items():
        shape(value, "/" + key.replace("~", "~0").replace("/", "~1"), entries)
    if LOG is not None:
        LOG.write(
            json.dumps({"time": time.time(), "method": "tools/call", "meta": entries}) + "\n"
        )
        LOG.flush()
    return {"verdict": verdict, "source": source, "keys": sorted(meta.keys())}


if __name__ == "__main__":
    print("python-probe: serving MCP on stdio", file=sys.stderr)
    server.run("stdio")
