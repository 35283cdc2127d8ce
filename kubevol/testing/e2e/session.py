"""What one check works with: the driver (its client through the recording relay, what it
advertises), the kubelet in the box, and the volumes and pods the check makes, all cleaned
up when it ends.

Manifests are written as the API server would hand them to the kubelet: a PersistentVolume
per provisioned volume (what the external-provisioner would create from the CreateVolume
answer), a bound claim, and pods that use the claim.
"""

from __future__ import annotations

import base64
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence

import attrs

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.e2e import RecordingRelay
from kubevol.csidriver.sanity.inputs import Secrets
from kubevol.errors import KubevolError, UntrustedDataError
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.plugins.csi.driverinfo import CSIDriverInfoError, check_csidriver
from kubevol.testing.e2e.box import KubeletBox, Manifest
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped
from kubevol.util import safeyaml

MiB = 1 << 20
#: The logger of the node side's operations (what it warns of, a check reads).
NODE_LOGGER = "kubevol.node"
NAMESPACE = "e2e"
#: The secret the PersistentVolumes' node secret references name.
SECRET_NAME = "e2e-node-secrets"
#: The CSIDriver spec the checks that need one use when the driver's own was not given
#: (``--csidriver``): what the upstream hostpath driver's deployment installs, less the
#: ephemeral lifecycle mode (a driver makes inline volumes only when it says so).
DEFAULT_CSIDRIVER_SPEC: Mapping[str, object] = {
    "podInfoOnMount": False, "fsGroupPolicy": "File",
    "volumeLifecycleModes": ["Persistent"],
}
#: PV secret references and the RPC whose secrets they carry (csi-sanity's file sections).
SECRET_REFS = {
    "nodeStageSecretRef": "NodeStageVolume",
    "nodePublishSecretRef": "NodePublishVolume",
    "nodeExpandSecretRef": "NodeExpandVolume",
}


@attrs.frozen(kw_only=True)
class E2EConfig:
    """How to run the suite: the driver's ``endpoint``; the size, CreateVolume
    ``parameters`` and ``secrets`` of test volumes (csi-sanity's ``--csi.testvolumesize``,
    ``--csi.testvolumeparameters``, ``--csi.secrets``); ``mount_options`` for the mount
    options check (empty: skipped); ``timeout`` per node-side sync (seconds);
    ``work_dir`` for the kubelet root and the relay socket (default: a temporary directory);
    ``select``, a ``-k`` expression over check names; ``csidriver``, the driver's own
    ``CSIDriver`` object (what its deployment installs: ``volumeLifecycleModes``,
    ``fsGroupPolicy``, ``seLinuxMount``...; None: the checks that need one use
    :data:`DEFAULT_CSIDRIVER_SPEC`, and the inline ephemeral checks are skipped);
    ``ephemeral_attributes``, the ``volumeAttributes`` of inline ephemeral volumes;
    ``mock`` for a driver that mounts nothing and keeps no data (csi-test's mock, kubevol's):
    only the checks of what the kubelet sends and the driver answers run."""

    endpoint: str
    volume_size: int = 64 * MiB
    parameters: Mapping[str, str] = attrs.field(factory=dict)
    secrets: Secrets = attrs.field(factory=Secrets)
    mount_options: tuple[str, ...] = ("nodev", "noexec")
    timeout: float = 60.0
    work_dir: str = ""
    select: str = ""
    node_name: str = "e2e-node"
    csidriver: Mapping[str, object] | None = None
    ephemeral_attributes: Mapping[str, str] = attrs.field(factory=dict)
    mock: bool = False


def load_csidriver(path: str) -> dict[str, object]:
    """The driver's CSIDriver object from a YAML file (``--csidriver``), with the API
    server's defaults applied. Raises ValueError naming what is wrong."""
    try:
        doc = safeyaml.load(safeyaml.read_manifest(path), path)
    except (OSError, UntrustedDataError) as exc:
        raise ValueError(f"cannot read the CSIDriver object {path!r}: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: a CSIDriver object must be a mapping")
    try:
        return dict(check_csidriver(doc))
    except CSIDriverInfoError as exc:
        raise ValueError(f"{path}: {exc}") from exc


@attrs.frozen(kw_only=True)
class DriverInfo:
    """What the driver advertises."""

    name: str
    plugin: t.PluginCapabilities
    controller: frozenset[t.ControllerCapability]
    node: frozenset[t.NodeCapability]

    @classmethod
    def read(cls, client: CSIClient) -> DriverInfo:
        """Ask the driver; KubevolError when it does not answer."""
        return cls(
            name=client.get_plugin_info().name,
            plugin=client.get_plugin_capabilities(),
            controller=client.controller_get_capabilities(),
            node=client.node_get_capabilities(),
        )


@attrs.frozen(kw_only=True)
class Volume:
    """A provisioned volume and the PersistentVolume made for it."""

    name: str
    handle: str
    capacity: int
    block: bool
    context: Mapping[str, str]
    #: The claim's access mode (``ReadWriteOnce`` or ``ReadWriteOncePod``).
    access_mode: str = "ReadWriteOnce"
    #: Where CreateVolume said the volume is accessible.
    topology: tuple[t.Topology, ...] = ()


#: Restarts the driver and returns once it serves again (``--driver-command``).
RestartDriver = Callable[[], None]


class _Warnings(logging.Handler):
    """Keeps the node side's warnings that say it cleaned up after the driver."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.left_mounted: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("tear-down left "):
            self.left_mounted.append(message)


class Session:
    """One check's driver, kubelet and resources. Close it to tear everything down."""

    def __init__(self, config: E2EConfig, relay: RecordingRelay, info: DriverInfo,
                 root: str, restart: RestartDriver | None) -> None:
        self.config = config
        self.relay = relay
        self.info = info
        self.restart_driver = restart
        self.client = CSIClient(relay.endpoint, timeout=config.timeout)
        self.volumes: list[Volume] = []
        self._names = 0
        self._warnings = _Warnings()
        logging.getLogger(NODE_LOGGER).addHandler(self._warnings)
        self.box = KubeletBox(root, driver_name=info.name, endpoint=relay.endpoint,
                              node_name=config.node_name, timeout=config.timeout)
        if config.csidriver is not None:
            # The driver's own object says how the kubelet treats every volume of it.
            self.box.add_api_objects([self.csidriver_object()])
        self._secrets_served = False

    def close(self) -> None:
        """Tear down the pods (started again if killed), then delete the volumes. Raises
        CheckFailed when the node side cannot tear down or DeleteVolume fails."""
        try:
            self.box.close()
            self.expect_targets_unmounted()
            left = mounts_left(self.box.root)
            if left:
                raise CheckFailed(
                    f"{len(left)} mounts left under the kubelet root after every pod was "
                    f"deleted, e.g. {left[0]}",
                    expected="NodeUnpublishVolume and NodeUnstageVolume undo every mount "
                             "they (or NodeStage/NodePublish) made",
                    why="CSI spec: after NodeUnpublishVolume the target is no longer mounted;"
                        " after NodeUnstageVolume the staging path is not either",
                )
        finally:
            try:
                for volume in self.volumes:
                    self.client.delete_volume(
                        volume.handle, secrets=self.config.secrets.for_rpc("DeleteVolume")
                    )
            except KubevolError as exc:
                raise CheckFailed(
                    f"DeleteVolume failed after the check: {exc}",
                    expected="OK once no node uses the volume",
                    why="the external-provisioner deletes a released volume; CSI spec "
                        "DeleteVolume",
                ) from exc
            finally:
                self.client.close()
                logging.getLogger(NODE_LOGGER).removeHandler(self._warnings)

    def expect_targets_unmounted(self) -> None:
        """CheckFailed when the node side found a target still mounted after the driver's
        NodeUnpublishVolume answered OK (it unmounts it and says so; a kubelet does not, and
        the pod stays Terminating)."""
        if self._warnings.left_mounted:
            raise CheckFailed(
                f"NodeUnpublishVolume answered OK but left the target mounted (the node side "
                f"said: {self._warnings.left_mounted[0]})",
                expected="the target unmounted and removed",
                why="CSI spec NodeUnpublishVolume: the SP MUST undo the work NodePublish did "
                    "and delete target_path; the kubelet refuses to remove a mounted target",
            )

    # -- what the driver can do ----------------------------------------------------------------

    def need_node(self, cap: t.NodeCapability, for_what: str) -> None:
        """CheckSkipped unless the driver advertises node capability ``cap``."""
        if cap not in self.info.node:
            raise CheckSkipped(f"the driver does not advertise node {cap.name} ({for_what})")

    def unique(self, prefix: str) -> str:
        """A fresh name for a PV, pod or claim."""
        self._names += 1
        return f"{prefix}-{self._names}-{uuid.uuid4().hex[:6]}"

    # -- provisioning ----------------------------------------------------------------------------

    def create_volume(self, *, block: bool = False, size: int = 0,
                      access_mode: str = "ReadWriteOnce",
                      topology: t.TopologyRequirement | None = None) -> Volume:
        """CreateVolume as the external-provisioner sends it for a claim of ``access_mode``
        (``ReadWriteOncePod`` is SINGLE_NODE_SINGLE_WRITER when the controller advertises
        SINGLE_NODE_MULTI_WRITER), with ``topology`` when given. CheckSkipped when the driver
        cannot provision (no CREATE_DELETE_VOLUME) or refuses a block volume; CheckFailed
        for any other refusal."""
        if t.ControllerCapability.CREATE_DELETE_VOLUME not in self.info.controller:
            raise CheckSkipped("the driver does not advertise CREATE_DELETE_VOLUME: the suite "
                               "provisions its volumes")
        name = self.unique("pv-e2e")
        mode = t.AccessMode.SINGLE_NODE_WRITER
        if access_mode == "ReadWriteOncePod" and (
                t.ControllerCapability.SINGLE_NODE_MULTI_WRITER in self.info.controller):
            mode = t.AccessMode.SINGLE_NODE_SINGLE_WRITER
        cap = t.VolumeCapability.block(mode) if block else t.VolumeCapability.mount(mode)
        size = size or self.config.volume_size
        try:
            created = self.client.create_volume(
                name, [cap], capacity_range=t.CapacityRange(required_bytes=size),
                parameters=self.config.parameters,
                secrets=self.config.secrets.for_rpc("CreateVolume"),
                accessibility_requirements=topology,
            )
        except KubevolError as exc:
            if block:
                raise CheckSkipped(f"the driver refused a block volume ({exc})") from exc
            raise CheckFailed(
                f"CreateVolume of {size} bytes failed: {exc}",
                expected="a volume (give --csi.testvolumesize a size the driver can make)",
                why="every check starts from a provisioned volume",
            ) from exc
        volume = Volume(name=name, handle=created.volume_id,
                        capacity=created.capacity_bytes or size, block=block,
                        context=dict(created.volume_context), access_mode=access_mode,
                        topology=created.accessible_topology)
        self.volumes.append(volume)
        return volume

    def claim_objects(self, volume: Volume, *, capacity: int = 0,
                      mount_options: Sequence[str] = ()) -> list[Manifest]:
        """The PersistentVolume, its bound claim (named like the volume) and, when secrets
        were given, the Secret the PV's node secret references name."""
        csi: dict[str, object] = {
            "driver": self.info.name, "volumeHandle": volume.handle,
            "volumeAttributes": dict(volume.context),
        }
        objects: list[Manifest] = []
        secrets = {ref: self.config.secrets.for_rpc(rpc) for ref, rpc in SECRET_REFS.items()}
        for ref, values in secrets.items():
            if values:
                csi[ref] = {"name": f"{SECRET_NAME}-{ref.lower()}", "namespace": NAMESPACE}
                objects.append({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": f"{SECRET_NAME}-{ref.lower()}",
                                 "namespace": NAMESPACE},
                    "data": {k: base64.b64encode(v.encode()).decode()
                             for k, v in values.items()},
                })
        if objects and not self._secrets_served:
            self.box.add_api_objects(objects)
            self._secrets_served = True
        mode = "Block" if volume.block else "Filesystem"
        pv_spec: dict[str, object] = {
            "capacity": {"storage": str(capacity or volume.capacity)},
            "accessModes": [volume.access_mode], "volumeMode": mode, "csi": csi,
            "persistentVolumeReclaimPolicy": "Delete",
        }
        if mount_options:
            pv_spec["mountOptions"] = list(mount_options)
        return [
            {"apiVersion": "v1", "kind": "PersistentVolume",
             "metadata": {"name": volume.name}, "spec": pv_spec},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": volume.name, "namespace": NAMESPACE},
             "spec": {"volumeName": volume.name, "accessModes": [volume.access_mode],
                      "volumeMode": mode}},
        ]

    # -- pods ------------------------------------------------------------------------------------

    def pod(self, volumes: Sequence[Volume], *, read_only: bool = False,
            mounts: Sequence[Mapping[str, object]] = (),
            pod_volumes: Sequence[Mapping[str, object]] = (),
            security_context: Mapping[str, object] | None = None) -> tuple[str, Manifest]:
        """A pod using ``volumes`` through their claims (volume ``v<i>`` each, mounted in
        container ``c`` or, block, its device); ``mounts`` are extra volumeMounts of ``c``
        (subPaths, the ``pod_volumes`` given as they are: inline or generic ephemeral
        volumes); ``security_context`` the pod's (fsGroup). Returns its UID and manifest."""
        uid = str(uuid.uuid4())
        mount_list: list[Mapping[str, object]] = []
        devices: list[Mapping[str, object]] = []
        spec_volumes: list[Mapping[str, object]] = []
        for i, volume in enumerate(volumes):
            name = f"v{i}"
            claim: dict[str, object] = {"claimName": volume.name}
            if read_only:
                claim["readOnly"] = True
            spec_volumes.append({"name": name, "persistentVolumeClaim": claim})
            if volume.block:
                devices.append({"name": name, "devicePath": f"/dev/xvd{chr(97 + i)}"})
            else:
                mount_list.append({"name": name, "mountPath": f"/mnt/{name}"})
        container: dict[str, object] = {
            "name": "c", "image": "registry.k8s.io/e2e-test-images/busybox:1.36",
            "volumeMounts": [*mount_list, *mounts],
        }
        if devices:
            container["volumeDevices"] = devices
        spec: dict[str, object] = {"containers": [container],
                                   "volumes": [*spec_volumes, *pod_volumes],
                                   "nodeName": self.config.node_name}
        if security_context:
            spec["securityContext"] = dict(security_context)
        return uid, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.unique("pod"), "namespace": NAMESPACE, "uid": uid},
            "spec": spec,
        }

    def run_pod(self, volumes: Sequence[Volume], doing: str, *, read_only: bool = False,
                mounts: Sequence[Mapping[str, object]] = (),
                mount_options: Sequence[str] = (),
                pod_volumes: Sequence[Mapping[str, object]] = (),
                security_context: Mapping[str, object] | None = None,
                objects: Sequence[Manifest] = ()) -> str:
        """Run a pod using ``volumes`` (see :meth:`pod`) with the API ``objects`` it needs
        besides their claims, and wait for its volumes; its UID."""
        uid, pod = self.pod(volumes, read_only=read_only, mounts=mounts,
                            pod_volumes=pod_volumes, security_context=security_context)
        claims = [o for v in volumes for o in self.claim_objects(
            v, mount_options=mount_options) if o.get("kind") != "Secret"]
        self.box.run_pods([*objects, *claims, pod], doing)
        return uid

    def csidriver_object(self, **spec: object) -> Manifest:
        """The driver's CSIDriver object, as the API server serves it: the one given
        (``config.csidriver``) or :data:`DEFAULT_CSIDRIVER_SPEC` with ``attachRequired``
        as the controller advertises it; ``spec`` fields override."""
        given = self.config.csidriver
        base: Mapping[str, object] = DEFAULT_CSIDRIVER_SPEC
        if given is not None:
            found = given.get("spec")
            base = found if isinstance(found, Mapping) else {}
        merged: dict[str, object] = {
            "attachRequired": t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME
            in self.info.controller,
            **base, **spec,
        }
        return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                "metadata": {"name": self.info.name}, "spec": merged}

    def csidriver_spec(self, key: str) -> object:
        """A field of the CSIDriver object the checks use (None when unset)."""
        spec = self.csidriver_object()["spec"]
        return spec.get(key) if isinstance(spec, Mapping) else None

    def delete_pod(self, uid: str, doing: str) -> None:
        """Delete the pod and wait until its volumes are torn down."""
        self.box.delete_pod(uid)
        self.box.sync(doing)

    # -- looking at the node ---------------------------------------------------------------------

    def calls(self, method: str, since: int = 0) -> list[str]:
        """The ``method`` calls since ``since`` (a relay mark), as text."""
        return [c.describe() for c in self.relay.calls_since(since, (method,))]


def mount_options_at(path: str) -> set[str] | None:
    """The per-mount and superblock options of the topmost mount at ``path`` (None when
    ``path`` is not a mount point), from ``/proc/self/mountinfo``."""
    real = os.path.realpath(path)
    found = [m for m in parse_mountinfo() if m.mount_point == real]
    if not found:
        return None
    return set(found[-1].options) | set(found[-1].super_options)


def mounts_left(root: str) -> list[str]:
    """Mount points under ``root`` (after every pod was deleted there must be none)."""
    prefix = os.path.realpath(root) + os.sep
    return [m.mount_point for m in parse_mountinfo() if m.mount_point.startswith(prefix)]


def is_mount_point(path: str) -> bool:
    """Whether something is mounted at ``path``."""
    return mount_options_at(path) is not None
