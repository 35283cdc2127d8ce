"""The GlusterFS test server (kubevol.testing.glusterfs) against the real thing: a real
fuse.glusterfs mount backed by its brick, the faults it offers doing what its docstring says
to a stat below the mount (a frozen client hangs it, a frozen brick hangs then fails it, a
killed brick fails it), and a cleanup that leaves nothing behind, frozen or not."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.testing import glusterfs as glusterfs_module
from kubevol.testing.glusterfs import GlusterError, GlusterServer
from kubevol.testing.mount_rig import mounts_under

pytestmark = pytest.mark.root


class StatCall:
    """``os.stat(path)`` on a daemon thread: a stat below a dead mount may never return, and
    a daemon thread never keeps the test process from exiting."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: OSError | None = None
        self.seconds = 0.0
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            os.stat(self.path)
        except OSError as exc:
            self.error = exc
        finally:
            self.seconds = time.monotonic() - self._started

    def wait(self, timeout: float) -> bool:
        """Whether the stat returned within ``timeout`` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def comm(pid: int) -> str:
    """The command name of process ``pid``."""
    return Path(f"/proc/{pid}/comm").read_text().strip()


def stat_answers(path: Path) -> bool:
    """Whether a stat of ``path`` succeeds within 5 s (on a daemon thread)."""
    call = StatCall(path)
    return call.wait(5) and call.error is None


def test_the_volume_is_a_real_fuse_glusterfs_mount(glusterfs: GlusterServer) -> None:
    """The fixture's mount is in /proc/self/mountinfo as fuse.glusterfs of the server's
    loopback address and volume, served by a glusterfs client process."""
    entries = [e for e in parse_mountinfo() if e.mount_point == str(glusterfs.mount_point)]
    assert [(e.fs_type, e.source) for e in entries] == [
        ("fuse.glusterfs", f"{glusterfs.address}:{glusterfs.volume}")
    ]
    assert glusterfs.address.startswith("127.")
    assert comm(glusterfs.client_pid()) == "glusterfs"
    assert [comm(pid) for pid in glusterfs.brick_pids()] == ["glusterfsd"]


def test_a_file_written_through_the_mount_is_in_the_brick(glusterfs: GlusterServer) -> None:
    """What a client writes lands in the brick directory on the server's tmpfs."""
    (glusterfs.mount_point / "dir").mkdir()
    (glusterfs.mount_point / "dir" / "file").write_text("through gluster")
    assert (glusterfs.brick / "dir" / "file").read_text() == "through gluster"


def test_mount_helper_mounts_the_same_volume(glusterfs: GlusterServer, tmp_path: Path) -> None:
    """``mount -t glusterfs ADDRESS:/VOLUME`` (as a CSI driver mounts) gives a second
    fuse.glusterfs mount of the same volume, whose daemonized client is found by PID."""
    (glusterfs.mount_point / "shared").write_text("one volume")
    second = tmp_path / "second"
    pid = glusterfs.mount(second, helper=True)
    assert pid != glusterfs.client_pid()
    assert comm(pid) == "glusterfs"
    assert glusterfs.mount_points == [glusterfs.mount_point, second]
    assert any(e.mount_point == str(second) and e.fs_type == "fuse.glusterfs"
               for e in parse_mountinfo())  # fmt: skip
    assert (second / "shared").read_text() == "one volume"


def test_freeze_returns_once_every_thread_of_the_client_has_stopped(
    glusterfs: GlusterServer,
) -> None:
    """kill(SIGSTOP) returns before the client's threads stop, and a thread not yet stopped
    may still answer a stat; freeze waits for them all (ten tries: without the wait, about
    half of the tries see a thread still running)."""
    pid = glusterfs.client_pid()
    for _ in range(10):
        glusterfs.freeze()
        states = {
            task: (Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0])
            for task in os.listdir(f"/proc/{pid}/task")
        }
        glusterfs.thaw()
        assert set(states.values()) <= {"T", "t"}, f"threads of the client not stopped: {states}"


def test_a_frozen_client_hangs_a_stat_until_thawed(glusterfs: GlusterServer) -> None:
    """With the FUSE client stopped, a stat of the mount point does not return (no timeout
    applies); once thawed, it returns normally."""
    glusterfs.freeze()
    call = StatCall(glusterfs.mount_point)
    assert not call.wait(2), "a stat below a frozen client returned"
    glusterfs.thaw()
    assert call.wait(10), "the stat did not return after thaw"
    assert call.error is None


def test_a_frozen_brick_hangs_a_stat_then_fails_it(glusterfs: GlusterServer) -> None:
    """With the brick stopped, a stat hangs until the client's ping timer (ping_timeout=2)
    gives up on the brick, then fails with ENOTCONN; after thaw the client reconnects and
    stats succeed again."""
    glusterfs.freeze(clients=False, bricks=True)
    call = StatCall(glusterfs.mount_point / "probe")
    assert not call.wait(1), "a stat below a frozen brick returned at once"
    assert call.wait(30), "a stat below a frozen brick hung past the ping timeout"
    assert call.error is not None
    assert call.error.errno == errno.ENOTCONN
    assert call.seconds >= glusterfs.ping_timeout
    glusterfs.thaw()
    deadline = time.monotonic() + 30
    while not stat_answers(glusterfs.mount_point):
        assert time.monotonic() < deadline, "the mount did not recover after thaw"
        time.sleep(0.2)


def test_a_stopped_server_fails_stats_with_enotconn(glusterfs: GlusterServer) -> None:
    """Once the brick is killed, a stat of the mount point and below it fails with ENOTCONN
    at once, not after a timeout."""
    glusterfs.stop_server()
    assert glusterfs.brick_pids() == []
    for path in (glusterfs.mount_point, glusterfs.mount_point / "probe"):
        call = StatCall(path)
        assert call.wait(5), f"a stat of {path} hung on a stopped server"
        assert call.error is not None
        assert call.error.errno == errno.ENOTCONN


def host_state() -> dict[str, int]:
    """Every path below the host's GlusterFS directories with its modification time."""
    state = {}
    for top in glusterfs_module.HOST_DIRS:
        for root, dirs, files in os.walk(top):
            for name in [".", *dirs, *files]:
                path = os.path.join(root, name)
                state[path] = os.lstat(path).st_mtime_ns
    return state


def test_cleanup_undoes_everything_even_when_frozen(tmp_path: Path) -> None:
    """cleanup() of a server with a mount, frozen client and brick and a stat hung below the
    mount: the stat returns, glusterd, the brick and the client are gone, nothing is mounted
    below the base directory, which is removed; the host's GlusterFS directories are left as
    they were (the server never wrote there)."""
    before = host_state()
    server = GlusterServer(tmp_path / "g")
    try:
        server.start()
        client = server.mount(server.base_dir / "mnt")
        glusterd, bricks = server.glusterd_pid, server.brick_pids()
        server.freeze(clients=True, bricks=True)
        call = StatCall(server.mount_point)
        assert not call.wait(0.5)
    finally:
        server.cleanup()
    assert call.wait(10), "the hung stat did not return after cleanup"
    for pid in [client, glusterd, *bricks]:
        assert pid is not None
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert mounts_under(tmp_path) == []
    assert not server.base_dir.exists()
    assert host_state() == before
    server.cleanup()  # idempotent


def test_start_without_glusterfs_names_the_install_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the GlusterFS programs, start() fails naming the script that installs them,
    and creates nothing."""
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(GlusterError, match=r"scripts/install-system-deps\.sh"):
        GlusterServer(tmp_path / "g").start()
    assert not (tmp_path / "g").exists()


def test_start_leaves_an_existing_directory_alone(tmp_path: Path) -> None:
    """start() in a base directory that already holds one of its directories refuses, and
    neither removes nor unmounts what was there."""
    (tmp_path / "g" / "bricks").mkdir(parents=True)
    (tmp_path / "g" / "bricks" / "data").write_text("theirs")
    with pytest.raises(GlusterError, match="exists"):
        GlusterServer(tmp_path / "g").start()
    assert (tmp_path / "g" / "bricks" / "data").read_text() == "theirs"
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["bricks"]
