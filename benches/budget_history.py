#!/usr/bin/env python3
"""New operations per second of `callid router --budget-cents` after a long history.

A budget check must not grow with the decisions an account settled before. This script starts
`BINARY router --registry {dir}/registry.sqlite3 --budget-cents 10^12` in a fresh state
directory, makes one operation (so the registry and its account exist), writes `--history`
charged decisions of that account straight into the registry, then times `--calls` new
`generate_image` operations (each with a new Codex `callId`) over stdio and prints op/s.
BENCHMARKS.md ("Why, in a page": budgets) quotes it with `--history 0` and `--history 100000`.

With `--postgres postgres://USER@HOST:PORT` the registry is a fresh database on that server
instead (created with `psql`, dropped afterwards), and the history goes into `callid_decisions`.

    python3 benches/budget_history.py --history 100000 --calls 300 -- target/profiling/callid
    python3 benches/budget_history.py --postgres postgres://callid@127.0.0.1:5432 -- target/profiling/callid
"""

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call_instructions import drive  # noqa: E402


def psql(server, database, sql):
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", f"{server}/{database}", "-c", sql],
                   check=True, stdout=subprocess.DEVNULL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--postgres", metavar="URL", help="postgres://USER@HOST:PORT, no database")
    parser.add_argument("binary", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    binary = args.binary[1:] if args.binary[:1] == ["--"] else args.binary
    if len(binary) != 1:
        parser.error("give the callid binary after --")
    with tempfile.TemporaryDirectory() as tmp:
        if args.postgres:
            database = f"budget_history_{os.getpid()}"
            psql(args.postgres, "postgres", f"CREATE DATABASE {database}")
            registry = f"{args.postgres}/{database}"
            # The in-process provider's ledger and the layers' local files go to a fresh data
            # directory too, not the user's.
            os.environ["XDG_DATA_HOME"] = tmp
        else:
            registry = os.path.join(tmp, "registry.sqlite3")
        command = [binary[0], "router", "--registry", registry, "--budget-cents", str(10**12)]
        try:
            drive(command, "generate_image", 1, False, 1)
            if args.postgres:
                psql(args.postgres, database, f"""
                    INSERT INTO callid_decisions (agent_id, operation_key, decision_id, account,
                        amount_cents, scope, request_hash, created_at, state, reserved_ms,
                        charged_cents)
                    SELECT d.agent_id, 'history-' || i, 'history-' || i, d.account, 3,
                        'history', 'history', 'history', 'charged', 0, 3
                    FROM (SELECT agent_id, account FROM callid_decisions LIMIT 1) d,
                        generate_series(1, {args.history}) i;
                    ANALYZE;""")
            else:
                db = sqlite3.connect(registry)
                agent, account = db.execute(
                    "SELECT agent_id, account FROM decisions LIMIT 1"
                ).fetchone()
                db.executemany(
                    "INSERT INTO decisions (agent_id, operation_key, decision_id, account,"
                    " amount_cents, scope, request_hash, created_at, state, reserved_ms,"
                    " charged_cents)"
                    " VALUES (?, ?, ?, ?, 3, 'history', 'history', 'history', 'charged', 0, 3)",
                    ((agent, f"history-{i}", f"history-{i}", account) for i in range(args.history)),
                )
                db.commit()
                db.close()
            start = time.perf_counter()
            drive(command, "generate_image", args.calls, False, 1000)
            elapsed = time.perf_counter() - start
        finally:
            if args.postgres:
                psql(args.postgres, "postgres", f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    print(f"history {args.history}: {args.calls / elapsed:.0f} new operations/s")


if __name__ == "__main__":
    main()
