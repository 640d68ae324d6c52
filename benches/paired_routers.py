#!/usr/bin/env python3
"""Two router builds side by side: wall time and the router's CPU time per new operation.

Starts `A router` and `B router` over stdio, each with a fresh registry in a directory of its own
under $TMPDIR (set TMPDIR=/dev/shm to take the disk's syncs out), and drives each with one client
that sends `generate_image` calls with new call ids, in alternating batches (A B, then B A, ...),
after a warm-up batch each. Prints the median wall milliseconds per new operation of each build's
batches, the CPU milliseconds per new operation of each router process during its batches
(utime + stime of all its threads, from /proc), and B over A for both. Every answer is checked.

    python3 benches/paired_routers.py target-a/profiling/callid target-b/profiling/callid
    BATCHES=40 N=50 TMPDIR=/dev/shm python3 benches/paired_routers.py A B

BENCHMARKS.md quotes it where two builds of the router are compared.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from per_call_instructions import arguments, codex_meta

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(proc):
    total = 0
    for task in os.listdir(f"/proc/{proc.pid}/task"):
        with open(f"/proc/{proc.pid}/task/{task}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


class Router:
    def __init__(self, binary):
        self.dir = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(
            [binary, "router", "--registry", os.path.join(self.dir.name, "registry.sqlite3")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self.next_id = 0
        self.call = 1
        self.walls, self.ticks, self.ops = [], 0, 0
        self.request("initialize", {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "paired-routers", "version": "1"},
        })
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}})

    def send(self, message):
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        self.next_id += 1
        line = self.proc.stdout.readline()
        if not line:
            sys.exit("a router closed its connection")
        answer = json.loads(line)
        if "error" in answer or answer.get("result", {}).get("isError"):
            sys.exit(f"a router answered an error: {line[:300]}")

    def batch(self, calls, keep=True):
        ticks = cpu_ticks(self.proc)
        start = time.perf_counter()
        for _ in range(calls):
            self.request("tools/call", {
                "name": "generate_image",
                "arguments": arguments("generate_image"),
                "_meta": codex_meta(self.call),
            })
            self.call += 1
        wall = (time.perf_counter() - start) / calls * 1e3
        if keep:
            self.walls.append(wall)
            self.ticks += cpu_ticks(self.proc) - ticks
            self.ops += calls

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
        self.dir.cleanup()

    def cpu_ms(self):
        return self.ticks / TICK / self.ops * 1e3


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    batches = int(os.environ.get("BATCHES", 40))
    calls = int(os.environ.get("N", 50))
    routers = [Router(b) for b in sys.argv[1:3]]
    for r in routers:
        r.batch(20, keep=False)
    for i in range(batches):
        for r in routers if i % 2 == 0 else reversed(routers):
            r.batch(calls)
    for r in routers:
        r.close()
    a, b = routers
    wa, wb = statistics.median(a.walls), statistics.median(b.walls)
    print(json.dumps({
        "batches": batches, "calls_per_batch": calls,
        "wall_ms": [round(wa, 3), round(wb, 3)], "wall_b_over_a": round(wb / wa, 3),
        "cpu_ms": [round(a.cpu_ms(), 3), round(b.cpu_ms(), 3)],
        "cpu_b_over_a": round(b.cpu_ms() / a.cpu_ms(), 3),
    }))


if __name__ == "__main__":
    main()
