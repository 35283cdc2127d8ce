"""Covers kubevol.node.rootlock.

RootLock: one writer per root, waiting with a message or failing clearly; released when
its holder dies (issue 20, point 11)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kubevol.errors import KubevolError
from kubevol.node.rootlock import RootBusyError, RootLock, lock_path


def hold_in_child(root: Path) -> subprocess.Popen[str]:
    """Another process holding the lock until killed; returns once it holds it."""
    code = textwrap.dedent(f"""\
        import time
        from kubevol.node.rootlock import RootLock
        with RootLock({str(root)!r}):
            print("held", flush=True)
            time.sleep(600)
        """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_holder_gives_up_naming_the_first(tmp_path: Path) -> None:
    """With a timeout the waiter says once who holds it, then fails with RootBusyError."""
    child = hold_in_child(tmp_path)
    try:
        messages: list[str] = []
        started = time.monotonic()
        with pytest.raises(RootBusyError, match=f"process {child.pid}"):
            RootLock(str(tmp_path), timeout=0.3, on_wait=messages.append).acquire()
        assert 0.3 <= time.monotonic() - started < 5
        assert messages == [f"waiting for root {tmp_path}, in use by process {child.pid}"]
        with pytest.raises(RootBusyError):
            RootLock(str(tmp_path), timeout=0).acquire()
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    """SIGKILL of the holder frees the root at once: the lock file left behind is harmless."""
    child = hold_in_child(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.stdout is not None
    child.stdout.close()
    assert os.path.exists(lock_path(str(tmp_path)))
    with RootLock(str(tmp_path), timeout=5) as lock:
        assert lock.held
        assert Path(lock_path(str(tmp_path))).read_text() == f"{os.getpid()}\n"
    assert not lock.held


def test_a_waiter_gets_the_lock_when_it_is_released(tmp_path: Path) -> None:
    """Waiting without a limit ends when the holder goes."""
    child = hold_in_child(tmp_path)
    waiting = threading.Event()
    lock = RootLock(str(tmp_path), timeout=None, on_wait=lambda _: waiting.set())
    thread = threading.Thread(target=lock.acquire)
    thread.start()
    try:
        assert waiting.wait(10)
        assert not lock.held
    finally:
        child.kill()
        child.wait()
        thread.join(10)
        assert child.stdout is not None
        child.stdout.close()
    assert lock.held
    lock.release()


def test_holders_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    """flock is per open file: two RootLock objects of one process still exclude."""
    with RootLock(str(tmp_path)), pytest.raises(RootBusyError):
        RootLock(str(tmp_path), timeout=0).acquire()
    with RootLock(str(tmp_path), timeout=0):
        pass


def test_a_root_that_is_a_file_is_one_clear_error(tmp_path: Path) -> None:
    """No traceback from makedirs: a KubevolError naming the root."""
    (tmp_path / "root").write_text("not a directory")
    with pytest.raises(KubevolError, match="cannot lock root"):
        RootLock(str(tmp_path / "root")).acquire()


def test_a_state_dir_that_is_a_file_is_one_clear_error(tmp_path: Path) -> None:
    """``<root>/kubevol`` a file: said so, not "File exists"."""
    (tmp_path / "kubevol").write_text("not a directory")
    with pytest.raises(KubevolError, match="kubevol is not a directory"):
        RootLock(str(tmp_path)).acquire()
