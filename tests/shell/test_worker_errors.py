"""Worker errors without a cluster: the failure record, pickling, the cleaned traceback, imports.

tests/shell/test_worker.py raises these through real Ray workers; here they are
built directly, as `rlshell.cluster.group` builds them, to prove what the split
into worker / group / errors modules has to keep: the record travels with the
error, errors.py stands without Ray, and the frames the traceback cleaner drops
are the ones worker_base.py's start-up hooks add.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

from rlshell.cluster.errors import (
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
    WorkerTimeoutError,
    clean_traceback,
    remote_traceback,
    worker_error_for,
)


class CodedError(Exception):
    """A worker's exception with a constructor of its own and a field."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code


def failure_of(cause: BaseException | None) -> WorkerFailure:
    return WorkerFailure(
        component="actor",
        rank=1,
        node="10.0.0.2",
        pid=4242,
        method="run_training",
        remote_traceback='Traceback (most recent call last):\n  File "w.py", line 3, in f\n',
        cause=cause,
    )


def test_the_failure_record_round_trips_through_pickling() -> None:
    failure = failure_of(CodedError(7, "no shard"))
    copy = pickle.loads(pickle.dumps(failure))
    assert copy == failure  # every field but the cause, which compares by identity
    assert isinstance(copy.cause, CodedError)
    assert (copy.cause.args, copy.cause.code) == ((7, "no shard"), 7)
    assert failure.where == "component 'actor' rank 1 (node 10.0.0.2, pid 4242)"
    assert WorkerFailure(component="env", rank=0).where == "component 'env' rank 0 (node ?)"


def test_an_error_for_a_worker_exception_is_both_types_and_pickles_with_its_record() -> None:
    failure = failure_of(FileNotFoundError(2, "No such file or directory", "/data/shard-0"))
    error = worker_error_for(failure, "component 'actor' rank 1 raised")
    assert isinstance(error, FileNotFoundError)
    assert isinstance(error, WorkerError)
    for raised in (error, pickle.loads(pickle.dumps(error))):
        assert isinstance(raised, FileNotFoundError)
        assert isinstance(raised, WorkerError)
        assert raised.failure == failure
        assert str(raised) == "component 'actor' rank 1 raised"
        assert (raised.errno, raised.filename) == (2, "/data/shard-0")
        assert (raised.component, raised.rank, raised.node, raised.pid, raised.method) == (
            "actor",
            1,
            "10.0.0.2",
            4242,
            "run_training",
        )
        assert raised.remote_traceback == failure.remote_traceback

    coded = pickle.loads(pickle.dumps(worker_error_for(failure_of(CodedError(42, "x")), "m")))
    assert isinstance(coded, CodedError)
    assert isinstance(coded, WorkerError)
    assert coded.code == 42  # a custom field reads through to the cause
    assert isinstance(coded.cause, CodedError)


def test_plain_worker_errors_pickle_with_their_record() -> None:
    died = WorkerDiedError("rank 1 died", failure_of(None))
    copy = pickle.loads(pickle.dumps(died))
    assert type(copy) is WorkerDiedError
    assert (str(copy), copy.failure) == ("rank 1 died", died.failure)

    late = WorkerTimeoutError(
        "sleep() did not finish",
        WorkerFailure(component="actor", method="sleep"),
        pending_ranks=(0, 1),
        timeout_s=0.2,
    )
    copy_late = pickle.loads(pickle.dumps(late))
    assert isinstance(copy_late, WorkerTimeoutError)
    assert isinstance(copy_late, TimeoutError)
    assert (copy_late.method, copy_late.rank, copy_late.pending_ranks, copy_late.timeout_s) == (
        "sleep",
        None,
        (0, 1),
        0.2,
    )
    bare = WorkerError("no record")
    assert (bare.component, bare.rank, bare.cause) == ("", None, None)


def test_extend_message_adds_to_what_str_shows_not_to_the_notes() -> None:
    for error in (
        WorkerDiedError("rank 0 died", failure_of(None)),
        worker_error_for(failure_of(ValueError("bad batch")), "rank 0 died"),
    ):
        error.extend_message("\nIt was stepping envs.")
        assert str(error) == "rank 0 died\nIt was stepping envs."
        assert not hasattr(error, "__notes__")
        assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_the_cleaner_drops_the_frames_of_worker_start_up_hooks() -> None:
    from rlshell.cluster.worker import Worker
    from rlshell.cluster.worker_base import HOOK_FILE, HOOK_FRAMES, actor_class

    # The file worker_base.py names is the one holding both hooks.
    assert Worker._rlshell_ready.__code__.co_filename.endswith(HOOK_FILE)
    assert actor_class.__code__.co_filename.endswith(HOOK_FILE)
    hook = os.path.join("/site", HOOK_FILE)
    ray_text = (
        "\x1b[36mray::FragileWorker.__init__()\x1b[39m (pid=123, ip=10.0.0.2, actor_id=ab)\n"
        f'  File "{hook}", line 160, in _rlshell_ready\n'
        "    raise startup_error\n"
        f'  File "{hook}", line 210, in __init__\n'
        "    worker_cls.__init__(self, *args, **kwargs)\n"
        '  File "/repo/tests/fragile.py", line 9, in __init__\n'
        '    raise KeyError("checkpoint_dir")\n'
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "KeyError: 'checkpoint_dir'\n"
    )
    expected = (
        "Traceback (most recent call last):\n"
        '  File "/repo/tests/fragile.py", line 9, in __init__\n'
        '    raise KeyError("checkpoint_dir")\n'
        "KeyError: 'checkpoint_dir'"
    )
    assert remote_traceback(ray_text, HOOK_FILE, HOOK_FRAMES) == (expected, 123, "10.0.0.2")
    # The same frames in another file are the user's and stay.
    kept = clean_traceback(ray_text, "rlshell/cluster/group.py", HOOK_FRAMES)
    assert "in _rlshell_ready" in kept


def test_errors_stand_without_ray_and_worker_without_group() -> None:
    code = (
        "import sys\n"
        "import rlshell.cluster.errors\n"
        "print(sorted(m for m in ('ray', 'torch', 'rlshell.cluster.worker', "
        "'rlshell.cluster.group') if m in sys.modules))\n"
        "import rlshell.cluster.worker\n"
        "print('rlshell.cluster.group' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.split("\n")[:2] == ["[]", "False"]
