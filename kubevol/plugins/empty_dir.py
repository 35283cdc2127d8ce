"""``kubernetes.io/empty-dir``: a scratch directory that lives as long as its pod.

The disk medium is a directory under the pod's volume dir; the ``Memory`` medium is a
tmpfs mounted there, sized by ``sizeLimit``. A ``ready`` marker in the pod's plugin dir
records a completed set-up, as the kubelet keeps one.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from kubevol.errors import MountError, SpecError
from kubevol.host import VolumeHost
from kubevol.k8s.pod import Pod
from kubevol.layout import validate_path_segment
from kubevol.metrics import MetricsDu
from kubevol.mount import is_corrupted_mount, remove_tree_on_one_device
from kubevol.plugin import VolumePlugin
from kubevol.plugins.ownership import set_volume_ownership
from kubevol.spec import KnownSource, Spec, pod_uid, quantity_bytes
from kubevol.types import Attributes, MounterArgs, ReconstructedVolume, VolumeOptions
from kubevol.util import fdtree
from kubevol.volume import Metrics, Mounter, Unmounter

if TYPE_CHECKING:
    from kubernetes.client import V1EmptyDirVolumeSource

EMPTY_DIR_PLUGIN_NAME = "kubernetes.io/empty-dir"
MEDIUM_DEFAULT = ""
MEDIUM_MEMORY = "Memory"
_READY_FILE = "ready"


class EmptyDirPlugin(VolumePlugin):
    """Scratch volumes on the node's disk or in memory."""

    def __init__(self) -> None:
        self._host: VolumeHost | None = None

    @property
    def host(self) -> VolumeHost:
        if self._host is None:
            raise RuntimeError("EmptyDirPlugin used before init()")
        return self._host

    def init(self, host: VolumeHost) -> None:
        self._host = host

    def get_plugin_name(self) -> str:
        return EMPTY_DIR_PLUGIN_NAME

    def can_support(self, spec: Spec) -> bool:
        return _source(spec) is not None

    def get_volume_name(self, spec: Spec) -> str:
        if not self.can_support(spec):
            raise SpecError(f"volume {spec.name()!r} is not an emptyDir volume")
        return spec.name()

    def new_mounter(self, spec: Spec, pod: Pod, opts: VolumeOptions) -> EmptyDir:
        source = _source(spec)
        if source is None:
            raise SpecError(f"volume {spec.name()!r} is not an emptyDir volume")
        medium = source.medium or MEDIUM_DEFAULT
        if medium not in (MEDIUM_DEFAULT, MEDIUM_MEMORY):
            raise SpecError(
                f"emptyDir {spec.name()!r} has medium {medium!r}; "
                f"kubevol supports {MEDIUM_DEFAULT!r} (disk) and {MEDIUM_MEMORY!r}"
            )
        return EmptyDir(
            host=self.host,
            pod_uid=pod_uid(pod),
            volume_name=spec.name(),
            medium=medium,
            size_limit=quantity_bytes(source.size_limit),
        )

    def new_unmounter(self, volume_name: str, pod_uid: str) -> EmptyDir:
        # The medium is found on disk at tear-down: a tmpfs mount means Memory.
        return EmptyDir(host=self.host, pod_uid=pod_uid, volume_name=volume_name)

    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        medium = MEDIUM_DEFAULT
        try:
            if not self.host.get_mounter().is_likely_not_mount_point(volume_path):
                medium = MEDIUM_MEMORY
        except (FileNotFoundError, NotADirectoryError):
            pass  # nothing there (any more): a disk emptyDir, as the kubelet assumes
        empty_dir = {"medium": medium} if medium else {}
        return ReconstructedVolume(spec=Spec.from_api_data(
            volume={"name": volume_name, "emptyDir": empty_dir},
            known={_SOURCE_KEY: KnownSource(empty_dir)},
        ))


#: Where a Spec keeps its emptyDir source (:meth:`~kubevol.spec.Spec.derived`).
_SOURCE_KEY = "kubernetes.io/empty-dir:source"


def _read_source(spec: Spec) -> V1EmptyDirVolumeSource | None:
    return None if spec.is_persistent_volume else spec.volume.empty_dir


def _source(spec: Spec) -> V1EmptyDirVolumeSource | KnownSource | None:
    """The emptyDir source of ``spec`` (``V1EmptyDirVolumeSource``, or the
    :class:`~kubevol.spec.KnownSource` a reconstructed Spec carries), None when it has none."""
    return spec.derived(_SOURCE_KEY, _read_source)


def set_up_finished(host: VolumeHost, pod_uid: str, volume_name: str, spec: Spec) -> bool:
    """Whether the disk-medium emptyDir ``volume_name`` of the pod (``spec``) was set up to
    its end: its ready marker, written by the set-up's last step, is there, and its
    directory is a real directory (not a link). A Memory one is finished only while its
    tmpfs is mounted: a mount check, not this."""
    source = _source(spec)
    if source is None or (source.medium or MEDIUM_DEFAULT) != MEDIUM_DEFAULT:
        return False
    volume = EmptyDir(host=host, pod_uid=pod_uid, volume_name=volume_name)
    try:
        return (os.path.isfile(volume._ready_path())
                and stat.S_ISDIR(os.lstat(volume.get_path()).st_mode))
    except OSError:
        return False


class EmptyDir(Mounter, Unmounter):
    """One pod's emptyDir volume; sets it up and tears it down."""

    def __init__(
        self,
        *,
        host: VolumeHost,
        pod_uid: str,
        volume_name: str,
        medium: str = MEDIUM_DEFAULT,
        size_limit: int | None = None,
    ) -> None:
        self._host = host
        self._pod_uid = pod_uid
        self._volume_name = validate_path_segment(volume_name, "volume name")
        self._medium = medium
        self._size_limit = size_limit

    def get_path(self) -> str:
        return self._host.get_pod_volume_dir(
            self._pod_uid, EMPTY_DIR_PLUGIN_NAME, self._volume_name
        )

    def _ready_path(self) -> str:
        plugin_dir = self._host.get_pod_plugin_dir(self._pod_uid, EMPTY_DIR_PLUGIN_NAME)
        return os.path.join(plugin_dir, self._volume_name, _READY_FILE)

    def get_metrics(self) -> Metrics:
        return MetricsDu(self.get_path()).get_metrics()

    def can_mount(self) -> None:
        """Nothing is needed beyond the kernel's tmpfs."""

    def get_attributes(self) -> Attributes:
        return Attributes(read_only=False, managed=True, selinux_relabel=True)

    def _is_mounted(self, directory: str) -> bool:
        return not self._host.get_mounter().is_likely_not_mount_point(directory)

    def set_up_at(self, directory: str, args: MounterArgs) -> None:
        """Create the directory (and mount tmpfs for Memory). Idempotent. A link where the
        directory belongs raises UnsafePathError (nothing is made or changed through it)."""
        fdtree.refuse_links(directory, beneath=self._host.get_pods_dir())
        already_set_up = os.path.exists(self._ready_path()) and os.path.isdir(directory)
        if already_set_up and (self._medium != MEDIUM_MEMORY or self._is_mounted(directory)):
            return
        os.makedirs(directory, exist_ok=True)
        if self._medium == MEDIUM_MEMORY and not self._is_mounted(directory):
            options = [f"size={self._size_limit}"] if self._size_limit else []
            self._host.get_mounter().mount("tmpfs", directory, "tmpfs", options)
        # Any container user must be able to write: the kubelet makes it world-writable.
        os.chmod(directory, 0o777)
        set_volume_ownership(directory, args.fs_group, args.fs_group_change_policy)
        ready = self._ready_path()
        os.makedirs(os.path.dirname(ready), exist_ok=True)
        with open(ready, "w", encoding="utf-8"):
            pass

    def tear_down_at(self, directory: str) -> None:
        """Unmount tmpfs or delete the directory, then drop the ready marker. Idempotent.

        A failed unmount raises MountError and deletes nothing. A link where the directory
        (or the pod's directories above it) belongs raises UnsafePathError: nothing is
        unmounted or deleted through it.
        """
        pods_dir = self._host.get_pods_dir()
        fdtree.refuse_links(directory, beneath=pods_dir)
        if is_corrupted_mount(directory):
            # A dead mount (e.g. a FUSE daemon that died) looks absent to lexists(); it
            # must still be unmounted, and its directory removed, like a live one.
            self._host.get_mounter().unmount(directory)
            os.rmdir(directory)
        elif os.path.lexists(directory):
            if self._is_mounted(directory):
                self._host.get_mounter().unmount(directory)
                if self._is_mounted(directory):
                    raise MountError(f"{directory!r} is still mounted after unmount")
                os.rmdir(directory)
            else:
                remove_tree_on_one_device(directory, beneath=pods_dir)
        ready = self._ready_path()
        fdtree.refuse_links(os.path.dirname(ready), beneath=pods_dir)
        if os.path.exists(ready):
            os.unlink(ready)
            os.rmdir(os.path.dirname(ready))
