#!/usr/bin/env python3
"""Hand test of a third-party MCP proxy in front of a paid upstream: what reaches the upstream.

Standard library only. Two roles:

  handtest.py upstream --log FILE [--http PORT]
      A paid MCP upstream with the runner's upstream rules: one tool `generate_image`
      {prompt, width, height, model}; a tools/call with an unseen
      `_meta["callid/idempotency-key"]` (or HTTP `Idempotency-Key`) is one charge, a seen key
      replays the first receipt, no key is charged every time. Serves MCP over stdio, or over
      streamable HTTP (JSON responses) at http://127.0.0.1:PORT/mcp with --http. Every
      tools/call is appended to FILE as one JSON line: the `_meta` and headers it arrived with,
      and whether it was charged.

  handtest.py client (--stdio 'CMD ARGS' | --url URL) --log FILE
      Drives the proxy the way `callid conform` does: initialize, tools/list, then
        1. a call with Codex's `_meta.callId` A,
        2. the same call again (same `_meta`, same arguments: a redelivery),
        3. a new call with `_meta.callId` B and the same arguments,
        4. a call without any `_meta`,
        5. a call with `_meta["callid/idempotency-key"]` K, twice.
      It prints each answer and then the upstream's log: the `_meta` that reached it and the
      charges made.

  handtest.py profile FILE.yaml
      Starts the proxy as the profile FILE says, with the runner's upstream placeholders
      (`{upstream_url}`, `{upstream_command}`, `{upstream_argv}`) pointing at a handtest
      upstream, and runs the client above against it: a check that the profile's command line
      works, before `callid conform` has the upstream role. Needs PyYAML.

This is how the facts in the third-party profiles were observed; it is not part of the suite.
"""

import argparse
import http.server
import json
import shlex
import subprocess
import sys
import threading
import urllib.request

KEY_META = "callid/idempotency-key"
TOOL = {
    "name": "generate_image",
    "description": "Generate an image (paid: one charge per idempotency key).",
    "inputSchema": {
        "type": "object",
        "properties": {
            "prompt": {"type": "string"},
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "model": {"type": "string"},
        },
        "required": ["prompt", "width", "height"],
    },
}


class Upstream:
    def __init__(self, log):
        self.log = log
        self.lock = threading.Lock()

    def ledger(self):
        """The charges so far, {key: receipt}, read from the log: the ledger is the log file, so
        it is shared by every process a proxy starts (supergateway starts one per request)."""
        charges = {}
        try:
            with open(self.log) as f:
                for line in f:
                    entry = json.loads(line)
                    if entry["charged"]:
                        charges[entry["key"] or f"(no key #{len(charges)})"] = entry["charge_id"]
        except FileNotFoundError:
            pass
        return charges

    def handle(self, msg, headers=None):
        method, rid = msg.get("method"), msg.get("id")
        if rid is None:
            return None
        if method == "initialize":
            result = {
                "protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "handtest-upstream", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [TOOL]}
        elif method == "tools/call":
            result = self.call(msg.get("params") or {}, headers or {})
        elif method == "ping":
            result = {}
        else:
            return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}}
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def call(self, params, headers):
        meta = params.get("_meta") or {}
        key = meta.get(KEY_META) or headers.get("idempotency-key")
        with self.lock:
            charges = self.ledger()
            charged = key is None or key not in charges
            charge_id = f"ch_{len(charges) + 1}" if charged else charges[key]
            receipt = {"charge_id": charge_id, "amount_cents": 4}
            with open(self.log, "a") as f:
                f.write(json.dumps({
                    "meta": params.get("_meta"),
                    "headers": {k: v for k, v in headers.items() if k in ("idempotency-key", "mcp-session-id")},
                    "arguments": params.get("arguments"),
                    "key": key,
                    "charged": charged,
                    "charge_id": charge_id,
                }, sort_keys=True) + "\n")
        return {
            "content": [{"type": "text", "text": json.dumps(receipt)}],
            "structuredContent": {"result": receipt},
            "isError": False,
            "_meta": {"handtest/replayed": not charged},
        }


def serve_stdio(up):
    for line in sys.stdin:
        if line.strip():
            answer = up.handle(json.loads(line))
            if answer is not None:
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()


def serve_http(up, port):
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            headers = {k.lower(): v for k, v in self.headers.items()}
            answer = up.handle(body, headers)
            if answer is None:
                self.send_response(202)
                self.end_headers()
                return
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("mcp-session-id", "handtest-session")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.send_response(405)
            self.end_headers()

        def do_DELETE(self):
            self.send_response(200)
            self.end_headers()

    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()


class StdioPeer:
    def __init__(self, command):
        self.p = None
        if command:
            self.p = subprocess.Popen(shlex.split(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def request(self, msg):
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()
        if "id" not in msg:
            return None
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit("the proxy closed its stdout")
            answer = json.loads(line)
            if answer.get("id") == msg["id"]:
                return answer

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=10)


class HttpPeer:
    def __init__(self, url):
        self.url, self.session = url, None

    def request(self, msg):
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                   "mcp-protocol-version": "2025-06-18"}
        if self.session:
            headers["mcp-session-id"] = self.session
        req = urllib.request.Request(self.url, json.dumps(msg).encode(), headers)
        with urllib.request.urlopen(req, timeout=30) as r:
            self.session = r.headers.get("mcp-session-id") or self.session
            body = r.read().decode()
            if "id" not in msg:
                return None
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                for line in body.splitlines():
                    if line.startswith("data:"):
                        answer = json.loads(line[5:])
                        if answer.get("id") == msg["id"]:
                            return answer
                raise SystemExit(f"no answer in the event stream: {body!r}")
            return json.loads(body)

    def close(self):
        pass


def client(peer, log):
    args = {"prompt": "an origami fox", "width": 512, "height": 512}
    n = iter(range(1, 1000))

    def call(meta):
        params = {"name": "generate_image", "arguments": args}
        if meta is not None:
            params["_meta"] = meta
        answer = peer.request({"jsonrpc": "2.0", "id": next(n), "method": "tools/call", "params": params})
        print(f"  _meta sent {json.dumps(meta)} -> {json.dumps(answer.get('result', answer.get('error')))}")

    peer.request({"jsonrpc": "2.0", "id": next(n), "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "handtest", "version": "1"}}})
    peer.request({"jsonrpc": "2.0", "method": "notifications/initialized"})
    tools = peer.request({"jsonrpc": "2.0", "id": next(n), "method": "tools/list", "params": {}})
    print("tools:", [t["name"] for t in tools["result"]["tools"]])
    print("1. callId A:"); call({"callId": "call_A"})
    print("2. callId A again (redelivery):"); call({"callId": "call_A"})
    print("3. callId B, same arguments (a new call):"); call({"callId": "call_B"})
    print("4. no _meta:"); call(None)
    print("5. callid/idempotency-key K, twice:"); call({KEY_META: "key_K"}); call({KEY_META: "key_K"})
    peer.close()
    print("upstream log (one line per tools/call that reached it):")
    try:
        with open(log) as f:
            lines = [json.loads(l) for l in f]
    except FileNotFoundError:
        print("  (none: the upstream is not handtest.py's)")
        return
    for l in lines:
        print("  ", json.dumps({"meta": l["meta"], "headers": l["headers"], "charged": l["charged"]}, sort_keys=True))
    print(f"charges: {sum(1 for l in lines if l['charged'])} of {len(lines)} upstream calls (6 calls sent)")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_profile(file):
    import os
    import tempfile
    import time
    import yaml

    profile = yaml.safe_load(open(file))
    state = tempfile.mkdtemp(prefix="handtest-")
    log = os.path.join(state, "upstream.log")
    me = [sys.executable, os.path.abspath(__file__)]
    up_port, port = free_port(), free_port()
    upstream = subprocess.Popen(me + ["upstream", "--log", log, "--http", str(up_port)])
    argv = me + ["upstream", "--log", log]
    values = {
        "profile_dir": os.path.dirname(os.path.abspath(file)),
        "state_dir": state,
        "port": str(port),
        "upstream_url": f"http://127.0.0.1:{up_port}/mcp",
        "upstream_command": shlex.join(argv),
    }

    def fill(text):
        for k, v in values.items():
            text = text.replace("{" + k + "}", v)
        return text

    args = []
    for a in profile.get("args", []):
        args.extend(argv if a == "{upstream_argv}" else [fill(a)])
    command = [fill(profile["command"])] + args
    env = {**os.environ, **{k: fill(v) for k, v in (profile.get("env") or {}).items()}}
    print("proxy:", shlex.join(command))
    try:
        if profile["transport"] == "stdio":
            peer = StdioPeer("")
            peer.p = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            client(peer, log)
        else:
            proxy = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                url = fill(profile["url"])
                for _ in range(120):
                    try:
                        HttpPeer(url).request({"jsonrpc": "2.0", "method": "notifications/initialized"})
                        break
                    except Exception:
                        time.sleep(0.25)
                client(HttpPeer(url), log)
            finally:
                proxy.terminate()
                proxy.wait(timeout=10)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="role", required=True)
    u = sub.add_parser("upstream")
    u.add_argument("--log", required=True)
    u.add_argument("--http", type=int)
    c = sub.add_parser("client")
    c.add_argument("--stdio")
    c.add_argument("--url")
    c.add_argument("--log", required=True)
    pr = sub.add_parser("profile")
    pr.add_argument("file")
    a = ap.parse_args()
    if a.role == "profile":
        return run_profile(a.file)
    if a.role == "upstream":
        up = Upstream(a.log)
        serve_http(up, a.http) if a.http else serve_stdio(up)
    else:
        client(StdioPeer(a.stdio) if a.stdio else HttpPeer(a.url), a.log)


if __name__ == "__main__":
    main()
