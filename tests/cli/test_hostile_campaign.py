"""Covers kubevol.cli.up, kubevol.cli.status, kubevol.cli.reconstruct and kubevol.cli.down.

A property-based campaign (hypothesis) over manifests and on-disk metadata (issue 20):
whatever ``up``, ``status``, ``reconstruct`` and ``down`` are given, they end with a
documented exit code and no traceback, nothing outside the root changes, and once every pod
is down no mount is left. Bounded examples, so that CI stays fast (``KUBEVOL_CAMPAIGN_EXAMPLES``
raises the count for a longer hunt).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.testing.mount_rig import mounts_under
from tests.hostile import snapshot

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

EXAMPLES = int(os.environ.get("KUBEVOL_CAMPAIGN_EXAMPLES", "20"))
CAMPAIGN = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: What every command may end with (``kubevol --help`` lists them): success, failure, usage.
DOCUMENTED = {exits.OK, exits.FAILED, exits.USAGE}

#: Strings that have escaped a root, hidden a record or broken a parser before.
HOSTILE_TEXT = st.sampled_from([
    "", ".", "..", "../x", "a/b", "/etc", ".hidden", "a\0b", "x" * 300, "-", "UPPER",
    "with space", "ünï", "~", "$(id)", "*", "&a", "[", "{", "%", "\n",
])
NAMES = st.one_of(st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True), HOSTILE_TEXT)
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), HOSTILE_TEXT,
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                      st.integers(), max_size=2))


@contextlib.contextmanager
def sandbox() -> Iterator[tuple[Path, Path, Path]]:
    """A fresh (root, host-path area, outside) per example; the outside holds files that
    must never change; every mount under it is undone afterwards."""
    base = Path(tempfile.mkdtemp(prefix="kv-campaign-"))
    outside = base / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "precious").write_text("keep")
    (outside / "sub" / "deep").write_text("keep")
    (base / "hostpaths").mkdir()
    try:
        yield base / "root", base / "hostpaths", outside
    finally:
        for point in reversed(mounts_under(base)):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(base, ignore_errors=True)


def kubevol(*argv: str) -> tuple[int, str]:
    """``kubevol ARGV`` in process: its exit code and its stderr. A hang fails the example."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"kubevol {' '.join(argv)} hung")

    err = io.StringIO()
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(argv))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, err.getvalue()


def check(code: int, err: str) -> None:
    """The invariants of one command's end."""
    assert code in DOCUMENTED, f"exit {code}: {err}"
    assert "Traceback" not in err, err


def down_everything(root: Path) -> None:
    """Tear down every pod recorded or found under ``root``; nothing may stay mounted."""
    uids = set()
    for where in (root / "kubevol" / "pods", root / "pods"):
        with contextlib.suppress(OSError):
            uids |= {n.removesuffix(".json") for n in os.listdir(where) if not n.startswith(".")}
    for uid in sorted(uids):
        code, err = kubevol("down", "--root", str(root), "--node-name", "n1", "--timeout", "20",
                            "--pod-uid", uid)
        assert code in DOCUMENTED and "Traceback" not in err, err
    assert mounts_under(root) == [], "a mount leaked"


# -- manifests -----------------------------------------------------------------------------------

@st.composite
def volumes(draw: st.DrawFn, hostpaths: str) -> dict[str, Any]:
    name = draw(NAMES)
    kind = draw(st.sampled_from(["emptyDir", "hostPath", "persistentVolumeClaim", "junk"]))
    if kind == "emptyDir":
        source: Any = {
            "medium": draw(st.one_of(st.sampled_from(["", "Memory"]), JUNK)),
            "sizeLimit": draw(st.one_of(st.sampled_from(["1Mi", "8Mi", "1Gi"]), JUNK)),
        }
    elif kind == "hostPath":
        path = draw(st.one_of(
            st.builds(lambda n: f"{hostpaths}/{n}", NAMES),
            st.sampled_from([f"{hostpaths}/../outside", "relative", "", "/"]),
        ))
        source = {"path": path, "type": draw(st.one_of(st.sampled_from(
            ["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket"]), JUNK))}
    elif kind == "persistentVolumeClaim":
        source = {"claimName": draw(st.one_of(NAMES, JUNK))}
    else:
        source = draw(JUNK)
        kind = draw(st.sampled_from(["emptyDir", "hostPath", "csi", "configMap"]))
    return {"name": name, kind: source}


@st.composite
def pod_manifests(draw: st.DrawFn, hostpaths: str) -> str:
    vols = draw(st.lists(volumes(hostpaths), max_size=3))
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": draw(st.one_of(
            st.fixed_dictionaries({"name": NAMES}, optional={
                "namespace": NAMES, "uid": st.one_of(st.uuids().map(str), HOSTILE_TEXT)}),
            JUNK,
        )),
        "spec": {
            "containers": [{"name": "c", "image": "x", "volumeMounts": [
                {"name": v.get("name"), "mountPath": f"/m{i}"} for i, v in enumerate(vols)
            ]}],
            "volumes": vols,
            "securityContext": {"fsGroup": draw(st.one_of(
                st.none(), st.integers(0, 2**31 - 1), JUNK))},
        },
    }
    text = yaml.safe_dump(pod)
    # Sometimes the text itself is hostile: an alias bomb, a deep nesting, a truncation.
    mangle = draw(st.sampled_from(["none", "none", "truncate", "bomb", "deep", "binary"]))
    if mangle == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif mangle == "bomb":
        text += "\nx: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
            f"y{i}: &a{i} [{','.join(['*a' if i == 0 else f'*a{i - 1}'] * 10)}]\n"
            for i in range(7))
    elif mangle == "deep":
        text += "z: " + "[" * 5000 + "]" * 5000 + "\n"
    elif mangle == "binary":
        text = text.encode().decode("latin-1") + "\x00\xff"
    return text


@pytest.mark.root
@CAMPAIGN
@given(data=st.data())
def test_up_and_down_of_any_manifest_keep_the_invariants(data: st.DataObject) -> None:
    """Any manifest: ``up`` ends with a documented code and one line, never a traceback;
    nothing outside the root and the host-path area changes; ``down`` of whatever was
    recorded leaves no mount."""
    if os.geteuid() != 0:
        pytest.fail("the campaign needs root (real mounts)")
    with sandbox() as (root, hostpaths, outside):
        text = data.draw(pod_manifests(str(hostpaths)))
        manifest = root.parent / "pod.yaml"
        manifest.write_text(text, errors="surrogateescape")
        before = snapshot(outside)
        code, err = kubevol("up", "--root", str(root), "--node-name", "n1", "--timeout", "20",
                            str(manifest))
        event(f"up exit {code}")
        check(code, err)
        down_everything(root)
        assert snapshot(outside) == before


# -- on-disk metadata ----------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def metadata_contents(draw: st.DrawFn) -> tuple[str, bytes]:
    """What a metadata file may have become: a kind of file, and bytes for regular ones."""
    kind = draw(st.sampled_from(["json", "json", "bytes", "deep", "fifo", "link", "dir"]))
    if kind == "json":
        return kind, json.dumps(draw(JSON_VALUES)).encode()
    if kind == "bytes":
        return kind, draw(st.binary(max_size=64))
    if kind == "deep":
        depth = draw(st.integers(90, 20_000))
        return kind, b"[" * depth + b"]" * depth
    return kind, b""


def plant(path: Path, kind: str, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to("/dev/zero")
    elif kind == "dir":
        path.mkdir()
    else:
        path.write_bytes(content)


GOOD_UID = "66666666-7777-8888-9999-000000000000"
HOSTILE_UID = "77777777-8888-9999-0000-111111111111"
GOOD_POD = (
    "apiVersion: v1\nkind: Pod\nmetadata: {name: good, uid: " + GOOD_UID + "}\n"
    "spec:\n  containers: [{name: c, image: x}]\n"
    "  volumes: [{name: scratch, emptyDir: {}}, {name: mem, emptyDir: {medium: Memory}}]\n"
)


@pytest.mark.root
@CAMPAIGN
@given(
    record=metadata_contents(), vol_data=metadata_contents(), drivers=metadata_contents(),
    device_vol_data=metadata_contents(),
)
def test_commands_over_any_metadata_keep_the_invariants(
    record: tuple[str, bytes], vol_data: tuple[str, bytes], drivers: tuple[str, bytes],
    device_vol_data: tuple[str, bytes],
) -> None:
    """A pod is up; then a pod record, a pod volume's and a device mount's vol_data.json
    and the known-drivers file become anything (FIFO, link to /dev/zero, deep or wrong
    JSON, bytes): status, reconstruct and down each end with a documented code and no
    traceback, nothing outside the root changes, and the good pod goes down leaving no
    mount."""
    if os.geteuid() != 0:
        pytest.fail("the campaign needs root (real mounts)")
    with sandbox() as (root, _, outside):
        flags = ("--root", str(root), "--node-name", "n1")
        manifest = root.parent / "good.yaml"
        manifest.write_text(GOOD_POD)
        code, err = kubevol("up", *flags, str(manifest))
        assert code == exits.OK, err
        assert mounts_under(root) != []  # the Memory emptyDir
        before = snapshot(outside)
        plant(root / "kubevol" / "pods" / f"{HOSTILE_UID}.json", *record)
        csi_vol = root / "pods" / HOSTILE_UID / "volumes" / "kubernetes.io~csi" / "pv1"
        (csi_vol / "mount").mkdir(parents=True)
        plant(csi_vol / "vol_data.json", *vol_data)
        device = root / "plugins" / "kubernetes.io" / "csi" / "d.example.com" / ("b" * 64)
        (device / "globalmount").mkdir(parents=True)
        plant(device / "vol_data.json", *device_vol_data)
        plant(root / "kubevol" / "csi-drivers.json", *drivers)
        check(*kubevol("status", *flags, "--no-metrics"))
        check(*kubevol("reconstruct", *flags))
        check(*kubevol("down", *flags, "--timeout", "5", "--pod-uid", HOSTILE_UID))
        assert snapshot(outside) == before
        # The known-drivers file is the root's configuration: put right before the good pod
        # goes (a bad one is refused by every command, in one line).
        plant(root / "kubevol" / "csi-drivers.json", "json", b"{}")
        code, err = kubevol("down", *flags, "--timeout", "20", "--pod-uid", GOOD_UID)
        assert code == exits.OK and "Traceback" not in err, err
        assert mounts_under(root) == [], "a mount leaked"
        assert snapshot(outside) == before
