"""Running the checks: against one driver, each check on a fresh kubelet root of its own,
with every CSI call recorded by a relay, and a report a driver author can act on.

:func:`run_checks` is what ``kubevol driver e2e`` and the pytest plugin call::

    outcomes = run_checks(E2EConfig(endpoint="unix:///run/csi.sock"), out=sys.stdout)
    failed = any(o.status is Status.FAILED for o in outcomes)
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import TextIO

from kubevol.csi.client import CSIClient
from kubevol.csi.endpoint import parse_endpoint
from kubevol.csidriver.e2e import RecordingRelay
from kubevol.errors import KubevolError
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.testing.e2e.checks import CHECKS, Check
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped, Outcome, Status
from kubevol.testing.e2e.session import DriverInfo, E2EConfig, RestartDriver, Session
from kubevol.testing.mount_rig import unmount_all_under

#: Calls left out of a failure's report: they say what the driver can do, which the report
#: does not need repeated before every call.
QUIET = frozenset({"GetPluginInfo", "GetPluginCapabilities", "Probe",
                   "ControllerGetCapabilities", "NodeGetCapabilities"})


class E2EError(KubevolError, RuntimeError):
    """The suite could not run (the driver does not answer, the command does not start)."""


def selected(checks: Sequence[Check], expression: str) -> list[Check]:
    """The checks whose names match a ``-k`` expression: words (substrings of the name)
    joined by ``and``/``or``, each perhaps after ``not`` (``or`` binds loosest). Raises
    ValueError for an empty operand."""
    if not expression.strip():
        return list(checks)
    alternatives = [a.split(" and ") for a in f" {expression} ".split(" or ")]

    def term_matches(term: str, name: str) -> bool:
        words = term.split()
        negate = bool(words) and words[0] == "not"
        words = words[1:] if negate else words
        if len(words) != 1:
            raise ValueError(f"-k {expression!r}: {term.strip()!r} is not a word")
        return (words[0] in name) != negate

    return [c for c in checks
            if any(all(term_matches(t, c.name) for t in terms) for terms in alternatives)]


def run_check(check: Check, config: E2EConfig, *, relay: RecordingRelay, info: DriverInfo,
              root: str, restart: RestartDriver | None) -> Outcome:
    """Run one check on the kubelet root ``root``; its outcome (clean-up failures count)."""
    start = time.monotonic()
    mark = relay.mark()
    status, reason, expected, why = Status.PASSED, "", "", ""
    failure: CheckFailed | None = None
    session: Session | None = None
    try:
        if config.mock and check.data:
            raise CheckSkipped("the driver is a mock (--mock): this check needs the volume "
                               "mounted and keeping what the pod writes")
        session = Session(config, relay, info, root, restart)
        check.body(session)
    except CheckSkipped as exc:
        status, reason = Status.SKIPPED, str(exc)
    except CheckFailed as exc:
        failure = exc
    except KubevolError as exc:
        failure = CheckFailed(f"{type(exc).__name__}: {exc}", expected="no error",
                              why="the node side could not carry on")
    finally:
        if session is not None:
            try:
                session.close()
            except CheckFailed as exc:
                failure = failure or exc
            except KubevolError as exc:
                failure = failure or CheckFailed(
                    f"cleaning up failed: {exc}", expected="every pod and volume removed",
                    why="the kubelet tears down what it set up")
        unmount_all_under(root)
    if failure is not None:
        status, reason, expected, why = (Status.FAILED, failure.what, failure.expected,
                                         failure.why)
    return Outcome(
        name=check.name, mirrors=check.mirrors, status=status,
        seconds=time.monotonic() - start, reason=reason, expected=expected, why=why,
        calls=tuple(c for c in relay.calls_since(mark) if c.method not in QUIET)
        if status is Status.FAILED else (),
    )


@contextlib.contextmanager
def suite(config: E2EConfig) -> Iterator[tuple[RecordingRelay, DriverInfo, str]]:
    """The relay to the driver, what the driver advertises and the work directory (made,
    and removed afterwards, when ``config.work_dir`` is empty). E2EError when the driver
    does not answer."""
    work = config.work_dir or tempfile.mkdtemp(prefix="kubevol-e2e-")
    os.makedirs(work, mode=0o700, exist_ok=True)
    relay = RecordingRelay(config.endpoint, os.path.join(work, "relay.sock"))
    try:
        with CSIClient(relay.endpoint, timeout=config.timeout) as client:
            try:
                info = DriverInfo.read(client)
            except KubevolError as exc:
                raise E2EError(f"the driver at {config.endpoint} does not answer: {exc}") from exc
        yield relay, info, work
    finally:
        relay.close()
        unmount_all_under(work)
        if not config.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def run_checks(config: E2EConfig, *, out: TextIO, restart: RestartDriver | None = None,
               checks: Sequence[Check] = CHECKS) -> list[Outcome]:
    """Run the checks ``config.select`` picks, printing each outcome to ``out`` as it ends
    and a summary; the outcomes. Raises E2EError when the driver does not answer, ValueError
    for a bad ``select``."""
    chosen = selected(checks, config.select)
    start = time.monotonic()
    outcomes = []
    with suite(config) as (relay, info, work):
        print(f"kubevol driver e2e: driver {info.name} at {config.endpoint}, "
              f"{len(chosen)} checks, work directory {work}", file=out, flush=True)
        for n, check in enumerate(chosen):
            root = os.path.join(work, f"kubelet-{n}")
            outcome = run_check(check, config, relay=relay, info=info, root=root,
                                restart=restart)
            outcomes.append(outcome)
            print(outcome.describe(), file=out, flush=True)
    counts = {s: sum(o.status is s for o in outcomes) for s in Status}
    print(f"{counts[Status.PASSED]} passed, {counts[Status.FAILED]} failed, "
          f"{counts[Status.SKIPPED]} skipped in {time.monotonic() - start:.1f}s",
          file=out, flush=True)
    return outcomes


class E2ESuite:
    """The suite for a caller that runs the checks one by one (the pytest plugin): enter
    it, then :meth:`run` each check."""

    def __init__(self, config: E2EConfig, restart: RestartDriver | None = None) -> None:
        self.config = config
        self.restart = restart
        self._stack = contextlib.ExitStack()
        self._count = 0
        self._parts: tuple[RecordingRelay, DriverInfo, str] | None = None

    def __enter__(self) -> E2ESuite:
        self._parts = self._stack.enter_context(suite(self.config))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def run(self, check: Check) -> Outcome:
        """Run ``check`` on a kubelet root of its own; its outcome."""
        if self._parts is None:
            raise RuntimeError("enter the suite first")
        relay, info, work = self._parts
        self._count += 1
        root = os.path.join(work, f"kubelet-{self._count}")
        return run_check(check, self.config, relay=relay, info=info, root=root,
                         restart=self.restart)


# -- the driver's process and mount namespace ----------------------------------------------------


class DriverProcess:
    """The driver started by ``command`` (a shell command line), serving at ``endpoint``:
    :meth:`start` waits until it answers Probe, :meth:`restart` stops and starts it."""

    def __init__(self, command: str, endpoint: str, *, timeout: float = 30.0) -> None:
        self.command = command
        self.endpoint = endpoint
        self.timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it; E2EError when it exits or does not answer within the timeout."""
        self._proc = subprocess.Popen(["/bin/sh", "-c", self.command], start_new_session=True)
        deadline = time.monotonic() + self.timeout
        with CSIClient(self.endpoint, timeout=1.0) as client:
            while True:
                if self._proc.poll() is not None:
                    raise E2EError(f"--driver-command {shlex.quote(self.command)} exited with "
                                   f"{self._proc.returncode}")
                with contextlib.suppress(KubevolError):
                    if client.probe():
                        return
                if time.monotonic() > deadline:
                    raise E2EError(f"the driver started by --driver-command does not answer "
                                   f"at {self.endpoint} after {self.timeout:.0f}s")
                time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM its process group, then SIGKILL after 10 seconds. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self) -> None:
        """Stop, then start again."""
        self.stop()
        self.start()


def private_mounts() -> bool:
    """Whether this process's root mount propagates nothing (no ``shared:`` peer group):
    what ``unshare -m --propagation private`` leaves."""
    roots = [m for m in parse_mountinfo() if m.mount_point == "/"]
    return bool(roots) and not any(f.startswith("shared:") for f in roots[-1].optional_fields)


def mount_namespace(pid: int | str = "self") -> str:
    """The mount namespace of process ``pid`` (``mnt:[4026531841]``)."""
    return os.readlink(f"/proc/{pid}/ns/mnt")


def server_pid(endpoint: str) -> int | None:
    """The process serving unix socket ``endpoint`` (SO_PEERCRED), None for another kind
    of endpoint or when nobody listens."""
    parsed = parse_endpoint(endpoint)
    path = parsed.grpc_target.removeprefix("unix://").removeprefix("unix:")
    if parsed.grpc_target == path:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError:
            return None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid)
