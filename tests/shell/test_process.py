"""`rlshell.process.exit_process`: the status, the output, the threads and the atexit handlers
of a normal exit, without the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
import atexit, sys, threading, time
from pathlib import Path
from rlshell.process import exit_process

out = Path(sys.argv[1])

def late_writer():
    time.sleep(0.5)
    (out / "thread.txt").write_text("written after the main thread finished")

threading.Thread(target=late_writer).start()
atexit.register(lambda: (out / "atexit.txt").write_text(str((out / "thread.txt").exists())))
sys.stdout.write("buffered, no newline")
sys.stderr.write("also buffered")
exit_process(3)
"""


def test_exit_process_waits_for_threads_runs_atexit_and_flushes_then_exits_with_the_code(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        # Piped output is block-buffered: only a flush gets it out before os._exit.
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, no newline"
    assert done.stderr == "also buffered"
    # The thread that was still running finished before the atexit handlers ran.
    assert (tmp_path / "thread.txt").read_text() == "written after the main thread finished"
    assert (tmp_path / "atexit.txt").read_text() == "True"
