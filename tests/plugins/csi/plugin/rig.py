"""Helpers of the CSI plugin tests: the Rig (kubelet root, real driver, registry, plugin),
Spec and pod builders, loop devices."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.node.host import NodeVolumeHost
from kubevol.plugins.csi import CSIPlugin
from kubevol.plugins.csi.registration import DriverRegistry
from kubevol.spec import Spec
from kubevol.testing.csi_driver import FakeCSIDriver
from kubevol.testing.mount_rig import unmount_all_under
from tests.plugins.csi.plugin.csiplugin_driver import (
    DRIVER_NAME,
    dir_driver,
    serve_dir_driver,
)

NODE_NAME = "node-1"
#: The CSI node id the hostpath driver reports (not the Kubernetes node name).
HOSTPATH_NODE_ID = "hp-node-9"
POD_UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"


class Rig:
    """One test's CSI world: kubelet root, driver, registry, plugin."""

    def __init__(
        self, base: Path, driver: FakeCSIDriver, plugin: CSIPlugin, host: NodeVolumeHost,
        handle: Any,
    ) -> None:
        self.base = base
        self.root = base / "kubelet"
        self.driver = driver
        self.plugin = plugin
        self.host = host
        self.handle = handle

    @property
    def registry(self) -> DriverRegistry:
        """The plugin's driver registry."""
        return self.plugin.registry


def pv_spec(
    name: str,
    handle: str,
    *,
    driver: str = DRIVER_NAME,
    fs_type: str = "ext4",
    access_modes: tuple[str, ...] = ("ReadWriteOnce",),
    block: bool = False,
    read_only: bool = False,
    attributes: dict[str, str] | None = None,
    extra_csi: dict[str, Any] | None = None,
) -> Spec:
    """A Spec for a CSI PersistentVolume."""
    csi: dict[str, Any] = {"driver": driver, "volumeHandle": handle}
    if fs_type:
        csi["fsType"] = fs_type
    if attributes:
        csi["volumeAttributes"] = attributes
    csi.update(extra_csi or {})
    return Spec.from_manifest(
        {
            "kind": "PersistentVolume",
            "apiVersion": "v1",
            "metadata": {"name": name},
            "spec": {
                "csi": csi,
                "accessModes": list(access_modes),
                "volumeMode": "Block" if block else "Filesystem",
                "capacity": {"storage": "1Gi"},
            },
        },
        read_only=read_only,
    )


def inline_spec(name: str, *, driver: str = DRIVER_NAME, attributes: dict[str, str] | None = None,
                fs_type: str = "") -> Spec:
    """A Spec for an inline (ephemeral) CSI pod volume."""
    csi: dict[str, Any] = {"driver": driver}
    if attributes:
        csi["volumeAttributes"] = attributes
    if fs_type:
        csi["fsType"] = fs_type
    return Spec.from_manifest({"name": name, "csi": csi})


def make_pod(uid: str = POD_UID, name: str = "web-0", namespace: str = "shop") -> Any:
    """A V1Pod with a UID, name, namespace and service account."""
    from kubernetes import client as k8s

    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, uid=uid),
        spec=k8s.V1PodSpec(containers=[], service_account_name="builder"),
    )




class LoopDevices:
    """Loop devices over sparse image files; detached by :meth:`cleanup`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.devices: list[str] = []

    def make(self, size_mib: int = 8, *, ext4: bool = False) -> str:
        """A fresh loop device, unformatted unless ``ext4``."""
        img = self.base / f"loop{len(self.devices)}.img"
        with open(img, "wb") as f:
            f.truncate(size_mib << 20)
        if ext4:
            subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True)
        out = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True,
                             text=True, check=True)
        dev = out.stdout.strip()
        self.devices.append(dev)
        return dev

    def cleanup(self) -> None:
        """Detach every device made."""
        for dev in self.devices:
            subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)
        self.devices.clear()


#: ``make_rig(node_caps=..., controller_caps=..., register=True, **plugin_kwargs) -> Rig``.
RigFactory = Callable[..., Rig]


@attrs.define
class HostPathRig:
    """The bundled hostpath driver served for real, with the plugin registered against it."""

    base: Path
    root: Path
    running: RunningDriver
    client: CSIClient
    plugin: CSIPlugin
    host: NodeVolumeHost


HostPathRigFactory = Callable[..., HostPathRig]


class RigMaker:
    """Makes Rigs under ``base`` (a test's tmp_path) and undoes them all in :meth:`close`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.made: list[Rig] = []

    def make(
        self,
        *,
        node_caps: set[t.NodeCapability] | None = None,
        controller_caps: set[t.ControllerCapability] | None = None,
        register: bool = True,
        max_volumes: int = 0,
        shared_device: str = "",
        host_kwargs: dict[str, Any] | None = None,
        **plugin_kwargs: Any,
    ) -> Rig:
        """A driver with these capabilities, served and (unless told not to) registered;
        ``plugin_kwargs`` go to :class:`CSIPlugin`, ``host_kwargs`` to the host."""
        base = self.base / f"rig{len(self.made)}"
        (base / "kubelet").mkdir(parents=True)
        (base / "state").mkdir()
        driver = dir_driver(
            base / "state", node_caps=node_caps, controller_caps=controller_caps,
            max_volumes=max_volumes, shared_device=shared_device,
        )
        handle = serve_dir_driver(driver, base / "csi.sock")
        registry = DriverRegistry(node_info_timeout=10, client_timeout=20)
        plugin = CSIPlugin(registry=registry, timeout=20, attach_timeout=5, **plugin_kwargs)
        host = NodeVolumeHost(root_dir=str(base / "kubelet"), node_name=NODE_NAME,
                              **(host_kwargs or {}))
        plugin.init(host)
        rig = Rig(base, driver, plugin, host, handle)
        self.made.append(rig)
        if register:
            registry.register_driver(DRIVER_NAME, handle.address, ["1.0.0"])
        return rig

    def close(self) -> None:
        """Unmount what is left, close the registries, stop the drivers."""
        for rig in reversed(self.made):
            unmount_all_under(rig.base)
            rig.registry.close()
            rig.handle.stop(grace=1)
        self.made.clear()
