"""``kubevol demo``: the whole story on a throw-away root, with nothing to set up.

It serves the bundled hostpath CSI driver in-process on a temporary socket, and a driver of
one shared filesystem (the sharedfs driver on a private GlusterFS server where GlusterFS is
installed, else hostpath in shared-filesystem mode on a loop image), registers both, mounts
the volumes of the example pods in ``kubevol/examples/`` (a CSI volume staged once and
published into two pods, a CSI block
volume, an emptyDir on disk and one in memory, a hostPath, two volumes of one shared
filesystem, and a pod with a configMap, a secret, a downwardAPI volume, a projected volume
with a service-account token from a stand-in issuer, a local PV and two subPath mounts of a
CSI volume), shows them, drops every in-memory state as a crash would, rebuilds the state
from disk, checks no file was lost, tears everything down and checks that no mount and no
loop device is left. Every check that fails is reported, and the exit status is then 1.

The helpers (:func:`load_examples`, :func:`create_demo_volumes`, :func:`leftovers`) are
used by the tests too.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.resources
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import attrs

from kubevol.cli.node_common import USAGE_COLUMNS, add_metrics, report_sync, volume_rows
from kubevol.cli.output import write_table
from kubevol.cli.parser import DURATION
from kubevol.errors import KubevolError
from kubevol.layout import CSI_PLUGIN_NAME, POD_VOLUME_DEVICES_DIR, is_below, is_within
from kubevol.node.desired import new_pods
from kubevol.node.manifests import Manifests, parse_manifests
from kubevol.node.privileges import require_privileges
from kubevol.node.records import PodRecord, PodState
from kubevol.node.state import DesiredPod, VolumeMode

if TYPE_CHECKING:
    # Imported where used, for the CLI's start-up time; here for the annotations only.
    from kubevol.csi.client import CSIClient
    from kubevol.csidriver.drivers.common import RunningDriver
    from kubevol.node.runtime import NodeRuntime, RecordedPods
    from kubevol.node.state import ActualState

#: A PersistentVolume with this annotation set to "true" is created on its driver by the demo.
CREATE_ANNOTATION = "kubevol.io/demo-create-volume"
#: The driver name of the hostpath driver in shared-filesystem mode.
SHARED_DRIVER = "shared.hostpath.csi.kubevol.io"
#: The file written into each volume, and checked after the crash.
MARKER = "kubevol-demo.txt"

_ACCESS_MODES = {
    "ReadWriteOnce": "SINGLE_NODE_WRITER",
    "ReadWriteOncePod": "SINGLE_NODE_SINGLE_WRITER",
    "ReadOnlyMany": "MULTI_NODE_READER_ONLY",
    "ReadWriteMany": "MULTI_NODE_MULTI_WRITER",
}


def examples_dir() -> Path:
    """The example manifests shipped inside the package (``kubevol/examples/``)."""
    return Path(str(importlib.resources.files("kubevol") / "examples"))


def load_examples(directory: Path, demo_dir: str) -> Manifests:
    """Every ``*.yaml`` of ``directory``, ``${DEMO_DIR}`` replaced by ``demo_dir``, merged."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise KubevolError(f"no example manifests (*.yaml) in {directory}")
    out = Manifests()
    for path in files:
        text = path.read_text(encoding="utf-8").replace("${DEMO_DIR}", demo_dir)
        out = out.merged(parse_manifests(text, str(path)))
    return out


def create_demo_volumes(
    manifests: Manifests, clients: Mapping[str, CSIClient]
) -> tuple[Manifests, list[tuple[str, str]]]:
    """Create every PersistentVolume annotated :data:`CREATE_ANNOTATION` on its driver
    (``clients``: driver name → :class:`~kubevol.csi.client.CSIClient`) and put the returned
    volume handle in it; returns the new manifests and the (driver, volume id) created."""
    from kubevol.csi import types as t
    from kubevol.spec import quantity_bytes

    pvs = dict(manifests.pvs)
    created: list[tuple[str, str]] = []
    for name, pv in sorted(manifests.pvs.items()):
        annotations = (pv.get("metadata") or {}).get("annotations") or {}
        if annotations.get(CREATE_ANNOTATION) != "true":
            continue
        spec = pv.get("spec") or {}
        csi = spec.get("csi") or {}
        driver = csi.get("driver", "")
        if driver not in clients:
            raise KubevolError(f"PersistentVolume {name}: no demo driver called {driver!r}")
        mode = t.AccessMode[_ACCESS_MODES[(spec.get("accessModes") or ["ReadWriteOnce"])[0]]]
        if spec.get("volumeMode") == VolumeMode.BLOCK.value:
            capability = t.VolumeCapability.block(mode)
        else:
            capability = t.VolumeCapability.mount(mode, csi.get("fsType", ""))
        size = quantity_bytes((spec.get("capacity") or {}).get("storage")) or 0
        volume = clients[driver].create_volume(
            name, [capability], capacity_range=t.CapacityRange(required_bytes=size)
        )
        created.append((driver, volume.volume_id))
        pvs[name] = {**pv, "spec": {**spec, "csi": {**csi, "volumeHandle": volume.volume_id}}}
    return attrs.evolve(manifests, pvs=pvs), created


def local_paths(manifests: Manifests, under: str) -> list[str]:
    """The paths of local PersistentVolumes that lie under ``under`` (made by the demo)."""
    out = []
    for pv in manifests.pvs.values():
        path = ((pv.get("spec") or {}).get("local") or {}).get("path") or ""
        if path.startswith(under.rstrip("/") + "/"):
            out.append(path)
    return sorted(out)


def leftovers(directory: str) -> list[str]:
    """Mounts at or under ``directory`` and loop devices backed by files under it."""
    from kubevol.mount.mountinfo import parse_mountinfo

    base = os.path.realpath(directory)
    found = [
        f"mount {e.mount_point}"
        for e in parse_mountinfo()
        if is_within(e.mount_point, base)
    ]
    for backing in sorted(glob.glob("/sys/block/loop*/loop/backing_file")):
        try:
            with open(backing, encoding="utf-8") as f:
                target = f.read().strip()
        except OSError:
            continue
        if is_below(target, base):
            found.append(f"loop device /dev/{backing.split('/')[3]} on {target}")
    return found


class Story:
    """Prints numbered steps as they happen and collects what went wrong."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.problems: list[str] = []
        self._n = 0

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        """Print ``title``, run the block, print how long it took or why it failed."""
        self._n += 1
        self.out.write(f"[{self._n}] {title} ...\n")
        self.out.flush()
        started = time.monotonic()
        yield
        self.out.write(f"    done in {time.monotonic() - started:.2f} s\n")
        self.out.flush()

    def say(self, text: str) -> None:
        """An indented line under the current step."""
        self.out.write(f"    {text}\n")
        self.out.flush()

    def check(self, ok: bool, what: str) -> None:
        """Record ``what`` as a problem unless ``ok``; say it either way."""
        self.say(("ok: " if ok else "PROBLEM: ") + what)
        if not ok:
            self.problems.append(what)


def _markers(rows: list[dict[str, object]]) -> dict[tuple[str, str], str]:
    """Write a marker into each writable filesystem volume and the block device; returns
    (pod, volume) → where it went (a file path, or ``block:<device path>``)."""
    written: dict[tuple[str, str], str] = {}
    for row in rows:
        path, key = str(row["path"]), (str(row["pod"]), str(row["volume"]))
        text = f"{row['pod']} {row['volume']}\n".encode()
        if row["plugin"] == CSI_PLUGIN_NAME and f"/{POD_VOLUME_DEVICES_DIR}/" in path:
            with open(path, "r+b") as dev:
                dev.write(text.ljust(512, b"\0"))
            written[key] = "block:" + path
            continue
        if os.path.lexists(os.path.join(path, "..data")):
            continue  # written by kubevol (configMap, secret, ...): not the pod's to change
        try:
            Path(path, MARKER).write_bytes(text)
        except OSError:
            continue  # a read-only volume (the backup pod's view of the database)
        written[key] = os.path.join(path, MARKER)
    return written


def _check_markers(story: Story, written: dict[tuple[str, str], str]) -> None:
    for (pod, volume), where in sorted(written.items()):
        expected = f"{pod} {volume}\n".encode()
        try:
            if where.startswith("block:"):
                with open(where[len("block:"):], "rb") as dev:
                    ok = dev.read(512).rstrip(b"\0") == expected
            else:
                ok = Path(where).read_bytes() == expected
        except OSError:
            ok = False
        story.check(ok, f"{pod} {volume}: the file written before the crash is intact")


def _show(
    story: Story, runtime: NodeRuntime, pods: list[DesiredPod], actual: ActualState, root: str
) -> list[dict[str, object]]:
    names = {p.uid: p.name for p in pods}
    rows = volume_rows(pods, actual, None, names)
    add_metrics(runtime, rows)
    shown = [
        {**r, "path": str(r["path"]).replace(root + "/", "<root>/")}
        for r in rows
    ]
    story.say(f"<root> is {root}")
    write_table(shown, ("pod", "volume", "plugin", "state", *USAGE_COLUMNS[:2], "path"),
                story.out)
    return rows


def run(args: argparse.Namespace) -> int:
    require_privileges("kubevol demo", loop_devices=True)
    out = sys.stdout
    story = Story(out)
    work = tempfile.mkdtemp(prefix="kubevol-demo-", dir=args.workdir)
    try:
        with contextlib.ExitStack() as stack:
            tell(story, stack, work, args)
    except Exception as exc:  # any failure is the demo's result: report it, then clean up
        story.problems.append(f"{type(exc).__name__}: {exc}")
        out.write(f"\nthe demo stopped: {type(exc).__name__}: {exc}\n")
    left = leftovers(work)
    story.check(not left, "nothing is left mounted or attached" + (
        f" (left: {', '.join(left)})" if left else ""))
    if not left and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if story.problems:
        out.write(f"\nkubevol demo: {len(story.problems)} problem(s):\n")
        for problem in story.problems:
            out.write(f"  - {problem}\n")
        return 1
    out.write("\nkubevol demo: every check passed.\n")
    return 0


@attrs.define
class _Demo:
    """What the steps share."""

    story: Story
    stack: contextlib.ExitStack
    work: str
    args: argparse.Namespace
    node: str = "demo-node"
    endpoints: dict[str, str] = attrs.field(factory=dict)
    clients: dict[str, CSIClient] = attrs.field(factory=dict)
    manifests: Manifests = attrs.field(factory=Manifests)
    desired: list[DesiredPod] = attrs.field(factory=list)
    written: dict[tuple[str, str], str] = attrs.field(factory=dict)

    @property
    def root(self) -> str:
        return os.path.join(self.work, "root")

    def runtime(self) -> NodeRuntime:
        """A runtime on the demo's root. Tokens come from the stand-in issuer, ConfigMaps and
        Secrets from the example manifests (as an API server would keep serving them)."""
        from kubevol.k8s.tokens import TokenManager
        from kubevol.node.runtime import NodeRuntime
        from kubevol.testing.token_provider import StandInTokenProvider

        runtime = NodeRuntime(self.root, node_name=self.node, csi_drivers=self.endpoints,
                              csi_timeout=30, tokens=TokenManager(StandInTokenProvider()))
        runtime.learn(self.manifests)
        return runtime


def tell(story: Story, stack: contextlib.ExitStack, work: str, args: argparse.Namespace) -> None:
    """The story's steps (see the module docstring); cleanup is pushed on ``stack``."""
    demo = _Demo(story=story, stack=stack, work=work, args=args)
    _serve_drivers(demo)
    _load(demo)
    _mount_and_crash(demo)
    runtime = demo.runtime()
    stack.callback(runtime.close)
    pods = runtime.volume_manager()
    stack.callback(pods.close)
    _reconstruct(demo, pods)
    _shared_filesystem(demo, runtime, pods)
    with story.step("tearing every pod down"):
        for record in runtime.records.all():
            runtime.records.write(PodRecord(uid=record.uid, state=PodState.TERMINATING,
                                            objects=record.objects))
        result = pods.sync(timeout=args.timeout)
        report_sync(result, story.out)
        story.check(result.converged and not runtime.records.all(),
                    "every volume was torn down, unstaged and forgotten")
        story.check(not os.listdir(os.path.join(demo.root, "pods")), "no pod directory is left")
    with story.step("deleting the volumes and stopping the drivers"):
        stack.close()


def _serve_drivers(demo: _Demo) -> None:
    from kubevol.csi.client import CSIClient
    from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver

    gluster = glusterfs_installed()
    with demo.story.step("serving the bundled hostpath CSI driver in-process, and a driver "
                         "of one shared filesystem"):
        for name, image in ((DRIVER_NAME, ""), (SHARED_DRIVER, "shared-fs.img")):
            if image and gluster:
                running, what = _serve_sharedfs_on_glusterfs(demo)
            else:
                config = HostPathConfig(
                    state_dir=os.path.join(demo.work, name), node_id=demo.node,
                    driver_name=name, capacity_bytes=2 << 30,
                    shared_filesystem=os.path.join(demo.work, image) if image else "",
                    shared_filesystem_size=128 << 20,
                )
                running = HostPathDriver(config).serve()
                demo.stack.callback(running.stop)
                what = (" (hostpath in shared-filesystem mode: every volume on one ext4 "
                        "filesystem of a loop image; GlusterFS is not installed)" if image else "")
            demo.endpoints[name] = running.endpoint
            demo.clients[name] = CSIClient(running.endpoint, timeout=30)
            demo.stack.callback(demo.clients[name].close)
            demo.story.say(f"{name} on {running.endpoint}{what}")


def glusterfs_installed() -> bool:
    """Whether this node can run a GlusterFS server and client (Debian's glusterfs-server
    and glusterfs-client): the demo then shows the shared-filesystem case on a real
    network filesystem."""
    return all(shutil.which(tool) for tool in ("glusterd", "gluster", "glusterfs"))


def _serve_sharedfs_on_glusterfs(demo: _Demo) -> tuple[RunningDriver, str]:
    """A private GlusterFS server in the work directory, and the bundled sharedfs driver
    serving sub-directories of its volume under the shared driver's name."""
    from kubevol.csidriver.drivers.sharedfs import SharedFSConfig, SharedFSDriver
    from kubevol.testing.glusterfs import GlusterServer

    # A short directory in /tmp: glusterd's unix sockets live below it (108 bytes at most),
    # and the work directory or $TMPDIR may be deep. The server makes (and removes) its
    # directory inside it; only the empty parent is removed here.
    parent = tempfile.mkdtemp(prefix="kubevol-gluster-", dir="/tmp")
    demo.stack.callback(_rmdir_quietly, parent)
    server = GlusterServer(Path(parent) / "g").start()
    demo.stack.callback(server.cleanup)
    running = SharedFSDriver(SharedFSConfig(
        state_dir=os.path.join(demo.work, SHARED_DRIVER), node_id=demo.node,
        driver_name=SHARED_DRIVER, source=server.source, fstype="glusterfs",
    )).serve()
    demo.stack.callback(running.stop)
    return running, (f" (sharedfs: every volume a sub-directory of the GlusterFS volume "
                     f"{server.source}, served by a private glusterd)")


def _load(demo: _Demo) -> None:
    with demo.story.step(f"loading the example pods from {demo.args.examples}"):
        manifests = load_examples(Path(demo.args.examples), demo.work)
        demo.manifests, created = create_demo_volumes(manifests, demo.clients)
        for path in local_paths(demo.manifests, demo.work):
            os.makedirs(path, exist_ok=True)  # the local "disks" of the example PVs
        for driver, volume_id in created:
            demo.stack.callback(_delete_quietly, demo.clients[driver], volume_id)
        demo.story.say(f"{len(manifests.pods)} pods, {len(manifests.pvs)} PersistentVolumes "
                       f"({len(created)} created on the drivers)")


def _mount_and_crash(demo: _Demo) -> None:
    story = demo.story
    runtime = demo.runtime()
    with story.step("registering the drivers and mounting every volume"):
        story.check(not runtime.unregistered, "both drivers are registered")
        adding = new_pods(runtime.mgr, demo.manifests)
        demo.desired = [p.desired for p in adding]
        pods = runtime.volume_manager(adding=adding)
        result = pods.sync(timeout=demo.args.timeout)
        report_sync(result, story.out)
        story.check(result.converged, "every volume of every pod is set up")
        rows = _show(story, runtime, demo.desired, pods.manager.actual, demo.root)
        _show_kinds(story, rows, demo.root)
        demo.written = _markers(rows)
        story.say(f"wrote a file into {len(demo.written)} volumes (the block device included)")
    with story.step("crash: dropping every in-memory state"):
        mounted = leftovers(demo.root)
        pods.close()
        runtime.close()
        story.say(f"{len(mounted)} mounts stay on the node; nothing in memory knows them")


def _show_kinds(story: Story, rows: list[dict[str, object]], root: str) -> None:
    """What the configMap, secret, downwardAPI, projected and subPath volumes hold."""
    by_plugin = {str(r["plugin"]): str(r["path"]) for r in rows}
    config = by_plugin.get("kubernetes.io/configmap")
    if config is None:
        return  # the example with these kinds was not loaded
    story.check(os.path.islink(os.path.join(config, "..data"))
                and Path(config, "app.properties").is_file(),
                "configMap: files behind ..data, linked at the top (the kubelet's layout)")
    secret = by_plugin.get("kubernetes.io/secret", "")
    story.check(_fs_type(secret) == "tmpfs" and Path(secret, "password").is_file(),
                "secret: on tmpfs, never on disk")
    projected = by_plugin.get("kubernetes.io/projected", "")
    token = Path(projected, "token")
    story.check(token.is_file() and token.read_text().count(".") == 2,
                "projected: a service-account token from the token provider, with ca.crt "
                "and namespace")
    info = Path(by_plugin.get("kubernetes.io/downward-api", ""), "labels")
    story.check(info.is_file() and 'app="demo"' in info.read_text(),
                "downwardAPI: labels as key=\"value\" lines")
    subpaths = sorted(glob.glob(os.path.join(root, "pods", "*", "volume-subpaths", "*", "*", "*")))
    story.say("subPath binds: " + ", ".join(p.replace(root + "/", "<root>/") for p in subpaths))
    story.check(len(subpaths) == 2 and all(_fs_type(p) for p in subpaths),
                "both subPath mounts of the CSI volume are bound")


def _fs_type(path: str) -> str:
    from kubevol.mount.mountinfo import parse_mountinfo

    found = [e.fs_type for e in parse_mountinfo() if e.mount_point == path]
    return found[-1] if found else ""


def _reconstruct(demo: _Demo, pods: RecordedPods) -> None:
    story = demo.story
    with story.step("reconstructing the volumes from disk"):
        rebuilt = pods.reconstruct()
        rows = rebuilt.to_dict()["volumes"]
        write_table(
            [{**r, "pod": r["pod_uid"][:8]} for r in rows],
            ("pod", "plugin", "volume", "mode", "mount", "device"), story.out,
        )
        on_disk = sum(1 for p in demo.desired for v in p.volumes
                      if v.plugin_name != "kubernetes.io/host-path")
        story.check(len(rows) == on_disk,
                    f"all {on_disk} pod volumes kept on disk were found ({len(rows)})")
        story.check(not rebuilt.failures and not rebuilt.orphans,
                    "no volume failed to rebuild and no device mount is orphaned")
        bound = sum(len(r["subpaths"]) for r in rows)
        if bound:
            story.say(f"{bound} subPath binds found with their volumes")
        states = {p.state.value for p in pods.manager.actual.mounted_volumes()}
        story.check(states == {"uncertain"},
                    "every rebuilt mount is marked uncertain until confirmed")
        result = pods.sync(timeout=demo.args.timeout)
        report_sync(result, story.out)
        story.check(result.converged, "the volumes are confirmed (set up again, idempotently)")
        _check_markers(story, demo.written)


def _shared_filesystem(demo: _Demo, runtime: NodeRuntime, pods: RecordedPods) -> None:
    from kubevol.mount.guard import check_unmount_device

    story = demo.story
    with story.step("one of two volumes of one filesystem goes: the unstage guard"):
        first, second = [v for p in demo.desired for v in p.volumes
                         if v.volume_name.startswith(SHARED_DRIVER + "^")]
        runtime.records.write(PodRecord(uid=first.pod_uid, state=PodState.TERMINATING,
                                        objects=()))
        pods.refresh()
        pods.manager.reconcile()  # one pass: the pod's publish goes, the staging stays
        pods.manager.executor.wait_idle(demo.args.timeout)
        for policy in ("kubelet", "safe"):
            verdict = check_unmount_device(first.device_mount_path, root_dir=demo.root,
                                           policy=policy)
            story.say(f"{policy} policy: {'may unstage' if verdict.allowed else 'refuses'}: "
                      f"{verdict.message.replace(demo.root + '/', '<root>/')}")
            story.check(verdict.allowed == (policy == "safe"),
                        f"the {policy} policy {'allows' if policy == 'safe' else 'refuses'} "
                        "the unstage while the other volume is staged")
        result = pods.sync(timeout=demo.args.timeout)
        story.check(result.converged and not os.path.ismount(first.device_mount_path)
                    and os.path.ismount(second.device_mount_path),
                    "the pod went and its volume was unstaged; the other stays staged")


def _rmdir_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _delete_quietly(client: CSIClient, volume_id: str) -> None:
    with contextlib.suppress(KubevolError):
        client.delete_volume(volume_id)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve the bundled hostpath CSI driver in-process, mount the volumes of the "
        "example pods (CSI filesystem and block with subPaths, emptyDir, hostPath, "
        "configMap, secret, downwardAPI, projected with a token, a local PV, two volumes of "
        "one shared filesystem), drop the in-memory state as a crash would, rebuild it from "
        "disk, tear everything down and check nothing is left. Needs root (mounts and "
        "loop devices). Exits 1 if any check fails."
    )
    parser.add_argument("--examples", default=str(examples_dir()), metavar="DIR",
                        help="directory of example manifests (default: the ones shipped "
                        "with kubevol)")
    parser.add_argument("--workdir", default=None, metavar="DIR",
                        help="where to create the throw-away root (default: the temp dir)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the throw-away directory (it is empty unless a check failed)")
    parser.add_argument("--timeout", type=DURATION, default=60.0,
                        help="how long each convergence may take, a Go duration or seconds "
                        "(default: 1m)")
    parser.set_defaults(func=run)

