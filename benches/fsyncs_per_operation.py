#!/usr/bin/env python3
"""Durable commits per new operation of a stdio MCP server, counted by strace.

Every durable SQLite commit of callid ends in one `fdatasync` or `fsync` (WAL, synchronous=FULL),
plus the occasional checkpoint. This script starts the server under
`strace -f -c -e trace=fsync,fdatasync` twice, in a fresh state directory each time, once making
`--calls` new `generate_image` operations (each with a new Codex `callId`) and once making none,
and prints (syncs(N) - syncs(0)) / N: the syncs one new operation costs, startup excluded.
BENCHMARKS.md quotes it beside `callid bench --only router_new_operation`.

    python3 benches/fsyncs_per_operation.py --calls 100 -- target/profiling/callid router --registry {dir}/registry.sqlite3

`{dir}` in the command is replaced by the fresh state directory of each run.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call_instructions import drive  # noqa: E402


def syncs(command, calls, first_call):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "strace.txt")
        state = os.path.join(tmp, "state")
        os.makedirs(state)
        server = [part.replace("{dir}", state) for part in command]
        drive(
            ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out, *server],
            "generate_image",
            calls,
            False,
            first_call,
        )
        with open(out, encoding="utf-8") as f:
            text = f.read()
    counts = {name: 0 for name in ("fsync", "fdatasync")}
    for match in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fsync|fdatasync)\s*$", text, re.M):
        counts[match.group(2)] = int(match.group(1))
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server command after --")
    base = 20_000_000 + os.getpid() * 1000
    idle = syncs(command, 0, base)
    busy = syncs(command, args.calls, base + 500)
    total = lambda c: c["fsync"] + c["fdatasync"]  # noqa: E731
    print(json.dumps({"command": command, "calls": args.calls, "idle": idle, "busy": busy,
                      "syncs_per_operation": round((total(busy) - total(idle)) / args.calls, 2)}))


if __name__ == "__main__":
    main()
