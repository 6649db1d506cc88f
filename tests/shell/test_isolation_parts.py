"""Parts of the sandbox (`rlshell.isolation`) checked one by one.

The cgroup files the sandbox writes, on both kernels' layouts, against a directory laid
out as each hierarchy is: v1 is what these machines run, and the sandbox tests
(tests/shell/test_sandbox_attacks.py) use it for real; v2 is checked here by what it
writes, where, and in which order, since no machine here offers its controllers. And the
host check's probe of the calls' own namespaces, on a sandbox that withholds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlshell import isolation
from rlshell.isolation import CallCgroup, CgroupLayout, CgroupTree, Confinement, _bwrap_arguments


def _v2_tree(tmp_path: Path) -> CgroupTree:
    own = tmp_path / "v2" / "system.slice" / "trainer.service"
    own.mkdir(parents=True)
    return CgroupTree(CgroupLayout("v2", {"unified": own}), "rlstack-sandbox-x")


def test_on_v2_the_sandbox_lives_in_a_leaf_and_hands_its_controllers_down(tmp_path: Path) -> None:
    tree = _v2_tree(tmp_path)
    root = tree.dirs["unified"]
    # The kernel refuses processes in a cgroup whose subtree_control is set: the sandboxed
    # process joins the leaf, and the tree is what the sandbox sees as /sys/fs/cgroup.
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert tree.procs_files == [str(root / "server" / "cgroup.procs")]
    assert tree.binds() == ["--bind", str(root), "/sys/fs/cgroup"]
    tree.limit_processes(64)
    assert (root / "pids.max").read_text() == "64"  # the whole tree: leaf and calls
    # No cgroup namespace on v2 (rooted at the leaf, it would keep the server from moving
    # its calls into the leaf's siblings); on v1 the namespace is rooted at the tree.
    assert "--unshare-cgroup-try" not in _bwrap_arguments(Confinement(), tree, 3)


def test_on_v1_each_controller_has_its_directory_and_the_sandbox_a_cgroup_namespace(
    tmp_path: Path,
) -> None:
    own = {c: tmp_path / "v1" / c / "user.slice" for c in ("memory", "pids", "cpu", "freezer")}
    for path in own.values():
        path.mkdir(parents=True)
    tree = CgroupTree(CgroupLayout("v1", own), "rlstack-sandbox-y")
    assert tree.procs_files == [str(own[c] / "rlstack-sandbox-y" / "cgroup.procs") for c in own]
    assert "--unshare-cgroup-try" in _bwrap_arguments(Confinement(), tree, 3)


def test_a_call_cgroup_on_v2_sets_its_limits_and_is_killed_as_a_whole(tmp_path: Path) -> None:
    tree = _v2_tree(tmp_path)
    root = tree.dirs["unified"]  # bound at /sys/fs/cgroup in the sandbox
    call = CallCgroup("call-1", memory_bytes=2**28, max_processes=16, cpus=0.5, root=str(root))
    path = root / "call-1"
    assert call.version == "v2"
    assert call.dirs == [path]
    assert (path / "memory.max").read_text() == str(2**28)
    assert (path / "memory.swap.max").read_text() == "0"
    assert (path / "pids.max").read_text() == "16"
    assert (path / "cpu.max").read_text() == "50000 100000"
    (path / "cgroup.procs").write_text("")
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    call.kill(wait=False)
    assert (path / "cgroup.kill").read_text() == "1"  # one write ends every process in it
    assert not call.memory_hit()
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert call.memory_hit()
    assert call.reuse()  # empty: ready for the next call, its count of hits taken anew
    assert not call.memory_hit()


def test_a_sandbox_that_cannot_give_calls_their_namespaces_is_refused_naming_the_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isolation.isolation_problems() == []
    # The probe's call loses CAP_SYS_ADMIN first, as in a sandbox whose host withholds it
    # from the server: the real namespace setup then fails, and the host check says so.
    without = (
        "from rlshell.isolation import SERVER_CAPABILITIES as CAPS, _capset\n"
        "        keep = sum(1 << b for n, b in CAPS.items() if n != 'CAP_SYS_ADMIN')\n"
        "        _capset(keep, keep, 0)\n"
        "        enter_call_namespaces("
    )
    probe = isolation._CALL_PROBE.replace("enter_call_namespaces({", without + "{", 1)
    assert probe != isolation._CALL_PROBE
    monkeypatch.setattr(isolation, "_CALL_PROBE", probe)
    (problem,) = isolation.isolation_problems()
    assert problem.startswith("call namespaces: the sandbox started, but could not give a call")
    assert "unshare of the call's namespaces (mnt, pid, net, ipc, uts) failed" in problem
    assert "Operation not permitted" in problem
    assert "or opt out with isolation='weak'" in problem
