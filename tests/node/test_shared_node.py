"""Covers kubevol.layout's directory modes, through ``kubevol up`` and ``kubevol status``.

A node shared with unprivileged users (issue 28), played for real: a pod is brought up with
the real ``kubevol up`` under umask 000, and an unprivileged user (``setpriv --reuid=65534``)
then tries to read its Secret, write into its emptyDir and swap its ``..data`` link. The
kubelet's directory modes (0750 for the root, ``pods``, ``pods/<uid>`` and its ``volumes`` and
``plugins``: ``setupDataDirs``/``makePodDataDirs``) must stop every try."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.k8s.tokens import TokenManager, TokenRequest
from kubevol.node.token_times import TokenRefreshTimes
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.token_provider import StandInTokenProvider

UID = "11111111-2222-3333-4444-555555555555"
MANIFEST = f"""
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: default}}
stringData: {{password: hunter2}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, uid: {UID}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes:
  - name: creds
    secret: {{secretName: creds}}
  - name: scratch
    emptyDir: {{}}
"""
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]


def as_nobody(script: str) -> subprocess.CompletedProcess[str]:
    """Run a shell script as user 65534 (no groups, no capabilities)."""
    return subprocess.run([*NOBODY, "sh", "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)


def up_under_umask_000(base: Path) -> Path:
    """The pod of :data:`MANIFEST` brought up by the real ``kubevol up`` under umask 000
    on a root in ``base``; the root."""
    (base / "pod.yaml").write_text(MANIFEST)
    root = base / "root"
    up = subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", "up", "--root", str(root), "--node-name",
         "n1", str(base / "pod.yaml")],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=lambda: os.umask(0),
    )
    assert up.returncode == 0, up.stderr
    return root


def down(root: Path) -> None:
    """The real ``kubevol down`` of that pod."""
    result = subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", "down", "--root", str(root), "--node-name",
         "n1", "--pod-uid", UID], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory every user can traverse (pytest's own tmp dirs are root's alone, which
    would make every attack fail for the wrong reason)."""
    base = Path(tempfile.mkdtemp(prefix="kv-shared-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        for point in reversed(mounts_under(base)):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.root
def test_another_user_cannot_reach_a_pods_volumes(shared_base: Path) -> None:
    """Under umask 000, the root and every pod directory kubevol makes are 0750: user 65534
    can read no Secret, write into no emptyDir and rename no ``..data`` link."""
    root = up_under_umask_000(shared_base)
    pod = root / "pods" / UID
    secret = pod / "volumes" / "kubernetes.io~secret" / "creds"
    scratch = pod / "volumes" / "kubernetes.io~empty-dir" / "scratch"
    assert (secret / "password").read_text() == "hunter2"
    for d in (root, root / "pods", pod, pod / "volumes", pod / "plugins"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o750, d
    assert as_nobody(f"ls {shared_base}").returncode == 0  # the attacker does get this far

    attempts = {
        "read the secret": f"cat {secret}/password",
        "list the pods": f"ls {root}/pods",
        "write into the emptyDir": f"touch {scratch}/mine",
        # A restarted agent takes an emptyDir with this marker as set up: not set up again.
        "plant an emptyDir ready marker": f"touch {pod}/plugins/kubernetes.io~empty-dir/x",
        "swap ..data": f"ln -sfn /etc {secret}/..data_tmp && mv -T {secret}/..data_tmp "
                       f"{secret}/..data",
    }
    for what, script in attempts.items():
        result = as_nobody(script)
        assert result.returncode != 0, f"user 65534 could {what}"
        assert "Permission denied" in result.stderr, (what, result.stderr)
    assert not (scratch / "mine").exists()
    assert os.readlink(secret / "..data").startswith("..2")

    down(root)


def test_status_warns_about_a_root_wider_than_0750(tmp_path: Path) -> None:
    """A root another agent made 0755 is reported by status (with the chmod that fixes it)
    and left as it is; a 0750 root is not reported."""
    root = tmp_path / "root"
    root.mkdir()
    for mode, warned in ((0o755, True), (0o750, False)):
        os.chmod(root, mode)
        done = subprocess.run(
            [sys.executable, "-m", "kubevol.cli.main", "status", "--scan", "--root", str(root),
             "--node-name", "n1", "--timeout", "10s"],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert (f"root {root} has mode {mode:04o}, wider than" in done.stderr) is warned
        assert stat.S_IMODE(root.stat().st_mode) == mode


@pytest.mark.root
def test_another_user_cannot_put_a_token_renewal_off(shared_base: Path) -> None:
    """The token refresh times a restarted agent reads back live in the root's state
    directory, 0700 whatever the umask: user 65534 can neither write the file (a far time
    would put renewals off) nor replace it with a link."""
    root = shared_base / "root"
    tokens = TokenManager(StandInTokenProvider())
    tokens.get_token(TokenRequest(namespace="ns", service_account="sa", audiences=(),
                                  expiration_seconds=3600, pod_name="p", pod_uid=UID))
    times = TokenRefreshTimes(str(root))
    old = os.umask(0)
    try:
        times.save_if_changed(tokens)
    finally:
        os.umask(old)
    before = Path(times.path).read_text()
    assert stat.S_IMODE(Path(times.path).parent.stat().st_mode) == 0o700
    attempts = {
        "write the refresh times": f"echo '{{\"{UID}\": \"2999-01-01T00:00:00+00:00\"}}' "
                                   f"> {times.path}",
        "link them elsewhere": f"ln -sf /tmp/mine {times.path}.new && "
                               f"mv -f {times.path}.new {times.path}",
    }
    for what, script in attempts.items():
        result = as_nobody(script)
        assert result.returncode != 0, f"user 65534 could {what}"
        assert "Permission denied" in result.stderr, (what, result.stderr)
    assert Path(times.path).read_text() == before and not Path(times.path).is_symlink()


@pytest.mark.root
def test_another_user_cannot_mark_a_pod_terminating(shared_base: Path) -> None:
    """The pod records an agent reads back (``<root>/kubevol/pods``: a ``terminating`` one
    makes it tear the pod down) are the state directory's, 0700 under umask 000: even on a
    root opened to everyone, user 65534 can neither rewrite a record, plant one, nor move
    the records' directory away and bring its own."""
    root = up_under_umask_000(shared_base)
    records = root / "kubevol" / "pods"
    record = records / f"{UID}.json"
    before = record.read_text()
    for d in (root / "kubevol", records):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    os.chmod(root, 0o755)  # an operator's wider root (status warns about it)
    forged = f'{{"uid": "{UID}", "state": "terminating", "objects": []}}'
    other = "99999999-2222-3333-4444-555555555555"
    attempts = {
        "rewrite the record": f"echo '{forged}' > {record}",
        "plant a record": f"echo '{forged}' > {records}/{other}.json",
        "move the records away": f"mv {records} {root}/kubevol/old",
        "bring its own records": f"d=$(mktemp -d) && {{ mv $d {records}; r=$?; rmdir $d; "
                                 "exit $r; }",
    }
    try:
        for what, script in attempts.items():
            result = as_nobody(script)
            assert result.returncode != 0, f"user 65534 could {what}"
            assert "Permission denied" in result.stderr, (what, result.stderr)
        assert record.read_text() == before
        assert sorted(p.name for p in records.iterdir()) == [f"{UID}.json"]
    finally:
        os.chmod(root, 0o750)
    down(root)
