#!/usr/bin/env python3
"""Instructions a server process executes per `tools/call`, counted by callgrind.

Wall-clock ratios on a shared 2-core machine move with the load; instruction counts do not. This
script starts a stdio MCP server under `valgrind --tool=callgrind` twice, once answering
`--calls` calls and once answering none, and prints (instructions(N) - instructions(0)) / N: the
work one call costs that process, startup and shutdown excluded. BENCHMARKS.md uses it to explain
the ratios `callid bench` measures.

    python3 benches/per_call_instructions.py --calls 200 --tool capabilities -- target/profiling/callid probe --log /tmp/p.jsonl
    python3 benches/per_call_instructions.py --calls 200 --tool capabilities -- target/profiling/callid bench --serve-baseline
    python3 benches/per_call_instructions.py --calls 200 --tool generate_image --replay -- target/profiling/callid router --registry /tmp/r/registry.sqlite3

Each call carries a Codex-sized `_meta` with a new `callId` (or, with `--replay`, the same one, so
after the first call every call is a redelivery). Every answer is checked.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SESSION = "0199a3f2-7c41-7d02-9b5e-3f1c8e2a6d44"
PROMPT = (
    "An origami fox folded from a single sheet of washi paper, sitting on a walnut desk beside a "
    "brass lamp, soft window light from the left, shallow depth of field, muted autumn palette, "
    "studio product photograph"
)


def codex_meta(call):
    return {
        "callId": f"call_{call:024d}",
        "itemId": f"fc_{call:048x}",
        "threadId": SESSION,
        "sessionId": SESSION,
        "windowId": f"{SESSION}:0",
        "progressToken": call,
        "x-codex-turn-metadata": {
            "session_id": SESSION,
            "thread_id": SESSION,
            "model": "gpt-5.3-codex",
            "turn_id": "0199a3f4-1b2c-7e3d-8f40-5a6b7c8d9e0f",
            "turn_started_at_unix_ms": 1795990000000 + call,
            "thread_source": "cli",
            "turn_trigger": "user_message",
            "sandbox": "workspace-write",
            "sandbox_mode": "workspace-write",
            "auto_review_enabled": False,
            "node_repl_auto_review_required": False,
            "node_repl_disabled": True,
            "codex_version": "0.171.0",
        },
    }


def arguments(tool):
    if tool in ("generate_image", "echo"):
        return {"prompt": PROMPT, "width": 1024, "height": 768, "model": "flux-schnell"}
    return {}


def drive(command, tool, calls, replay, first_call):
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )

    def request(msg_id, method, params):
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            sys.exit(f"{command[0]} closed the connection")
        answer = json.loads(line)
        if "error" in answer or answer.get("result", {}).get("isError"):
            sys.exit(f"{command[0]} answered an error: {line[:300]}")
        return answer

    request(0, "initialize", {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "per-call-instructions", "version": "1"},
    })
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}}) + "\n")
    proc.stdin.flush()
    for i in range(calls):
        call = first_call if replay else first_call + i
        request(i + 1, "tools/call", {"name": tool, "arguments": arguments(tool), "_meta": codex_meta(call)})
    proc.stdin.close()
    proc.wait()


def instructions(command, tool, calls, replay, first_call):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        drive(
            ["valgrind", "--tool=callgrind", "--trace-children=no", f"--callgrind-out-file={out}", *command],
            tool,
            calls,
            replay,
            first_call,
        )
        with open(out, encoding="utf-8") as f:
            text = f.read()
    match = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if not match:
        sys.exit("callgrind wrote no summary")
    return int(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--tool", default="capabilities")
    parser.add_argument("--replay", action="store_true", help="redeliver one call (after a first real call)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server command after --")
    base = 10_000_000 + os.getpid() * 1000
    # With --replay, both runs make the first (real) call, so the difference is redeliveries only.
    zero = 1 if args.replay else 0
    idle = instructions(command, args.tool, zero, args.replay, base)
    busy = instructions(command, args.tool, zero + args.calls, args.replay, base + 500)
    per_call = (busy - idle) / args.calls
    print(json.dumps({"command": command, "tool": args.tool, "replay": args.replay, "calls": args.calls,
                      "instructions_idle": idle, "instructions_busy": busy,
                      "instructions_per_call": round(per_call)}))


if __name__ == "__main__":
    main()
