#!/usr/bin/env python3
"""What each B-tree a commit touches adds to it: single-row commits into tables with 0, 3 and 11
unique indexes of random keys (WAL, synchronous=FULL), timed side by side.

A new operation's row commit writes 12 B-tree pages (`operations`, `decisions`, `executions` and
their indexes) where the bench's baseline commit writes 1; this script measures what that costs
on the machine it runs on, without callid. Each table is preloaded with `--preload` rows (so
every index has depth), then batches of `--commits` single-row `INSERT` + `COMMIT` alternate
between the tables, in one order and then the other. Checkpoints run between batches, outside
the timing, with `RESTART`, so every commit rewrites the WAL in place as callid's checkpointer
lets it (a WAL that grows costs more). Prints the median time per commit of each table and its
ratio to the table without indexes.

Python's `sqlite3` uses the system's SQLite and its `unix` VFS, which writes each WAL frame in
two system calls; callid's VFS writes a commit in one (`src/storage/sqlite/vfs.rs`).

    python3 benches/pages_per_commit.py --rounds 30 --commits 40
"""

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
import uuid

INDEXES = (0, 3, 11)


def table(path, indexes, preload):
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    keys = "".join(f", k{i} TEXT NOT NULL" for i in range(indexes))
    conn.execute(f"CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL{keys})")
    for i in range(indexes):
        conn.execute(f"CREATE UNIQUE INDEX t_k{i} ON t (k{i})")
    insert = f"INSERT INTO t VALUES (NULL, ?{', ?' * indexes})"
    conn.execute("BEGIN")
    for _ in range(preload):
        conn.execute(insert, row(indexes))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(RESTART)")
    return conn, insert


def row(indexes):
    # About the size of a registry row's arguments, and keys as random as its handles and keys.
    return ["x" * 900] + [uuid.uuid4().hex for _ in range(indexes)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--commits", type=int, default=40, help="commits per batch")
    parser.add_argument("--preload", type=int, default=5000, help="rows in each table first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tables = {n: table(os.path.join(tmp, f"t{n}.db"), n, args.preload) for n in INDEXES}
        times = {n: [] for n in INDEXES}
        for r in range(args.rounds):
            for n in INDEXES if r % 2 == 0 else INDEXES[::-1]:
                conn, insert = tables[n]
                start = time.perf_counter()
                for _ in range(args.commits):
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute(insert, row(n))
                    conn.execute("COMMIT")
                times[n].append((time.perf_counter() - start) / args.commits * 1e6)
                conn.execute("PRAGMA wal_checkpoint(RESTART)")
        none = statistics.median(times[0])
        for n in INDEXES:
            median = statistics.median(times[n])
            print(
                f"{n + 1:2d} B-trees per commit ({n:2d} unique indexes): "
                f"{median:6.0f} µs per single-row commit, {median / none:.2f}x of one"
            )


if __name__ == "__main__":
    main()
