"""Covers kubevol.mount.probe and kubevol.mount.hungmount in the node commands.

A dead mount never freezes kubevol (issue 29), played with real hung filesystems: a FUSE
mount whose daemon is frozen (bindfs, SIGSTOP) and a GlusterFS mount whose client is frozen,
each over one pod's volume, beside a healthy pod. ``status``, ``reconstruct`` and ``down`` of
the healthy pod return within their ``--timeout`` (plus start-up), name the hung volume
(state ``unresponsive``, exit code 4 where it is reported) and delete nothing on it. The
commands run as processes: a thread stuck in the kernel dies with its process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.testing.glusterfs import GlusterServer
from kubevol.testing.mount_rig import mounted_at

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

HUNG = "11111111-2222-3333-4444-555555555555"
HEALTHY = "22222222-2222-3333-4444-555555555555"
#: The command's --timeout, and what start-up and the last steps may add to it.
TIMEOUT = 6.0
SLACK = 4.0


def pod(name: str, uid: str) -> str:
    return f"""---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes: [{{name: scratch, emptyDir: {{}}}}]
"""


def kubevol(*argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``kubevol ARGV`` as a process, and how long it took; killed after a minute."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kubevol.cli.main", *argv],
                          capture_output=True, text=True, timeout=60, check=False)
    return done, time.monotonic() - started


def scratch(root: Path, uid: str) -> Path:
    return root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "scratch"


def frozen_bindfs(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    procs: list[subprocess.Popen[bytes]] = []

    def hang(target: Path) -> None:
        src = tmp_path / "fuse-src"
        src.mkdir()
        (src / "precious").write_text("keep me")
        proc = subprocess.Popen(["bindfs", "-f", str(src), str(target)])
        procs.append(proc)
        deadline = time.monotonic() + 10
        while not mounted_at(target):
            assert time.monotonic() < deadline and proc.poll() is None, "bindfs did not mount"
            time.sleep(0.02)
        proc.send_signal(signal.SIGSTOP)

    yield hang
    for proc in procs:
        proc.kill()  # SIGKILL ends a stopped process too; its mount then answers ENOTCONN
        proc.wait()
    assert (tmp_path / "fuse-src" / "precious").read_text() == "keep me"


@pytest.fixture(params=["fuse", "glusterfs"])
def hang_volume(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """A function that mounts a filesystem over a path and makes it hang."""
    if request.param == "fuse":
        yield from frozen_bindfs(tmp_path)
        return
    server: GlusterServer = request.getfixturevalue("glusterfs")
    (server.mount_point / "precious").write_text("keep me")

    def hang(target: Path) -> None:
        server.mount(target)
        server.freeze()

    yield hang
    server.thaw()
    assert (server.mount_point / "precious").read_text() == "keep me"


@pytest.fixture
def node(tmp_path: Path, hang_volume: Callable[[Path], None]) -> Iterator[Path]:
    """A root with two pods up, the first one's emptyDir under a hung mount."""
    if os.geteuid() != 0:
        pytest.fail("these tests mount filesystems: run them as root (scripts/run-tests.sh)")
    root = tmp_path / "root"
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(pod("hung", HUNG) + pod("healthy", HEALTHY))
    up, _ = kubevol("up", "--root", str(root), "--node-name", "n1", str(manifest))
    assert up.returncode == 0, up.stderr
    hang_volume(scratch(root, HUNG))
    try:
        yield root
    finally:
        if mounted_at(scratch(root, HUNG)):
            subprocess.run(["umount", "-l", str(scratch(root, HUNG))], check=False)


@pytest.mark.root
def test_status_and_reconstruct_name_the_hung_volume_and_return(node: Path) -> None:
    """status (a scan) and reconstruct come back within --timeout, exit 4, show the hung
    volume as unresponsive and the healthy pod's volume as it is (status measures it)."""
    flags = ["--root", str(node), "--node-name", "n1", "--timeout", f"{TIMEOUT}s", "-o", "json"]
    for command, state in ((["status", "--scan"], "state"), (["reconstruct"], "mount")):
        done, took = kubevol(*command, *flags)
        assert took < TIMEOUT + SLACK, (command, took)
        assert done.returncode == exits.UNRESPONSIVE, (command, done.stderr)
        assert "unresponsive" in done.stderr and str(scratch(node, HUNG)) in done.stderr
        out = json.loads(done.stdout)
        rows = {r["pod_uid"]: r for r in (out if isinstance(out, list) else out["volumes"])}
        assert rows[HUNG][state] == "unresponsive", rows
        assert rows[HEALTHY][state] in ("present", "not-mounted"), rows
        if command[0] == "status":
            assert rows[HEALTHY]["used"] is not None, rows


@pytest.mark.root
def test_down_of_a_healthy_pod_is_not_held_up(node: Path) -> None:
    """down of the healthy pod tears it down within --timeout although the other pod's
    volume hangs, and leaves the hung volume mounted."""
    done, took = kubevol("down", "--root", str(node), "--node-name", "n1", "--timeout",
                         f"{TIMEOUT}s", "--pod-uid", HEALTHY)
    assert took < TIMEOUT + SLACK, took
    assert f"{HEALTHY}: gone" in done.stdout, done.stdout + done.stderr
    assert not (node / "pods" / HEALTHY).exists()
    assert mounted_at(scratch(node, HUNG))


@pytest.mark.root
def test_down_of_the_hung_pod_releases_its_mount_and_deletes_nothing(node: Path) -> None:
    """down of the pod whose volume hangs returns within --timeout: the hung mount at the
    volume's path (kubevol's, of a pod it was told is gone) is unmounted by mount-utils'
    policy (force, then lazy), said on stderr, and the pod is gone; the data on the hung
    filesystem is untouched (the fixtures check it at the end)."""
    done, took = kubevol("down", "--root", str(node), "--node-name", "n1", "--timeout",
                         f"{TIMEOUT}s", "--pod-uid", HUNG)
    assert took < TIMEOUT + SLACK, took
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{HUNG}: gone" in done.stdout, done.stdout + done.stderr
    assert "answer" in done.stderr and "lazily" in done.stderr, done.stderr
    assert not mounted_at(scratch(node, HUNG))
    assert not (node / "pods" / HUNG).exists()


@pytest.mark.root
def test_metrics_of_the_hung_volume_is_bounded(node: Path) -> None:
    """kubevol metrics of a path on the hung filesystem comes back at its --timeout with
    the path named unresponsive (exit 4) and nothing on stdout."""
    done, took = kubevol("metrics", str(scratch(node, HUNG)), "--timeout", "2s", "-o", "json")
    assert took < 2 + SLACK, took
    assert done.returncode == exits.UNRESPONSIVE, done.stderr
    assert f"unresponsive: {scratch(node, HUNG)}" in done.stderr, done.stderr
    assert "did not answer within 2s" in done.stderr, done.stderr
    assert done.stdout == ""


@pytest.mark.root
def test_up_of_a_pod_on_the_hung_filesystem_returns(node: Path, tmp_path: Path) -> None:
    """up of a pod whose hostPath volume lies on the hung filesystem (its set-up blocks in
    the kernel, where no deadline reaches) comes back at --timeout, says the volume is not
    done, and leaves the stuck thread to end with the process."""
    manifest = tmp_path / "on-hung.yaml"
    uid = "33333333-2222-3333-4444-555555555555"
    manifest.write_text(f"""---
apiVersion: v1
kind: Pod
metadata: {{name: on-hung, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes: [{{name: data, hostPath: {{path: {scratch(node, HUNG)}/precious, type: File}}}}]
""")
    done, took = kubevol("up", "--root", str(node), "--node-name", "n1", "--timeout",
                         f"{TIMEOUT}s", str(manifest))
    assert took < TIMEOUT + SLACK, took
    assert done.returncode == exits.FAILED, done.stdout + done.stderr
    assert "not done" in done.stderr and "data" in done.stderr, done.stderr


@pytest.mark.root
def test_the_agent_sets_up_new_pods_beside_a_stuck_one_and_stops_on_sigterm(
    node: Path, tmp_path: Path
) -> None:
    """A kubevol agent whose first static pod has a hostPath on the hung filesystem (its
    set-up is stuck in the kernel for good) still sets up a second pod, and SIGTERM stops it
    within its stop bound (10 s) plus start-up, leaving the hung mount as it is."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "on-hung.yaml").write_text(f"""---
apiVersion: v1
kind: Pod
metadata: {{name: on-hung, namespace: default, uid: 44444444-2222-3333-4444-555555555555}}
spec:
  containers: [{{name: c, image: x}}]
  volumes: [{{name: data, hostPath: {{path: {scratch(node, HUNG)}/precious, type: File}}}}]
""")
    agent = subprocess.Popen(
        [sys.executable, "-m", "kubevol.cli.main", "agent", "--root", str(node), "--node-name",
         "n1", "--manifests", str(manifests), "--metrics-address", "",
         "--plugins-registry", ""],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        later = "55555555-2222-3333-4444-555555555555"
        (manifests / "later.yaml").write_text(pod("later", later))
        deadline = time.monotonic() + 20
        while not scratch(node, later).is_dir():
            assert time.monotonic() < deadline, "the second pod was not set up"
            assert agent.poll() is None, agent.communicate()
            time.sleep(0.05)
        agent.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _, err = agent.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert took < 10 + SLACK, (took, err)
    assert agent.returncode == 0, err
    assert "left running" in err, err
    assert mounted_at(scratch(node, HUNG))


@pytest.mark.root
def test_many_hung_volumes_cost_one_deadline_together(tmp_path: Path) -> None:
    """A dead server usually takes many volumes with it: six pods whose emptyDirs are each
    under a frozen FUSE daemon. status --timeout 6s asks them all at once (one probe
    deadline of 2 s together, not 2 s each: 12 s one after another) and names all six."""
    root = tmp_path / "root"
    uids = [f"{i}{i}{i}{i}{i}{i}{i}{i}-2222-3333-4444-555555555555" for i in range(3, 9)]
    manifest = tmp_path / "pods.yaml"
    manifest.write_text("".join(pod(f"p{i}", uid) for i, uid in enumerate(uids)))
    up, _ = kubevol("up", "--root", str(root), "--node-name", "n1", str(manifest))
    assert up.returncode == 0, up.stderr
    daemons = []
    try:
        for i, uid in enumerate(uids):
            src = tmp_path / f"src{i}"
            src.mkdir()
            daemons.append(subprocess.Popen(["bindfs", "-f", str(src), str(scratch(root, uid))]))
            deadline = time.monotonic() + 10
            while not mounted_at(scratch(root, uid)):
                assert time.monotonic() < deadline, "bindfs did not mount"
                time.sleep(0.02)
            daemons[-1].send_signal(signal.SIGSTOP)
        done, took = kubevol("status", "--scan", "--root", str(root), "--node-name", "n1",
                             "--timeout", f"{TIMEOUT}s", "--no-metrics", "-o", "json")
        assert took < TIMEOUT + SLACK, took
        assert done.returncode == exits.UNRESPONSIVE, done.stderr
        assert done.stderr.count("unresponsive: ") == len(uids), done.stderr
    finally:
        for daemon in daemons:
            daemon.kill()
            daemon.wait()
        for uid in uids:
            if mounted_at(scratch(root, uid)):
                subprocess.run(["umount", "-l", str(scratch(root, uid))], check=False)
