"""Servers for tests/shell/test_process_pool.py: each is what a pooled process runs,
``server(conn, behaviour, marker)``; ``behaviour`` says how it answers a call."""

from __future__ import annotations

import os
import pickle
import time
from multiprocessing.connection import Connection
from pathlib import Path

from rlshell.process_pool import receive_message, send_message


class WritesAFile:
    """Unpickling this writes ``path``: what a forged pickle could make a reader do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.path), "the payload ran"))  # type: ignore[return-value]


def server(conn: Connection, behaviour: str, marker: str) -> None:
    """Answer each call of a request ``["double", [n, ...]]`` with ``["answer", 2 n]``,
    except where ``behaviour`` says otherwise for n == 7."""
    if behaviour == "fail_start":
        send_message(conn, ["failed", "no such tool: nope"])
        return
    if behaviour == "never_ready":
        time.sleep(60)
        return
    send_message(conn, ["ready"])
    while True:
        try:
            _, numbers = receive_message(conn)
        except (EOFError, OSError):
            return
        for n in numbers:
            if n == 7 and behaviour == "pickle":
                # A forged message: pickle bytes where JSON is expected.
                conn.send_bytes(pickle.dumps(WritesAFile(marker)))
                continue
            if n == 7 and behaviour == "shape":
                send_message(conn, ["answer", "not a number"])
                continue
            if n == 7 and behaviour == "hang":
                time.sleep(60)
            if n == 7 and behaviour == "exit":
                os._exit(3)
            if n == 7 and behaviour == "huge":
                conn.send_bytes(b"[" + b" " * (65 * 2**20) + b"]")
                continue
            send_message(conn, ["answer", 2 * n])
