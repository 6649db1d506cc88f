"""A Ray worker of the shared test cluster, forked from a warm zygote instead of started cold.

    python -I tests/worker_client.py SOCKET default_worker.py ARGS...

Ray runs this as the workers' Python (the job's ``runtime_env`` ``py_executable``, which
`tests/launcher.py` gives the runs it puts on the shared cluster). It asks the workers'
zygote listening on ``SOCKET`` (`tests/zygote.py`) to fork ``python default_worker.py
ARGS...`` with this process's environment, working directory, standard streams and CPU
affinity, and waits for it: the worker then starts with torch, transformers and the rest
imported (not Ray or rlshell, `tests/launcher.py` says why), and the raylet sees the
worker's own pid when it registers. Where the zygote would not start it as a fresh
interpreter would (a variable read at import differs), it answers why and this process
becomes the worker itself, cold (``execv``).

Standard library only: this runs before every worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys


def main() -> None:
    path, script, *args = sys.argv[1:]
    argv = [sys.executable, script, *args]
    status_read, status_write = os.pipe()
    request = {
        "argv": argv,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "ray": None,
        "worker": os.getpid(),  # the fork ends when this process does
        "cpus": sorted(os.sched_getaffinity(0)),  # and runs on the cores this one may use
    }
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.connect(path)
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2, status_write])
            answer = json.loads(conn.recv(1 << 16) or b'{"cold": "the zygote is gone"}')
    except OSError as error:
        answer = {"cold": f"the zygote cannot be reached: {error}"}
        try:  # where the zygote notes each start (its log, beside its socket)
            with open(os.path.join(os.path.dirname(path), "starts"), "a") as log:
                log.write(f"cold ({answer['cold']})\n")
        except OSError:
            pass
    os.close(status_write)
    if "pid" not in answer:
        os.close(status_read)
        os.execv(sys.executable, argv)
    pid = int(answer["pid"])
    for forwarded in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(forwarded, lambda number, _frame: os.kill(pid, number))
    status = b""
    while True:
        try:
            chunk = os.read(status_read, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        status += chunk
    code = int(status or b"1")
    if code < 0:  # died of a signal: so does this process, as the raylet would have seen it
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # (their handlers cannot be set)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    main()
