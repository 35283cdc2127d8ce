"""The last line of defence (:mod:`kubevol.node.holders`) on real processes and real mount
namespaces: who has a working directory, an open file or a mount under a path."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.node.holders import (
    CWD,
    MOUNT,
    OPEN_FILE,
    Holders,
    HoldersOnce,
    VolumeHeldError,
)

#: A child that opens ARGV[1] (keeps it open), says so, then waits to be killed.
_HOLD_OPEN = (
    "import sys, time; f = open(sys.argv[1], 'rb'); print('ready', flush=True); time.sleep(600)"
)


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", line


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; each killed (by its PID) and reaped afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _spawn(children: list[subprocess.Popen[str]], argv: list[str], **kw: object) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]
    children.append(proc)
    _wait_ready(proc)
    return int(proc.pid)


def _in_other_namespace(
    children: list[subprocess.Popen[str]], propagation: str, script: str
) -> int:
    """A shell in a new mount namespace (made with ``propagation``) that runs ``script``
    then says ready and waits; its PID."""
    return _spawn(children, [
        "unshare", "-m", f"--propagation={propagation}", "sh", "-c",
        f"{script} && echo ready && exec sleep 600",
    ])


def test_a_working_directory_and_an_open_file_are_named_with_pid_and_command(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A ``sleep`` whose cwd is below the path and a process with a file open below it
    are both named (PID and command); a sibling path nobody holds is free."""
    pods = tmp_path / "pods"
    (pods / "a" / "deep").mkdir(parents=True)
    # "a.b" sorts between "a" and "a/...": a sibling, not below "a".
    (pods / "a.b").mkdir()
    (pods / "a.b" / "data").write_text("x")
    (pods / "c").mkdir()
    sleeper = _spawn(
        children, ["sh", "-c", "echo ready; exec sleep 600"], cwd=pods / "a" / "deep"
    )
    holder = _spawn(children, [sys.executable, "-c", _HOLD_OPEN, str(pods / "a.b" / "data")])
    holders = Holders.take(str(pods))
    [cwd] = holders.of(str(pods / "a"))
    assert (cwd.pid, cwd.comm, cwd.what) == (sleeper, "sleep", CWD)
    assert cwd.path == os.path.realpath(pods / "a" / "deep")
    [opened] = holders.of(str(pods / "a.b"))
    assert (opened.pid, opened.what) == (holder, OPEN_FILE)
    assert f"process {holder} (" in str(opened)
    assert holders.of(str(pods / "c")) == []
    with pytest.raises(VolumeHeldError) as err:
        holders.refuse("tear down", [str(pods / "c"), str(pods / "a")])
    assert err.value.path == os.path.realpath(pods / "a")
    assert f"process {sleeper} (sleep) has its working directory" in str(err.value)
    assert "left in place" in str(err.value)


def test_the_calling_process_is_not_a_holder(tmp_path: Path) -> None:
    """kubevol holds descriptors of what it removes: its own process is left out."""
    (tmp_path / "f").write_text("x")
    with open(tmp_path / "f", "rb"):
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert Holders.take(str(tmp_path)).of(str(tmp_path)) == []
        finally:
            os.close(fd)


def test_a_deleted_file_still_open_holds_its_directory(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """An open file unlinked since still pins the directory's filesystem."""
    (tmp_path / "gone").write_text("x")
    pid = _spawn(children, [sys.executable, "-c", _HOLD_OPEN, str(tmp_path / "gone")])
    os.unlink(tmp_path / "gone")
    assert [h.pid for h in Holders.take(str(tmp_path)).of(str(tmp_path))] == [pid]


@pytest.mark.root
def test_a_mount_only_another_namespace_sees_is_named_by_namespace(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A tmpfs mounted below the path in a private namespace of a child (this namespace
    does not see it) refuses the path, naming the namespace's inode and a PID in it."""
    (tmp_path / "vol" / "sub").mkdir(parents=True)
    (tmp_path / "free").mkdir()
    pid = _in_other_namespace(
        children, "private", f"mount -t tmpfs none {tmp_path}/vol/sub"
    )
    assert not os.path.ismount(tmp_path / "vol" / "sub")  # not in this namespace
    holders = Holders.take(str(tmp_path))
    held = [h for h in holders.of(str(tmp_path / "vol")) if h.what == MOUNT]
    ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
    sub = os.path.realpath(tmp_path / "vol" / "sub")
    assert [(h.mnt_ns, h.path) for h in held] == [(ns, sub)]
    assert f"mount namespace mnt:[{ns}]" in str(held[0])
    assert holders.of(str(tmp_path / "free")) == []


@pytest.fixture
def shared_mount(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs at tmp_path/vol made shared in this namespace (a peer group of its own)."""
    vol = tmp_path / "vol"
    vol.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(vol)], check=True)
    subprocess.run(["mount", "--make-shared", str(vol)], check=True)
    try:
        yield vol
    finally:
        subprocess.run(["umount", "-l", str(vol)], check=False)


@pytest.mark.root
@pytest.mark.parametrize(("propagation", "held"), [
    ("private", True), ("slave", False), ("unchanged", False),
])
def test_a_copy_of_our_mount_holds_it_unless_our_unmount_propagates_to_it(
    shared_mount: Path, children: list[subprocess.Popen[str]], propagation: str, held: bool
) -> None:
    """A namespace made after the volume was mounted has a copy of it. A private copy
    keeps the volume alive after our unmount: a holder. A slave or peer copy goes away with
    our unmount (a CSI driver's namespace with bidirectional propagation): not one."""
    pid = _in_other_namespace(children, propagation, "true")
    found = [h for h in Holders.take(str(shared_mount)).of(str(shared_mount))
             if h.pid == pid]
    assert bool(found) is held, found


@pytest.mark.root
def test_a_bind_of_the_volume_elsewhere_in_another_namespace_holds_it(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A container's view: another namespace binds the volume's directory at a path of its
    own (not below ours); it still shows our data, so the volume is held."""
    (tmp_path / "vol" / "data").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    pid = _in_other_namespace(
        children, "private", f"mount --bind {tmp_path}/vol/data {tmp_path}/elsewhere"
    )
    [held] = [h for h in Holders.take(str(tmp_path / "vol")).of(str(tmp_path / "vol"))
              if h.pid == pid]
    assert held.what == MOUNT and held.path == os.path.realpath(tmp_path / "elsewhere")


@pytest.mark.root
def test_a_slave_bind_of_a_shared_volume_elsewhere_still_holds_it(
    shared_mount: Path, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A slave namespace (our unmount propagates to its copy) that also binds the volume
    at a path of its own, as a container runtime does: the bind is a slave of the same
    peer group, but our unmount does not reach it: a holder, named by its bind."""
    (tmp_path / "elsewhere").mkdir()
    pid = _in_other_namespace(
        children, "slave", f"mount --bind {shared_mount} {tmp_path}/elsewhere"
    )
    [held] = [h for h in Holders.take(str(shared_mount)).of(str(shared_mount))
              if h.pid == pid]
    assert held.path == os.path.realpath(tmp_path / "elsewhere")


def test_one_snapshot_per_batch_taken_only_when_asked(tmp_path: Path) -> None:
    """HoldersOnce walks /proc at most once, and not at all when nothing asks."""
    taken: list[Holders] = []

    def take() -> Holders:
        taken.append(Holders.take(str(tmp_path)))
        return taken[-1]

    once = HoldersOnce(take)
    assert taken == []
    first = once.get()
    assert once.get() is first and len(taken) == 1


@pytest.mark.root
def test_a_proc_tree_is_read_for_links_and_descriptors_and_unreadable_ones_counted(
    tmp_path: Path,
) -> None:
    """Over a proc-shaped tree: a cwd link and a descriptor of a deleted file below the
    path are found (the kernel's " (deleted)" suffix dropped), with the command name; a
    process whose descriptors may not be listed is counted as not inspected (so a plan made
    without root can say it may miss refusals), one that exited meanwhile is not."""
    under = tmp_path / "pods"
    (under / "a").mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "mnt").write_text("")
    (proc / "self" / "mountinfo").write_bytes(Path("/proc/self/mountinfo").read_bytes())
    for pid in ("100", "101"):
        (proc / pid / "ns").mkdir(parents=True)
        os.link(proc / "self" / "ns" / "mnt", proc / pid / "ns" / "mnt")  # our namespace
        (proc / pid / "root").symlink_to("/")
        (proc / pid / "comm").write_text("worker\n")
    (proc / "100" / "cwd").symlink_to(under / "a")
    (proc / "100" / "fd").mkdir()
    (proc / "100" / "fd" / "0").symlink_to("/dev/null")
    (proc / "100" / "fd" / "3").symlink_to(f"{under}/b/log (deleted)")
    (proc / "101" / "fd").mkdir(mode=0)  # listing refused: not inspected
    (proc / "102").mkdir()  # exited while walked: nothing to list, but no one to inspect
    holders = Holders.take(str(under), proc=str(proc))
    assert [(h.pid, h.comm, h.what) for h in holders.of(str(under / "a"))] == [
        (100, "worker", CWD)]
    assert [(h.what, h.path) for h in holders.of(str(under / "b"))] == [
        (OPEN_FILE, f"{under}/b/log")]
    assert holders.namespaces == []
    assert holders.uninspected == 0  # root reads everything; 102 simply exited
    # Without the capabilities that let root read any directory, 101's are refused.
    script = ("import sys; from kubevol.node.holders import Holders; "
              "print(Holders.take(sys.argv[1], proc=sys.argv[2]).uninspected)")
    out = subprocess.run(
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c",
         script, str(under), str(proc)], capture_output=True, text=True, check=True,
    ).stdout
    assert out.strip() == "1"
