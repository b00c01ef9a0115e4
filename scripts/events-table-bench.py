#!/usr/bin/env python3
"""Micro-benchmark of SQLite `events` table layouts for the store writer.

Inserts N events of about 250 bytes for one session key in transactions of
BATCH events (multi-row INSERTs of 256 rows, as the writer does), WAL and
synchronous=NORMAL, and prunes like the writer: after a transaction, when
the session is past CAP events by a step (CAP / 8) more than the last prune,
one DELETE of every offset below count - CAP. Prints the process CPU time
per layout (research/benchmarks.md, "SQLite events as a rowid table").

    scripts/events-table-bench.py [--events 500000] [--rounds 2] [LAYOUT ...]
"""

import argparse
import os
import shutil
import sqlite3
import tempfile
import time

CAP = 10_000
STEP = CAP // 8
ROWS_PER_INSERT = 256
KEY = 7  # one session key; a second, small session shares the table

LAYOUTS = {
    # Nothing stored: the script's own cost of building the rows.
    "none": dict(
        schema="CREATE TABLE events (a, b, c, d, e)",
        insert="INSERT INTO events (a, b, c, d, e) VALUES ",
        cols=5,
        row=lambda key, off, at, d, m: (key, off, at, d, m),
        prune="SELECT ?, ?",
        prune_args=lambda key, below: (key, below),
    ),
    # Schema 4: clustered by (session_key, event_offset).
    "without-rowid": dict(
        schema="""CREATE TABLE events (
            session_key INTEGER NOT NULL, event_offset INTEGER NOT NULL,
            at_ns INTEGER NOT NULL, direction TEXT NOT NULL, message BLOB NOT NULL,
            PRIMARY KEY (session_key, event_offset)) WITHOUT ROWID""",
        insert="INSERT INTO events (session_key, event_offset, at_ns, direction, message) VALUES ",
        cols=5,
        row=lambda key, off, at, d, m: (key, off, at, d, m),
        prune="DELETE FROM events WHERE session_key = ? AND event_offset < ?",
        prune_args=lambda key, below: (key, below),
    ),
    # A rowid table and a unique index on (session_key, event_offset).
    "rowid-index": dict(
        schema="""CREATE TABLE events (
            event_id INTEGER PRIMARY KEY,
            session_key INTEGER NOT NULL, event_offset INTEGER NOT NULL,
            at_ns INTEGER NOT NULL, direction TEXT NOT NULL, message BLOB NOT NULL,
            UNIQUE (session_key, event_offset))""",
        insert="INSERT INTO events (session_key, event_offset, at_ns, direction, message) VALUES ",
        cols=5,
        row=lambda key, off, at, d, m: (key, off, at, d, m),
        prune="DELETE FROM events WHERE session_key = ? AND event_offset < ?",
        prune_args=lambda key, below: (key, below),
    ),
    # The rowid computed from key and offset: key * 2^40 + offset.
    "rowid-computed": dict(
        schema="""CREATE TABLE events (
            event_id INTEGER PRIMARY KEY,
            at_ns INTEGER NOT NULL, direction TEXT NOT NULL, message BLOB NOT NULL)""",
        insert="INSERT INTO events (event_id, at_ns, direction, message) VALUES ",
        cols=4,
        row=lambda key, off, at, d, m: ((key << 32) + off, at, d, m),
        prune="DELETE FROM events WHERE event_id >= ? AND event_id < ?",
        prune_args=lambda key, below: (key << 32, (key << 32) + below),
    ),
    # The same, with the key and offset as virtual (not stored) columns.
    "rowid-computed-virtual": dict(
        schema="""CREATE TABLE events (
            event_id INTEGER PRIMARY KEY,
            at_ns INTEGER NOT NULL, direction TEXT NOT NULL, message BLOB NOT NULL,
            session_key INTEGER GENERATED ALWAYS AS (event_id >> 32) VIRTUAL,
            event_offset INTEGER GENERATED ALWAYS AS (event_id & 4294967295) VIRTUAL)""",
        insert="INSERT INTO events (event_id, at_ns, direction, message) VALUES ",
        cols=4,
        row=lambda key, off, at, d, m: ((key << 32) + off, at, d, m),
        prune="DELETE FROM events WHERE event_id >= ? AND event_id < ?",
        prune_args=lambda key, below: (key << 32, (key << 32) + below),
    ),
    # As the server's SQL: the prune finds the key by a subquery.
    "without-rowid-subquery": dict(
        schema="""CREATE TABLE events (
            session_key INTEGER NOT NULL, event_offset INTEGER NOT NULL,
            at_ns INTEGER NOT NULL, direction TEXT NOT NULL, message BLOB NOT NULL,
            PRIMARY KEY (session_key, event_offset)) WITHOUT ROWID""",
        insert="INSERT INTO events (session_key, event_offset, at_ns, direction, message) VALUES ",
        cols=5,
        row=lambda key, off, at, d, m: (key, off, at, d, m),
        prune="DELETE FROM events WHERE session_key = (SELECT ? + 0) AND event_offset < ?",
        prune_args=lambda key, below: (key, below),
    ),
    "rowid-computed-virtual-subquery": dict(
        schema="""CREATE TABLE events (
            event_id INTEGER PRIMARY KEY,
            at_ns INTEGER NOT NULL, direction TEXT NOT NULL, message BLOB NOT NULL,
            session_key INTEGER GENERATED ALWAYS AS (event_id >> 32) VIRTUAL,
            event_offset INTEGER GENERATED ALWAYS AS (event_id & 4294967295) VIRTUAL)""",
        insert="INSERT INTO events (event_id, at_ns, direction, message) VALUES ",
        cols=4,
        row=lambda key, off, at, d, m: ((key << 32) + off, at, d, m),
        prune="DELETE FROM events WHERE event_id >= (SELECT ? + 0) AND event_id < ?",
        prune_args=lambda key, below: (key << 32, (key << 32) + below),
    ),
    # The same with the key and offset kept as columns too (readable rows).
    "rowid-computed-cols": dict(
        schema="""CREATE TABLE events (
            event_id INTEGER PRIMARY KEY,
            session_key INTEGER NOT NULL, event_offset INTEGER NOT NULL,
            at_ns INTEGER NOT NULL, direction TEXT NOT NULL, message BLOB NOT NULL)""",
        insert="INSERT INTO events (event_id, session_key, event_offset, at_ns, direction, message) VALUES ",
        cols=6,
        row=lambda key, off, at, d, m: ((key << 32) + off, key, off, at, d, m),
        prune="DELETE FROM events WHERE event_id >= ? AND event_id < ?",
        prune_args=lambda key, below: (key << 32, (key << 32) + below),
    ),
}


def message(offset):
    text = f"chunk {offset} of the burst, some words the agent streams " * 2
    return (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'
        '"mock-3f1c2a7e-1b2c-4d5e-8f90-0a1b2c3d4e5f","update":{"sessionUpdate":'
        '"agent_message_chunk","content":{"type":"text","text":"' + text[:120] + '"}}}}'
    ).encode()


PAGE_SIZE = None
SESSIONS = 1


def connect(path):
    db = sqlite3.connect(path, isolation_level=None)
    if PAGE_SIZE:
        db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    # As the server's bundled SQLite (libsqlite3-sys builds it without
    # SQLITE_SECURE_DELETE; Debian's has it on).
    db.execute("PRAGMA secure_delete = OFF")
    return db


def run(layout, events, batch, prune_conn, directory):
    spec = LAYOUTS[layout]
    path = os.path.join(directory, f"{layout}.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    writer = connect(path)
    writer.execute(spec["schema"])
    # Another session's few events, so the table is not one session's.
    writer.execute("BEGIN")
    for off in range(100):
        writer.execute(spec["insert"] + "(" + ",".join("?" * spec["cols"]) + ")",
                       spec["row"](KEY - 1, off, 0, "agent", message(off)))
    writer.execute("COMMIT")
    pruner = connect(path) if prune_conn == "other" else writer
    sqls = {}
    at = time.time_ns()
    start = time.process_time()
    wall = time.perf_counter()
    # Events go to SESSIONS sessions in turns of 64 (keys KEY, KEY + 1, ...),
    # each with its own offsets, count and prune.
    offsets = [0] * SESSIONS
    pruned = [0] * SESSIONS
    done = 0
    while done < events:
        take = min(batch, events - done)
        rows_by_key = []
        for i in range(take):
            s = ((done + i) // 64) % SESSIONS
            rows_by_key.append((s, offsets[s]))
            offsets[s] += 1
        writer.execute("BEGIN")
        for chunk in range(0, take, ROWS_PER_INSERT):
            part = rows_by_key[chunk:chunk + ROWS_PER_INSERT]
            n = len(part)
            sql = sqls.get(n)
            if sql is None:
                one = "(" + ",".join("?" * spec["cols"]) + ")"
                sql = sqls[n] = spec["insert"] + ",".join([one] * n) + " ON CONFLICT DO NOTHING"
            args = []
            for s, off in part:
                args.extend(spec["row"](KEY + s, off, at + off, "agent", message(off)))
            if layout != "none":
                writer.execute(sql, args)
        writer.execute("COMMIT")
        done += take
        for s in range(SESSIONS):
            count = offsets[s]
            if count > CAP:
                below = count - CAP
                if below >= pruned[s] + STEP:
                    pruner.execute(spec["prune"], spec["prune_args"](KEY + s, below))
                    pruned[s] = below
    cpu = time.process_time() - start
    elapsed = time.perf_counter() - wall
    stored = writer.execute("SELECT count(*) FROM events").fetchone()[0]
    size = os.path.getsize(path)
    writer.close()
    if pruner is not writer:
        pruner.close()
    return cpu, elapsed, stored, size


def main():
    global PAGE_SIZE, CAP, STEP, SESSIONS
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prune-conn", choices=["other", "same"], default="other")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--page-size", type=int, default=None)
    parser.add_argument("--cap", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("layouts", nargs="*", default=list(LAYOUTS))
    args = parser.parse_args()
    PAGE_SIZE = args.page_size
    CAP = args.cap
    STEP = max(CAP // 8, 1)
    SESSIONS = args.sessions
    directory = args.dir or tempfile.mkdtemp(prefix="events-bench-", dir="/work")
    print(f"sqlite {sqlite3.sqlite_version}, {args.events} events, batch {args.batch}, "
          f"prune on the {args.prune_conn} connection, "
          f"{SESSIONS} session(s), cap {CAP}, page size {PAGE_SIZE or 'default'}, "
          f"load {open('/proc/loadavg').read().split()[0]}")
    for round_ in range(args.rounds):
        for layout in args.layouts:
            cpu, elapsed, stored, size = run(layout, args.events, args.batch,
                                             args.prune_conn, directory)
            print(f"round {round_ + 1} {layout:20} cpu {cpu:6.2f} s "
                  f"({cpu / args.events * 1e6:5.2f} us/event) wall {elapsed:6.2f} s "
                  f"rows {stored} file {size >> 10} KiB", flush=True)
    if not args.dir:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
