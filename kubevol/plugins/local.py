"""``kubernetes.io/local-volume``: local PersistentVolumes (a disk, partition or directory
of this node, named by ``spec.local.path``).

Filesystem mode bind-mounts the path at ``pods/<uid>/volumes/kubernetes.io~local-volume/
<pv>`` (read-only when asked), applying fsGroup on the first mount only, as the kubelet
does; block mode maps the device through the node's block mapping (global map path
``plugins/kubernetes.io/local-volume/volumeDevices/<pv>``). The PV's node affinity is
checked against this node's labels (``kubernetes.io/hostname`` defaults to the node name):
a local PV of another node is refused before anything is mounted.

Reconstruction reads the mount table: the bind's source path is recovered from the
mount's root within its filesystem, so a rebuilt spec names the real local path when the
filesystem is mounted somewhere on the node.
"""

from __future__ import annotations

import logging
import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kubevol.errors import MountError, OperationError, SpecError
from kubevol.host import VolumeHost
from kubevol.k8s.pod import Pod
from kubevol.metrics import MetricsStatFS
from kubevol.mount import MountInterface, cleanup_mount_point
from kubevol.plugin import BlockVolumePlugin, PersistentVolumePlugin
from kubevol.plugins.ownership import set_volume_ownership
from kubevol.spec import Spec, api_object, pod_uid
from kubevol.types import Attributes, MounterArgs, ReconstructedVolume, VolumeOptions
from kubevol.volume import CustomBlockVolumeMapper, CustomBlockVolumeUnmapper, Metrics, Mounter
from kubevol.volume import Unmounter as UnmounterBase

if TYPE_CHECKING:
    from kubernetes.client import V1LocalVolumeSource, V1NodeSelectorRequirement, V1PersistentVolume

log = logging.getLogger(__name__)

LOCAL_VOLUME_PLUGIN_NAME = "kubernetes.io/local-volume"
#: The node label every node carries with its host name.
HOSTNAME_LABEL = "kubernetes.io/hostname"


def _source(spec: Spec) -> V1LocalVolumeSource:
    pv = spec.persistent_volume
    local = getattr(getattr(pv, "spec", None), "local", None) if pv is not None else None
    if local is None:
        raise SpecError(f"volume {spec.name()!r} is not a local PersistentVolume")
    return local


def _validate_local_path(name: str, path: str) -> str:
    if not path:
        raise SpecError(f"LocalVolume volume {name!r} path is empty")
    if not path.startswith("/"):
        raise SpecError(f"LocalVolume volume {name!r}: path {path!r} must be absolute")
    if ".." in path.split("/"):
        raise SpecError(f"invalid path: {path} must not contain '..'")
    return path


def _requirement_matches(req: V1NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    key, op, values = req.key, req.operator, list(req.values or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    raise SpecError(f"node selector operator {op!r} is not valid")


def node_affinity_matches(
    pv: V1PersistentVolume, node_name: str, node_labels: Mapping[str, str]
) -> bool:
    """Whether the PV's ``nodeAffinity.required`` admits this node (no affinity: yes).

    Terms are ORed; a term's ``matchExpressions`` (on labels) and ``matchFields`` (on
    ``metadata.name``) are ANDed; an empty term matches nothing, as in Kubernetes.
    """
    required = getattr(getattr(pv.spec, "node_affinity", None), "required", None)
    if required is None:
        return True
    labels = {HOSTNAME_LABEL: node_name, **node_labels}
    fields = {"metadata.name": node_name}
    for term in required.node_selector_terms or []:
        exprs: Sequence[V1NodeSelectorRequirement] = term.match_expressions or []
        field_exprs: Sequence[V1NodeSelectorRequirement] = term.match_fields or []
        if not exprs and not field_exprs:
            continue
        if all(_requirement_matches(e, labels) for e in exprs) and all(
            _requirement_matches(f, fields) for f in field_exprs
        ):
            return True
    return False


class LocalVolumePlugin(PersistentVolumePlugin, BlockVolumePlugin):
    """Local PersistentVolumes."""

    def __init__(self) -> None:
        self._host: VolumeHost | None = None

    @property
    def host(self) -> VolumeHost:
        if self._host is None:
            raise RuntimeError("LocalVolumePlugin used before init()")
        return self._host

    def init(self, host: VolumeHost) -> None:
        self._host = host

    def get_plugin_name(self) -> str:
        return LOCAL_VOLUME_PLUGIN_NAME

    def can_support(self, spec: Spec) -> bool:
        try:
            _source(spec)
        except SpecError:
            return False
        return True

    def get_volume_name(self, spec: Spec) -> str:
        _source(spec)
        return spec.name()

    def get_access_modes(self) -> list[str]:
        return ["ReadWriteOnce"]

    def supports_mount_option(self) -> bool:
        return True

    def _check_node(self, spec: Spec) -> None:
        node = self.host.get_node_name()
        if not node_affinity_matches(spec.persistent_volume, node, self.host.get_node_labels()):
            raise OperationError(
                f"local PersistentVolume {spec.name()!r} is not available on node {node!r}: "
                "its nodeAffinity does not match this node's labels"
            )

    def new_mounter(self, spec: Spec, pod: Pod, opts: VolumeOptions) -> LocalVolume:
        source = _source(spec)
        self._check_node(spec)
        pv_spec = spec.persistent_volume.spec
        return LocalVolume(
            host=self.host, pod_uid=pod_uid(pod), volume_name=spec.name(),
            local_path=str(source.path or ""), read_only=spec.read_only,
            mount_options=tuple(pv_spec.mount_options or ()),
        )

    def new_unmounter(self, volume_name: str, pod_uid: str) -> LocalVolume:
        return LocalVolume(host=self.host, pod_uid=pod_uid, volume_name=volume_name,
                           local_path="")

    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        """A filesystem-mode local PV named ``volume_name`` whose path is the source of the
        bind at ``volume_path`` when the mount table tells it (empty otherwise, as the
        kubelet leaves it: tear-down needs no path)."""
        source = _bind_source(volume_path, self.host.get_mounter())
        return ReconstructedVolume(spec=_local_pv_spec(volume_name, source, "Filesystem"))

    def new_block_volume_mapper(
        self, spec: Spec, pod: Pod, opts: VolumeOptions
    ) -> LocalBlockVolume:
        source = _source(spec)
        self._check_node(spec)
        return LocalBlockVolume(host=self.host, pod_uid=pod_uid(pod), volume_name=spec.name(),
                                local_path=str(source.path or ""))

    def new_block_volume_unmapper(self, volume_name: str, pod_uid: str) -> LocalBlockVolume:
        return LocalBlockVolume(host=self.host, pod_uid=pod_uid, volume_name=volume_name,
                                local_path="")

    def construct_block_volume_spec(self, pod_uid: str, volume_name: str,
                                    volume_path: str) -> Spec:
        # The device needs no detaching: the kubelet rebuilds an empty path, so does kubevol.
        return _local_pv_spec(volume_name, "", "Block")


def _local_pv_spec(name: str, path: str, mode: str) -> Spec:
    pv = api_object("V1PersistentVolume", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"local": {"path": path}, "volumeMode": mode},
    })
    return Spec.from_persistent_volume(pv)


def _bind_source(volume_path: str, mounter: MountInterface) -> str:
    """The host path a bind mount at ``volume_path`` shows: another mount of the same
    filesystem whose root contains the bind's root, plus the rest. Empty when unknown."""
    try:
        table = mounter.table()
    except (OSError, MountError) as exc:
        log.warning("cannot read the mount table to rebuild %s: %s", volume_path, exc)
        return ""
    real = os.path.realpath(volume_path)
    bind = table.find_mount_point(real)
    if bind is None:
        return ""
    best: tuple[int, str] | None = None
    for entry in table.entries():
        if entry.id == bind.id or (entry.major, entry.minor) != (bind.major, bind.minor):
            continue
        root = entry.root.rstrip("/") or "/"
        if bind.root != root and not bind.root.startswith(root.rstrip("/") + "/"):
            continue
        if "/pods/" in entry.mount_point:  # another pod's bind of the same path
            continue
        rest = posixpath.relpath(bind.root, root)
        candidate = entry.mount_point if rest == "." else posixpath.join(entry.mount_point, rest)
        if best is None or len(root) > best[0]:
            best = (len(root), candidate)
    return best[1] if best is not None else ""


class LocalVolume(Mounter, UnmounterBase):
    """One pod's filesystem-mode local volume: a bind mount of the local path."""

    def __init__(
        self, *, host: VolumeHost, pod_uid: str, volume_name: str, local_path: str,
        read_only: bool = False, mount_options: tuple[str, ...] = (),
    ) -> None:
        self._host = host
        self._pod_uid = pod_uid
        self._volume_name = volume_name
        self._local_path = local_path
        self._read_only = read_only
        self._mount_options = mount_options

    def get_path(self) -> str:
        return self._host.get_pod_volume_dir(
            self._pod_uid, LOCAL_VOLUME_PLUGIN_NAME, self._volume_name
        )

    def get_metrics(self) -> Metrics:
        return MetricsStatFS(self.get_path()).get_metrics()

    def can_mount(self) -> None:
        """A bind mount needs nothing more."""

    def get_attributes(self) -> Attributes:
        return Attributes(read_only=self._read_only, managed=not self._read_only,
                          selinux_relabel=True)

    def set_up_at(self, directory: str, args: MounterArgs) -> None:
        """Bind-mount the local path at ``directory``. Idempotent. fsGroup is applied on
        the first mount of the path only (later pods share what the first one set)."""
        path = _validate_local_path(self._volume_name, self._local_path)
        mounter = self._host.get_mounter()
        try:
            if not mounter.is_likely_not_mount_point(directory):
                return
        except FileNotFoundError:
            pass
        st = os.stat(path)
        if stat.S_ISBLK(st.st_mode):
            raise OperationError(
                f"local volume {self._volume_name!r}: {path} is a block device; kubevol mounts "
                "filesystem-mode local volumes from directories only (use volumeMode: Block)"
            )
        refs = [r for r in mounter.get_mount_refs(path) if f"/{self._pod_uid}/" not in r]
        if args.fs_group is not None and refs and st.st_gid != args.fs_group:
            log.warning(
                "the requested fsGroup is %d, but the volume %s has GID %d; the volume may "
                "not be shareable", args.fs_group, self._volume_name, st.st_gid,
            )
        os.makedirs(directory, mode=0o750, exist_ok=True)
        options = ["bind", *(["ro"] if self._read_only else []), *self._mount_options]
        try:
            mounter.mount(path, directory, "", options)
        except MountError:
            try:
                cleanup_mount_point(directory, mounter, extensive_check=True)
            except MountError as exc:
                log.error("cannot clean %s after a failed mount: %s", directory, exc)
            raise
        if not self._read_only and not refs:
            set_volume_ownership(directory, args.fs_group, args.fs_group_change_policy)

    def tear_down_at(self, directory: str) -> None:
        """Unmount the bind and remove the empty directory. Idempotent; a failed unmount
        leaves the data where it is."""
        cleanup_mount_point(directory, self._host.get_mounter(), extensive_check=True)


class LocalBlockVolume(CustomBlockVolumeMapper, CustomBlockVolumeUnmapper):
    """A block-mode local volume: the local path is the device the node maps for the pod."""

    def __init__(self, *, host: VolumeHost, pod_uid: str, volume_name: str,
                 local_path: str) -> None:
        self._host = host
        self._pod_uid = pod_uid
        self._volume_name = volume_name
        self._local_path = local_path

    def get_global_map_path(self, spec: Spec) -> str:
        return os.path.join(
            self._host.get_volume_device_plugin_dir(LOCAL_VOLUME_PLUGIN_NAME), self._volume_name
        )

    def get_pod_device_map_path(self) -> tuple[str, str]:
        return (
            self._host.get_pod_volume_device_dir(self._pod_uid, LOCAL_VOLUME_PLUGIN_NAME),
            self._volume_name,
        )

    def set_up_device(self) -> str:
        """Nothing to stage: the device is local."""
        return ""

    def map_pod_device(self) -> str:
        """The local path, which must be a block device."""
        path = _validate_local_path(self._volume_name, self._local_path)
        if not stat.S_ISBLK(os.stat(path).st_mode):
            raise OperationError(
                f"local volume {self._volume_name!r} is in Block mode but {path} is not a "
                "block device"
            )
        return path

    def get_staging_path(self) -> str:
        return ""

    def tear_down_device(self, map_path: str, device_path: str) -> None:
        """Nothing was staged."""

    def unmap_pod_device(self) -> None:
        """Nothing beyond the node's own unmapping."""
