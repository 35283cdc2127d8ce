"""The CSI plugin tests' driver: :class:`~kubevol.testing.csi_driver.FakeCSIDriver` doing
real bind mounts of directories under a state directory (or of a block device named in the
volume context), configured as these tests know it; and helpers to inspect and clean up the
mounts it made.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kubevol.csi import types as t
from kubevol.csidriver.server import ServerHandle, serve_in_background
from kubevol.testing.csi_driver import FakeCSIDriver

DRIVER_NAME = "dir.csi.kubevol.io"
NODE_ID = "csi-node-7"


def dir_driver(
    state_dir: Path,
    *,
    node_caps: set[t.NodeCapability] | None = None,
    controller_caps: set[t.ControllerCapability] | None = None,
    max_volumes: int = 0,
    shared_device: str = "",
) -> FakeCSIDriver:
    """The test driver mounting for real: staging and publishing by default, no controller
    unless ``controller_caps``, attach-style publish context, no volume condition."""
    driver = FakeCSIDriver(
        name=DRIVER_NAME,
        node_id=NODE_ID,
        state_dir=state_dir,
        mounts=True,
        shared_device=shared_device,
        node_caps=(
            {t.NodeCapability.STAGE_UNSTAGE_VOLUME, t.NodeCapability.GET_VOLUME_STATS}
            if node_caps is None else node_caps
        ),
        controller_caps=controller_caps or set(),
        max_volumes_per_node=max_volumes,
        topology={"topology.kubevol.io/node": "n1"},
        publish_context=lambda volume, node: {
            "devicePath": f"/dev/fake/{volume}", "attachedTo": node,
        },
    )
    driver.condition = None
    return driver


def serve_dir_driver(driver: FakeCSIDriver, socket_path: Path) -> ServerHandle:
    """Serve ``driver`` on a unix socket (no middleware)."""
    return serve_in_background(driver.plugin(), f"unix://{socket_path}", env={})


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative, directories ending in '/', sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames:
            out.append(os.path.normpath(os.path.join(rel, name)) + "/")
        for name in filenames:
            out.append(os.path.normpath(os.path.join(rel, name)))
    return sorted(out)



def detach_loops_under(base: Path) -> list[str]:
    """Detach loop devices whose backing file lies below ``base``; returns them."""

    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
                         capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(str(base)):
            subprocess.run(["losetup", "-d", parts[0]], check=False, capture_output=True)
            found.append(f"{parts[0]} ({parts[1].strip()})")
    return found
