"""``kubernetes.io/host-path``: a file or directory of the node itself.

Set-up checks the path against the volume's ``type`` (creating it for the ``…OrCreate``
types). The provisioner creates directories under a configured base directory, and the
deleter and recycler refuse to touch anything outside it or to cross a mount.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kubevol.errors import HostPathTypeError, KubevolError, OperationError, SpecError
from kubevol.host import VolumeHost
from kubevol.k8s.pod import Pod
from kubevol.layout import is_below, validate_path_segment
from kubevol.metrics import MetricsNil
from kubevol.mount import remove_tree_on_one_device
from kubevol.plugin import (
    DeletableVolumePlugin,
    EventRecorder,
    PersistentVolumePlugin,
    ProvisionableVolumePlugin,
    RecyclableVolumePlugin,
)
from kubevol.spec import Spec
from kubevol.types import Attributes, MounterArgs, ReconstructedVolume, VolumeOptions
from kubevol.volume import Deleter, Metrics, Mounter, Provisioner, Unmounter

if TYPE_CHECKING:
    from kubernetes.client import (
        V1HostPathVolumeSource,
        V1Node,
        V1PersistentVolume,
        V1TopologySelectorTerm,
    )

HOST_PATH_PLUGIN_NAME = "kubernetes.io/host-path"

#: What each ``type:`` demands, as (stat predicate, what it is called).
_TYPE_CHECKS = {
    "Directory": (stat.S_ISDIR, "a directory"),
    "DirectoryOrCreate": (stat.S_ISDIR, "a directory"),
    "File": (stat.S_ISREG, "a regular file"),
    "FileOrCreate": (stat.S_ISREG, "a regular file"),
    "Socket": (stat.S_ISSOCK, "a socket"),
    "CharDevice": (stat.S_ISCHR, "a character device"),
    "BlockDevice": (stat.S_ISBLK, "a block device"),
}


def describe_file_type(mode: int) -> str:
    """What kind of file ``mode`` is, in words."""
    for predicate, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
    ):
        if predicate(mode):
            return name
    return "an unknown kind of file"


def check_host_path_type(path: str, path_type: str | None) -> None:
    """Check (and for ``…OrCreate`` make) ``path`` as ``path_type`` demands.

    An empty type checks nothing. Raises HostPathTypeError saying what was found instead.
    """
    if not path_type:
        return
    if path_type not in _TYPE_CHECKS:
        raise HostPathTypeError(
            f"hostPath {path!r} has unknown type {path_type!r}; "
            f"expected one of {', '.join(sorted(_TYPE_CHECKS))}"
        )
    if path_type == "DirectoryOrCreate" and not os.path.lexists(path):
        os.makedirs(path, mode=0o755, exist_ok=True)
    elif path_type == "FileOrCreate" and not os.path.lexists(path):
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise HostPathTypeError(
                f"hostPath {path!r} (FileOrCreate): parent directory {parent!r} does not exist"
            )
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        os.close(fd)
    predicate, wanted = _TYPE_CHECKS[path_type]
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as exc:
        raise HostPathTypeError(
            f"hostPath type check failed: {path!r} does not exist (type {path_type} needs "
            f"{wanted})"
        ) from exc
    if not predicate(mode):
        raise HostPathTypeError(
            f"hostPath type check failed: {path!r} is not {wanted} "
            f"(type {path_type}); found {describe_file_type(mode)}"
        )


def _source(spec: Spec) -> V1HostPathVolumeSource:
    if spec.volume is not None and spec.volume.host_path is not None:
        return spec.volume.host_path
    pv = spec.persistent_volume
    if pv is not None and pv.spec is not None and pv.spec.host_path is not None:
        return pv.spec.host_path
    raise SpecError(f"volume {spec.name()!r} is not a hostPath volume")


class HostPathPlugin(
    PersistentVolumePlugin,
    RecyclableVolumePlugin,
    DeletableVolumePlugin,
    ProvisionableVolumePlugin,
):
    """Node paths as volumes. ``provisioning_dir`` enables the provisioner and deleter."""

    def __init__(self, *, provisioning_dir: str | None = None) -> None:
        self._host: VolumeHost | None = None
        self.provisioning_dir = os.path.abspath(provisioning_dir) if provisioning_dir else None

    def init(self, host: VolumeHost) -> None:
        self._host = host

    def get_plugin_name(self) -> str:
        return HOST_PATH_PLUGIN_NAME

    def can_support(self, spec: Spec) -> bool:
        try:
            _source(spec)
        except SpecError:
            return False
        return True

    def get_volume_name(self, spec: Spec) -> str:
        return str(_source(spec).path)

    def get_access_modes(self) -> list[str]:
        return ["ReadWriteOnce"]

    def new_mounter(self, spec: Spec, pod: Pod | None, opts: VolumeOptions) -> HostPathVolume:
        source = _source(spec)
        return HostPathVolume(path=source.path, path_type=source.type, read_only=spec.read_only)

    def new_unmounter(self, volume_name: str, pod_uid: str) -> HostPathVolume:
        return HostPathVolume(path="", path_type=None)

    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        from kubernetes.client import V1HostPathVolumeSource, V1Volume

        # The kubelet keeps nothing on disk for hostPath; the path is the volume name.
        volume = V1Volume(name=volume_name, host_path=V1HostPathVolumeSource(path=volume_name))
        return ReconstructedVolume(spec=Spec.from_volume(volume))

    def _inside_provisioning_dir(self, path: str, action: str) -> str:
        base = self.provisioning_dir
        if base is None:
            raise KubevolError(f"cannot {action}: hostPath provisioning_dir is not configured")
        real = os.path.realpath(path)
        if not is_below(real, base):
            raise OperationError(
                f"refusing to {action} {path!r}: it is not inside the provisioning directory "
                f"{base!r}"
            )
        return real

    def recycle(self, pv_name: str, spec: Spec, event_recorder: EventRecorder | None) -> None:
        """Empty the volume's directory in place (no pod needed); mounts inside stop it."""
        path = self._inside_provisioning_dir(_source(spec).path, "recycle")
        for entry in os.listdir(path):
            child = os.path.join(path, entry)
            if os.path.isdir(child) and not os.path.islink(child):
                remove_tree_on_one_device(child)
            else:
                os.unlink(child)
        if event_recorder is not None:
            event_recorder("Normal", f"recycled hostPath volume {pv_name} at {path}")

    def new_deleter(self, spec: Spec) -> HostPathDeleter:
        return HostPathDeleter(self, str(_source(spec).path))

    def new_provisioner(self, options: VolumeOptions) -> HostPathProvisioner:
        if self.provisioning_dir is None:
            raise KubevolError("hostPath provisioning is disabled: set provisioning_dir")
        return HostPathProvisioner(self.provisioning_dir, options)


class HostPathVolume(Mounter, Unmounter):
    """A hostPath volume. Set-up is the type check; the path itself is what pods use."""

    def __init__(self, *, path: str, path_type: str | None, read_only: bool = False) -> None:
        self._path = path
        self._path_type = path_type
        self._read_only = read_only

    def get_path(self) -> str:
        return self._path

    def get_metrics(self) -> Metrics:
        # The kubelet does not measure hostPath volumes.
        return MetricsNil().get_metrics()

    def can_mount(self) -> None:
        """Nothing is needed."""

    def get_attributes(self) -> Attributes:
        return Attributes(read_only=self._read_only, managed=False, selinux_relabel=False)

    def set_up(self, args: MounterArgs) -> None:
        """Check (or create) the path according to its type. Idempotent."""
        check_host_path_type(self._path, self._path_type)

    def set_up_at(self, directory: str, args: MounterArgs) -> None:
        raise OperationError(
            f"set_up_at({directory!r}) does not make sense for hostPath volumes: use set_up"
        )

    def tear_down(self) -> None:
        """Nothing to undo: the node's path is not the volume's to remove."""

    def tear_down_at(self, directory: str) -> None:
        raise OperationError(
            f"tear_down_at({directory!r}) does not make sense for hostPath volumes"
        )


class HostPathDeleter(Deleter):
    """Deletes a provisioned hostPath directory (only inside the provisioning directory)."""

    def __init__(self, plugin: HostPathPlugin, path: str) -> None:
        self._plugin = plugin
        self._path = path

    def get_path(self) -> str:
        return self._path

    def get_metrics(self) -> Metrics:
        return MetricsNil().get_metrics()

    def delete(self) -> None:
        real = self._plugin._inside_provisioning_dir(self._path, "delete")
        if os.path.lexists(real):
            remove_tree_on_one_device(real)


class HostPathProvisioner(Provisioner):
    """Creates a directory for a new PersistentVolume under the provisioning directory."""

    def __init__(self, base_dir: str, options: VolumeOptions) -> None:
        self._base_dir = base_dir
        self._options = options

    def provision(
        self,
        selected_node: V1Node | None = None,
        allowed_topologies: Sequence[V1TopologySelectorTerm] = (),
    ) -> V1PersistentVolume:
        from kubernetes import client

        name = self._options.pv_name or f"pv-{uuid.uuid4()}"
        path = os.path.join(self._base_dir, validate_path_segment(name, "PV name"))
        os.makedirs(path, mode=0o750, exist_ok=False)
        pvc = self._options.pvc
        capacity = "0"
        access_modes = ["ReadWriteOnce"]
        if pvc is not None and pvc.spec is not None:
            requests = (pvc.spec.resources.requests or {}) if pvc.spec.resources else {}
            capacity = requests.get("storage", capacity)
            access_modes = pvc.spec.access_modes or access_modes
        return client.V1PersistentVolume(
            api_version="v1",
            kind="PersistentVolume",
            metadata=client.V1ObjectMeta(
                name=name,
                annotations={"kubernetes.io/createdby": "hostpath-dynamic-provisioner"},
            ),
            spec=client.V1PersistentVolumeSpec(
                persistent_volume_reclaim_policy=self._options.persistent_volume_reclaim_policy,
                access_modes=access_modes,
                capacity={"storage": capacity},
                host_path=client.V1HostPathVolumeSource(path=path),
                mount_options=list(self._options.mount_options) or None,
            ),
        )
