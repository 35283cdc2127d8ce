"""Every exit code of ``kubevol``'s documented table (:mod:`kubevol.cli.exits`) against what
the commands do: bad input is 64 wherever it is given, a pod that is not there is 1 as
kubectl's NotFound, a bug is 70, SIGINT 130, a reader gone 141; a signal ends the wait for
a root held by another process at once, in one-shot commands and in the agent."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.testing.mount_rig import KubeletTree, MountRig

KUBEVOL = [sys.executable, "-m", "kubevol.cli.main"]
UID = "11111111-2222-3333-4444-555555555555"

POD_WITH_TYPO = f"""
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: shop, uid: {UID}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes:
  - {{name: cache, emtpyDir: {{}}}}
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A kubelet-style root (its pods/ directory exists)."""
    path = tmp_path / "root"
    (path / "pods").mkdir(parents=True)
    return path


def _usage_cases(tmp: Path, root: Path) -> list[tuple[str, list[str]]]:
    (tmp / "typo.yaml").write_text(POD_WITH_TYPO)
    (tmp / "file").write_text("")
    r = ["--root", str(root)]
    return [
        ("a missing manifest", ["up", *r, str(tmp / "missing.yaml")]),
        ("--csi-driver without =", ["up", *r, "--csi-driver", "nosuch"]),
        ("--csi-driver with a bad endpoint", ["up", *r, "--csi-driver", "d=tcp://host"]),
        ("--node-label without =", ["up", *r, "--node-label", "foo"]),
        ("--pod-gone without --repair", ["reconstruct", *r, "--pod-gone", "x"]),
        ("--manifests not a directory", ["agent", *r, "--manifests", str(tmp / "file")]),
        ("a port past 65535", ["agent", *r, "--metrics-address", "127.0.0.1:99999"]),
        ("a typo in a volume source", ["up", *r, str(tmp / "typo.yaml")]),
        ("down of nothing named", ["down", *r]),
        ("a bad jsonpath template", ["status", *r, "-o", "jsonpath={.a[[}"]),
        ("status of a root that does not exist", ["status", "--root", str(tmp / "nope")]),
        ("reconstruct of a root that does not exist", ["reconstruct", "--root", str(tmp / "no")]),
        ("down on a root that does not exist", ["down", "--root", str(tmp / "no"),
                                                "--pod-uid", UID]),
        ("status of a directory that is no kubelet root", ["status", "--root", str(tmp)]),
        ("csi-drivers of a root that does not exist", ["csi-drivers", "list", "--root",
                                                       str(tmp / "no")]),
    ]


USAGE_NAMES = [
    "a missing manifest", "--csi-driver without =", "--csi-driver with a bad endpoint",
    "--node-label without =", "--pod-gone without --repair", "--manifests not a directory",
    "a port past 65535", "a typo in a volume source", "down of nothing named",
    "a bad jsonpath template", "status of a root that does not exist",
    "reconstruct of a root that does not exist", "down on a root that does not exist",
    "status of a directory that is no kubelet root",
    "csi-drivers of a root that does not exist",
]


@pytest.mark.root
@pytest.mark.parametrize("case", USAGE_NAMES)
def test_bad_input_exits_64_naming_it(
    case: str, tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad flag value or input file is a usage error (64), with one line saying what
    was wrong, and the root is left as it was."""
    argv = dict(_usage_cases(tmp_path, root))[case]
    before = sorted(os.listdir(root))
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal of a flag's value
        code = int(exc.code or 0)
    assert code == exits.USAGE, capsys.readouterr().err
    err = capsys.readouterr().err
    assert err.strip(), "no reason given"
    assert sorted(os.listdir(root)) == before


@pytest.mark.root
def test_a_typo_in_a_volume_source_names_the_field(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``emtpyDir`` is an unknown field, with the source it is probably meant to be."""
    (tmp_path / "typo.yaml").write_text(POD_WITH_TYPO)
    assert main(["up", "--root", str(root), str(tmp_path / "typo.yaml")]) == exits.USAGE
    err = capsys.readouterr().err
    assert 'unknown field "emtpyDir"' in err and 'did you mean "emptyDir"' in err


@pytest.mark.root
def test_down_of_a_pod_that_is_not_there_is_not_found(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A UID of which the root has no trace is 'not found', exit 1 (kubectl's NotFound),
    and no record is made for it; --ignore-not-found makes it 0."""
    assert main(["down", "--root", str(root), "--pod-uid", UID]) == exits.FAILED
    captured = capsys.readouterr()
    assert f"{UID}: not found" in captured.out and "not found under" in captured.err
    assert not (root / "kubevol" / "pods" / f"{UID}.json").exists()
    assert main(["down", "--root", str(root), "--pod-uid", UID, "--ignore-not-found",
                 "-o", "json"]) == exits.OK
    assert '"state": "not found"' in capsys.readouterr().out


def test_an_internal_error_exits_70_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug (an exception that is no KubevolError or OSError) is 70 with one line."""

    def broken(_args: argparse.Namespace) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr("kubevol.cli.plugins.run", broken)
    assert main(["plugins"]) == exits.INTERNAL
    assert "internal error: RuntimeError: a bug" in capsys.readouterr().err


def test_success_exits_0() -> None:
    """A command that did what was asked exits 0."""
    assert main(["plugins", "-o", "name"]) == exits.OK


@pytest.mark.root
def test_a_blocked_unmount_exits_3(
    rig: MountRig, kubelet: KubeletTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """mount-refs: a staging mount another volume shares is blocked under the kubelet's
    rules (3)."""
    dev = rig.loop()
    a = rig.mount(dev, kubelet.global_mount("vol-a"))
    rig.mount(dev, kubelet.global_mount("vol-b"))
    assert main(["mount-refs", str(a), "--root", str(kubelet.root), "--policy",
                 "kubelet"]) == exits.BLOCKED


def test_a_reader_that_went_away_exits_141() -> None:
    """The reader of stdout closing it early (| head) stops the command quietly: 141."""
    proc = subprocess.Popen([*KUBEVOL, "completion", "bash"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    assert proc.wait(timeout=60) == exits.BROKEN_PIPE
    assert proc.stderr.read() == b""


#: Each code of the table, and the test above (or elsewhere) that checks it.
CHECKED = {
    exits.OK: "test_success_exits_0",
    exits.FAILED: "test_down_of_a_pod_that_is_not_there_is_not_found",
    exits.BLOCKED: "test_a_blocked_unmount_exits_3",
    exits.UNRESPONSIVE: "tests/node/test_dead_mount.py (a dead NFS server: status exits 4)",
    exits.USAGE: "test_bad_input_exits_64_naming_it",
    exits.INTERNAL: "test_an_internal_error_exits_70_in_one_line",
    exits.INTERRUPTED: "test_a_signal_ends_the_wait_for_the_root",
    exits.BROKEN_PIPE: "test_a_reader_that_went_away_exits_141",
}


def test_every_documented_code_is_checked() -> None:
    """Each code in the help's table is one the tests check, and each is in the table."""
    codes = {v for k, v in vars(exits).items() if k.isupper() and isinstance(v, int)}
    assert codes == set(CHECKED)
    for code in codes:
        assert f"  {code:<4}" in exits.EPILOG


# -- a signal during the wait for the root ------------------------------------------------


@pytest.fixture
def held_root(root: Path) -> Iterator[Path]:
    """The root, locked by another real process for as long as the test runs."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from kubevol.node.rootlock import RootLock\n"
         f"RootLock({str(root)!r}).acquire()\n"
         "print('held', flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield root
    finally:
        holder.kill()
        holder.wait()


def _wait_for(proc: subprocess.Popen[str], path: Path, needle: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if needle in path.read_text():
            return
        assert proc.poll() is None, path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not seen: {path.read_text()}")


@pytest.mark.root
@pytest.mark.parametrize(
    ("argv", "sig", "expected"),
    [
        (["agent", "--metrics-address", "", "--plugins-registry", ""], signal.SIGTERM, 0),
        (["agent", "--metrics-address", "", "--plugins-registry", ""], signal.SIGINT, 0),
        (["up"], signal.SIGINT, exits.INTERRUPTED),
        (["up"], signal.SIGTERM, -signal.SIGTERM),
        (["down", "--pod-uid", UID], signal.SIGINT, exits.INTERRUPTED),
    ],
    ids=["agent-SIGTERM", "agent-SIGINT", "up-SIGINT", "up-SIGTERM", "down-SIGINT"],
)
def test_a_signal_ends_the_wait_for_the_root(
    held_root: Path, tmp_path: Path, argv: list[str], sig: signal.Signals, expected: int
) -> None:
    """While another process holds the root, the agent and the one-shot commands wait (and
    say for whom); SIGTERM or SIGINT ends that wait within a second: the agent exits 0
    (stopped as asked, nothing started), a one-shot command 130 on SIGINT."""
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen([*KUBEVOL, *argv, "--root", str(held_root)],
                                stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        _wait_for(proc, err, "waiting for root", timeout=60)
        sent = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=10)
        assert time.monotonic() - sent < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == expected, err.read_text()




def test_the_agent_gives_up_waiting_for_the_root_at_its_timeout(
    held_root: Path, tmp_path: Path
) -> None:
    """The agent's start-up is bounded too (issue 29): with the root held by another
    process, `agent --timeout 2s` gives up after about two seconds, exit 1, saying why."""
    started = time.monotonic()
    done = subprocess.run([*KUBEVOL, "agent", "--metrics-address", "", "--plugins-registry", "",
                           "--timeout", "2s", "--root", str(held_root)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert time.monotonic() - started < 2 + 4, done.stderr
    assert done.returncode == exits.FAILED, done.stderr
    assert "kubevol agent:" in done.stderr and "root" in done.stderr, done.stderr
