"""A kubelet root shaped the way a real node has it, for tests (and benchmarks) that must
meet what a live kubelet leaves on disk rather than what kubevol writes.

Everything here is built from the kubelet's own facts, never from kubevol's writers (which
are what the tests check). The facts and where they come from (kubernetes/kubernetes):

- ``pkg/volume/csi/csi_mounter.go`` (``volDataKey``, ``SetUpAt``): a pod's CSI volume is
  ``pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount`` with ``vol_data.json`` beside it,
  keys ``specVolID``, ``volumeHandle``, ``driverName``, ``nodeName``, ``attachmentID``,
  ``volumeLifecycleMode`` and, when the pod mounts with an SELinux context,
  ``seLinuxMountContext``. ``pkg/volume/csi/csi_plugin.go`` (``NewMounter``) writes the
  same keys; an inline (ephemeral) volume's handle is ``makeVolumeHandle(podUID, spec)`` =
  ``csi-<sha256hex(podUID + spec)>`` (``csi_util.go``) and it is never staged.
- ``pkg/volume/csi/csi_attacher.go`` (``MountDevice``, ``getAttachmentName``,
  ``makeDeviceMountPath``): staging at
  ``plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/globalmount`` with a
  ``vol_data.json`` holding ``volumeHandle`` and ``driverName`` (and
  ``seLinuxMountContext``); ``attachmentID`` = ``csi-<sha256hex(handle + driver + node)>``.
  ``csi_util.go`` (``saveVolumeData``) encodes the map with ``encoding/json``: compact,
  keys sorted, one trailing newline, file mode 0644 under the usual umask; the directories
  are made 0750.
- ``pkg/volume/util/atomic_writer.go``: a configMap/secret/downwardAPI/projected volume is a
  timestamped directory ``..YYYY_MM_DD_HH_MM_SS.<random>``, a ``..data`` link to it and, for
  each top-level payload path, a user-visible link ``<name> -> ..data/<name>``.
- ``pkg/volume/{configmap,secret,downwardapi,projected}``: each wraps an emptyDir
  (``wrappedVolumeSpec``) — Memory medium (a tmpfs at the volume directory) for secret,
  downwardAPI and projected, the node's disk for configMap; ``pkg/kubelet/volume_host.go``
  (``NewWrapperMounter``) names the wrapped volume ``wrapped_<volume>``, and
  ``pkg/volume/emptydir`` (``SetUpAt`` → ``volumeutil.SetReady``) leaves the ``ready``
  marker in ``pods/<uid>/plugins/kubernetes.io~empty-dir/<volume name>/ready`` — for a
  plain emptyDir too, under its own name.
- ``plugin/pkg/admission/serviceaccount`` names the projected token volume
  ``kube-api-access-<5 characters>`` (generateName's alphabet), with sources
  serviceAccountToken ``token``, configMap ``kube-root-ca.crt`` key ``ca.crt`` and
  downwardAPI ``namespace``, defaultMode 0644.
- ``pkg/volume/local``: a local PV is bind-mounted at
  ``pods/<uid>/volumes/kubernetes.io~local-volume/<pv>`` itself (no ``mount`` sub-dir).
- ``pkg/volume/util/subpath/subpath_linux.go`` (``doBindSubPath``): a subPath is bind-mounted
  at ``pods/<uid>/volume-subpaths/<volume>/<container>/<volumeMount index>``, a directory
  or an empty file according to what it binds.
- The rest of a kubelet root (``pkg/kubelet/kubelet.go``, ``cm/cpumanager``,
  ``cm/memorymanager``, ``cm/devicemanager``, ``apis/podresources``,
  ``pluginmanager``): ``plugins_registry/<driver>-reg.sock``,
  ``plugins/<driver>/csi.sock``, ``pod-resources/kubelet.sock``,
  ``device-plugins/kubelet.sock`` and ``kubelet_internal_checkpoint``, ``checkpoints/``,
  ``cpu_manager_state``, ``memory_manager_state``; in each pod directory ``etc-hosts`` and
  ``containers/<name>/<id>`` (termination logs).

Use :func:`build_kubelet_root` with a :class:`~kubevol.testing.mount_rig.MountRig` (root,
inside a private mount namespace); the rig undoes every mount and the loop device.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path

import attrs

from kubevol.testing.mount_rig import MountRig

#: The CSI driver of the PersistentVolumes (any name: no driver need run to scan).
PV_DRIVER = "ebs.csi.example.com"
#: The CSI driver of the inline ephemeral volumes (the secrets-store driver's shape).
EPHEMERAL_DRIVER = "secrets-store.csi.k8s.io"
NODE_NAME = "node-1"
SELINUX_CONTEXT = "system_u:object_r:container_file_t:s0:c12,c34"

#: generateName's suffix alphabet (k8s.io/apimachinery/pkg/util/rand: no vowels, no 0 1 3).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_TIMESTAMP = "2026_01_15_08_30_00"


@attrs.frozen(kw_only=True)
class NodeVolume:
    """One volume directory the fixture made under ``pods/<uid>/volumes``."""

    pod_uid: str
    #: The plugin name (``kubernetes.io/projected``), unescaped.
    plugin: str
    name: str
    path: Path
    #: Whether something is mounted at the volume (at ``path``, or ``path/mount`` for CSI).
    mounted: bool
    #: A plugin kubevol does not know (third-party / out-of-tree): to be left alone.
    unknown: bool = False


@attrs.frozen(kw_only=True)
class SubPathBind:
    """A subPath bind under ``pods/<uid>/volume-subpaths``."""

    pod_uid: str
    volume: str
    path: Path


@attrs.frozen(kw_only=True)
class KubeletRoot:
    """What :func:`build_kubelet_root` made."""

    root: Path
    node_name: str
    pods: tuple[str, ...]
    volumes: tuple[NodeVolume, ...]
    subpaths: tuple[SubPathBind, ...]
    #: The staging mounts of the CSI PersistentVolumes, by PV name (one loop device).
    staging: Mapping[str, Path]
    #: The files and directories of the root that are no pod's.
    non_pod_paths: tuple[Path, ...]

    def volumes_of(self, pod_uid: str) -> list[NodeVolume]:
        """The volumes of one pod."""
        return [v for v in self.volumes if v.pod_uid == pod_uid]

    @property
    def known(self) -> list[NodeVolume]:
        """The volumes of plugins kubevol has."""
        return [v for v in self.volumes if not v.unknown]


# --- small facts --------------------------------------------------------------------------


def pod_uid(index: int) -> str:
    """A stable, real-looking pod UID (a UUID) for pod ``index``."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kubevol-real-node-pod-{index}"))


def sha256_hex(text: str) -> str:
    """``sha256hex`` as the CSI plugin names directories and handles."""
    return hashlib.sha256(text.encode()).hexdigest()


def attachment_id(handle: str, driver: str, node: str) -> str:
    """``getAttachmentName``: ``csi-<sha256hex(handle + driver + node)>``."""
    return "csi-" + sha256_hex(handle + driver + node)


def inline_volume_handle(uid: str, spec_name: str) -> str:
    """``makeVolumeHandle``: ``csi-<sha256hex(podUID + spec name)>``."""
    return "csi-" + sha256_hex(uid + spec_name)


def generated_suffix(seed: str, length: int = 5) -> str:
    """A generateName suffix, stable for ``seed``."""
    rng = random.Random(seed)
    return "".join(rng.choice(_NAME_ALPHABET) for _ in range(length))


def save_volume_data(directory: Path, data: Mapping[str, str]) -> Path:
    """``saveVolumeData``: ``<directory>/vol_data.json`` as Go's encoder writes a map."""
    path = directory / "vol_data.json"
    path.write_text(json.dumps(dict(data), sort_keys=True, separators=(",", ":")) + "\n")
    os.chmod(path, 0o644)
    return path


def _mkdir(path: Path, mode: int = 0o750) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    return path


def write_atomic_volume(directory: Path, payload: Mapping[str, bytes], *, mode: int = 0o644,
                        seed: str = "") -> None:
    """The atomic writer's layout in ``directory``: ``..<timestamp>.<random>/`` holding the
    payload, ``..data`` linking to it, ``<top-level name> -> ..data/<top-level name>``."""
    ts_dir = f"..{_TIMESTAMP}.{random.Random(seed or str(directory)).randrange(1 << 32)}"
    _mkdir(directory / ts_dir, 0o755)
    tops = set()
    for rel, content in sorted(payload.items()):
        target = directory / ts_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        os.chmod(target, mode)
        tops.add(rel.split("/")[0])
    os.symlink(ts_dir, directory / "..data")
    for top in sorted(tops):
        os.symlink(f"..data/{top}", directory / top)


def _unix_socket_file(path: Path) -> Path:
    """A socket inode at ``path`` as a listening server leaves it (``mknod`` of S_IFSOCK:
    no bind, so no 108-byte sun_path limit on long test paths)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFSOCK | 0o660)
    return path


# --- the pieces of a pod --------------------------------------------------------------------


class _PodBuilder:
    """Builds one pod's directory; records what it made."""

    def __init__(self, node: _NodeBuilder, uid: str) -> None:
        self.node, self.uid = node, uid
        self.dir = _mkdir(node.root / "pods" / uid)
        _mkdir(self.dir / "volumes")
        _mkdir(self.dir / "plugins")
        (self.dir / "etc-hosts").write_text("127.0.0.1\tlocalhost\n10.0.0.7\tweb-0\n")
        os.chmod(self.dir / "etc-hosts", 0o644)

    def volume_dir(self, plugin: str, name: str, mode: int = 0o750) -> Path:
        return _mkdir(self.dir / "volumes" / plugin.replace("/", "~") / name, mode)

    def add(self, plugin: str, name: str, path: Path, *, mounted: bool,
            unknown: bool = False) -> NodeVolume:
        volume = NodeVolume(pod_uid=self.uid, plugin=plugin, name=name, path=path,
                            mounted=mounted, unknown=unknown)
        self.node.volumes.append(volume)
        return volume

    def ready_marker(self, emptydir_name: str) -> None:
        """``SetReady`` of the emptyDir plugin's metadata directory for this volume."""
        meta = _mkdir(self.dir / "plugins" / "kubernetes.io~empty-dir" / emptydir_name)
        (meta / "ready").touch()
        os.chmod(meta / "ready", 0o644)

    def container(self, name: str) -> None:
        """A container's termination-log file, as the kubelet keeps it."""
        path = _mkdir(self.dir / "containers" / name) / generated_suffix(self.uid + name, 8)
        path.touch()
        os.chmod(path, 0o666)

    # Wrapped-emptyDir kinds (atomic writer) ------------------------------------------------

    def atomic_volume(self, plugin: str, name: str, payload: Mapping[str, bytes], *,
                      memory: bool, mode: int = 0o644) -> NodeVolume:
        path = self.volume_dir(plugin, name, 0o777)
        if memory:
            self.node.rig.tmpfs(path)
            os.chmod(path, 0o1777)
        write_atomic_volume(path, payload, mode=mode, seed=f"{self.uid}/{name}")
        self.ready_marker(f"wrapped_{name}")
        return self.add(plugin, name, path, mounted=memory)

    def kube_api_access(self) -> NodeVolume:
        """The projected service-account token volume every pod gets."""
        name = "kube-api-access-" + generated_suffix(self.uid)
        token = f"eyJhbGciOiJSUzI1NiJ9.{self.uid.replace('-', '')}.c2lnbmF0dXJl".encode()
        return self.atomic_volume("kubernetes.io/projected", name, {
            "token": token,
            "ca.crt": b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            "namespace": b"shop",
        }, memory=True)

    def config_map(self, name: str = "config") -> NodeVolume:
        return self.atomic_volume("kubernetes.io/configmap", name, {
            "app.properties": b"color=blue\n", "conf.d/extra.conf": b"x=1\n",
        }, memory=False)

    def secret(self, name: str = "creds") -> NodeVolume:
        return self.atomic_volume("kubernetes.io/secret", name, {
            "username": b"admin", "password": b"s3cr3t-canary",
        }, memory=True, mode=0o400)

    def downward_api(self, name: str = "podinfo") -> NodeVolume:
        return self.atomic_volume("kubernetes.io/downward-api", name, {
            "labels": b'app="web"\ntier="front"', "annotations": b"",
        }, memory=True)

    def empty_dir(self, name: str = "tmp") -> NodeVolume:
        path = self.volume_dir("kubernetes.io/empty-dir", name, 0o777)
        (path / "scratch.bin").write_bytes(b"\0" * 64)
        self.ready_marker(name)
        return self.add("kubernetes.io/empty-dir", name, path, mounted=False)

    # CSI --------------------------------------------------------------------------------------

    def csi_pv(self, pv: str, *, selinux: bool = False) -> NodeVolume:
        """A CSI PersistentVolume published into this pod (bind of its staging mount)."""
        handle = self.node.handles[pv]
        path = self.volume_dir("kubernetes.io/csi", pv)
        data = {
            "specVolID": pv, "volumeHandle": handle, "driverName": PV_DRIVER,
            "nodeName": self.node.node_name,
            "attachmentID": attachment_id(handle, PV_DRIVER, self.node.node_name),
            "volumeLifecycleMode": "Persistent",
        }
        if selinux:
            data["seLinuxMountContext"] = SELINUX_CONTEXT
        save_volume_data(path, data)
        self.node.rig.bind(self.node.staging[pv], _mkdir(path / "mount"))
        return self.add("kubernetes.io/csi", pv, path, mounted=True)

    def csi_inline(self, name: str = "secrets-store") -> NodeVolume:
        """An inline CSI ephemeral volume (the driver mounts a tmpfs; never staged)."""
        handle = inline_volume_handle(self.uid, name)
        path = self.volume_dir("kubernetes.io/csi", name)
        save_volume_data(path, {
            "specVolID": name, "volumeHandle": handle, "driverName": EPHEMERAL_DRIVER,
            "nodeName": self.node.node_name,
            "attachmentID": attachment_id(handle, EPHEMERAL_DRIVER, self.node.node_name),
            "volumeLifecycleMode": "Ephemeral",
        })
        mount = self.node.rig.tmpfs(_mkdir(path / "mount"))
        (mount / "db-password").write_text("canary")
        return self.add("kubernetes.io/csi", name, path, mounted=True)

    def local_pv(self, pv: str, disk: Path) -> NodeVolume:
        path = self.volume_dir("kubernetes.io/local-volume", pv)
        self.node.rig.bind(disk, path)
        return self.add("kubernetes.io/local-volume", pv, path, mounted=True)

    def unknown_plugin(self, escaped: str, name: str, *, mounted: bool) -> NodeVolume:
        """A volume of a plugin kubevol does not have (flexVolume, out-of-tree, ...)."""
        path = self.volume_dir(escaped.replace("~", "/"), name)
        if mounted:
            self.node.rig.tmpfs(path)
        (path / "data.txt").write_text("not kubevol's\n")
        return self.add(escaped.replace("~", "/"), name, path, mounted=mounted, unknown=True)

    # subPath ------------------------------------------------------------------------------

    def subpath(self, volume: NodeVolume, container: str, index: int, rel: str) -> SubPathBind:
        """``doBindSubPath``: bind ``<volume mount>/<rel>`` at
        ``volume-subpaths/<volume>/<container>/<index>`` (a dir, or an empty file)."""
        base = volume.path / "mount" if volume.plugin == "kubernetes.io/csi" else volume.path
        source = Path(os.path.realpath(base / rel))
        target = self.dir / "volume-subpaths" / volume.name / container / str(index)
        _mkdir(target.parent)
        if source.is_dir():
            _mkdir(target)
        else:
            target.touch()
        self.node.rig.bind(source, target)
        bind = SubPathBind(pod_uid=self.uid, volume=volume.name, path=target)
        self.node.subpaths.append(bind)
        return bind


class _NodeBuilder:
    def __init__(self, rig: MountRig, root: Path, node_name: str) -> None:
        self.rig, self.root, self.node_name = rig, root, node_name
        self.volumes: list[NodeVolume] = []
        self.subpaths: list[SubPathBind] = []
        self.staging: dict[str, Path] = {}
        self.handles: dict[str, str] = {}
        self.non_pod: list[Path] = []

    def stage_pvs(self, device: str, pvs: Mapping[str, str], *, selinux: set[str]) -> None:
        """Stage each PV (name → handle) by mounting ``device`` at its globalmount."""
        for pv, handle in pvs.items():
            vol_dir = _mkdir(self.root / "plugins/kubernetes.io/csi" / PV_DRIVER
                             / sha256_hex(handle))
            data = {"volumeHandle": handle, "driverName": PV_DRIVER}
            if pv in selinux:
                data["seLinuxMountContext"] = SELINUX_CONTEXT
            save_volume_data(vol_dir, data)
            self.staging[pv] = self.rig.mount(device, _mkdir(vol_dir / "globalmount"),
                                              fstype="ext4")
            self.handles[pv] = handle

    def non_pod_files(self) -> None:
        r = self.root
        made = [
            _unix_socket_file(r / "plugins_registry" / f"{PV_DRIVER}-reg.sock"),
            _unix_socket_file(r / "plugins_registry" / f"{EPHEMERAL_DRIVER}-reg.sock"),
            _unix_socket_file(r / "plugins" / PV_DRIVER / "csi.sock"),
            _unix_socket_file(r / "plugins" / EPHEMERAL_DRIVER / "csi.sock"),
            _unix_socket_file(r / "pod-resources" / "kubelet.sock"),
            _unix_socket_file(r / "device-plugins" / "kubelet.sock"),
        ]
        checkpoint = r / "device-plugins" / "kubelet_internal_checkpoint"
        checkpoint.write_text('{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},'
                              '"Checksum":1234567890}')
        made.append(checkpoint)
        made.append(_mkdir(r / "checkpoints", 0o700))
        cpu = r / "cpu_manager_state"
        cpu.write_text('{"policyName":"none","defaultCpuSet":"","checksum":1353318690}')
        mem = r / "memory_manager_state"
        mem.write_text('{"policyName":"None","machineState":{},"checksum":1355394478}')
        made += [cpu, mem]
        self.non_pod = made


def build_kubelet_root(rig: MountRig, root: Path, *, pods: int = 3,
                       node_name: str = NODE_NAME) -> KubeletRoot:
    """A kubelet root at ``root`` (created) with ``pods`` pods (at least 2), real mounts made
    through ``rig``:

    - every pod: a projected ``kube-api-access-xxxxx`` (tmpfs), a configMap ``config``
      (disk) with a subPath file bind, a secret ``creds`` and a downwardAPI ``podinfo``
      (tmpfs), an emptyDir ``tmp``, the CSI PV ``pv-shared`` (bind of its staging mount),
      an inline CSI ephemeral volume ``secrets-store`` (tmpfs), a container's files;
    - pod 0 also: the CSI PV ``pv-logs`` (seLinuxMountContext in its vol_data.json) with a
      subPath directory bind, a local PV ``local-pv-1``, and two volumes of plugins kubevol
      does not know (``kubernetes.io~foo``, ``vendor~bar`` — the latter mounted);
    - both PVs staged on ONE ext4 loop device (two mounts of one superblock);
    - the files a kubelet root has besides pods.
    """
    if pods < 2:
        raise ValueError("a real-node root needs at least 2 pods (one shares pv-shared)")
    root.mkdir(parents=True, exist_ok=True)
    node = _NodeBuilder(rig, root, node_name)
    device = rig.loop(rig.image("real-node-pvs.img", size_mib=16))
    node.stage_pvs(device, {"pv-shared": "vol-0a1b2c3d", "pv-logs": "vol-4e5f6a7b"},
                   selinux={"pv-logs"})
    (node.staging["pv-logs"] / "app-logs").mkdir(exist_ok=True)
    disk = _mkdir(root.parent / "mnt-disks-ssd1", 0o755)
    (disk / "index.db").write_text("local data\n")
    uids = []
    for i in range(pods):
        uid = pod_uid(i)
        uids.append(uid)
        pod = _PodBuilder(node, uid)
        pod.container("app")
        pod.kube_api_access()
        config = pod.config_map()
        pod.secret()
        pod.downward_api()
        pod.empty_dir()
        pod.csi_pv("pv-shared")
        pod.csi_inline()
        pod.subpath(config, "app", 2, "app.properties")
        if i == 0:
            logs = pod.csi_pv("pv-logs", selinux=True)
            pod.subpath(logs, "app", 1, "app-logs")
            pod.local_pv("local-pv-1", disk)
            pod.unknown_plugin("kubernetes.io~foo", "thing", mounted=False)
            pod.unknown_plugin("vendor~bar", "flex", mounted=True)
    node.non_pod_files()
    return KubeletRoot(
        root=root,
        node_name=node_name,
        pods=tuple(uids),
        volumes=tuple(node.volumes),
        subpaths=tuple(node.subpaths),
        staging=dict(node.staging),
        non_pod_paths=tuple(node.non_pod),
    )
