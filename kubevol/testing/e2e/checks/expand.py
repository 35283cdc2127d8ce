"""``volume_expand`` offline: the claim grown while no pod uses the volume (ControllerExpand
when the controller advertises EXPAND_VOLUME); the next pod sees the new size and the data,
for filesystem and block. The kubelet calls NodeExpandVolume at that mount because the
claim's status.capacity is still the old size; so does the box."""

from __future__ import annotations

import os

from kubevol.csi import types as t
from kubevol.testing.e2e.checks.core import (
    Check,
    check,
    controller_expand,
    device_size,
    expect_block_device,
    expect_mounted,
    payload,
    pread,
    pwrite,
    read_back,
    write_file,
)
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped
from kubevol.testing.e2e.session import MiB, Session

NC = t.NodeCapability


def _offline(s: Session, *, block: bool) -> None:
    s.need_node(NC.EXPAND_VOLUME, "the kubelet calls NodeExpandVolume only then")
    if not s.info.plugin.volume_expansion:
        raise CheckSkipped("the driver advertises no volume expansion (plugin capability "
                           "VolumeExpansion ONLINE or OFFLINE)")
    vol = s.create_volume(block=block)
    first = s.run_pod([vol], "starting the writer pod")
    data = payload(MiB, vol.handle)
    before = 0
    if block:
        pwrite(s.box.device_path(first, vol.name), data, 0)
    else:
        path = s.box.volume_path(first, vol.name)
        write_file(os.path.join(path, "before"), data, "the writer pod")
        st = os.statvfs(path)
        before = st.f_blocks * st.f_frsize
    s.delete_pod(first, "deleting the writer pod (the volume is now unused)")
    new = controller_expand(s, vol, vol.capacity * 2)
    uid, pod = s.pod([vol])
    pv, pvc = s.claim_objects(vol, capacity=new)[-2:]
    # As the API server serves it: the claim's status keeps the old size until the node
    # has expanded the volume (what tells the kubelet to call NodeExpandVolume).
    pvc = {**pvc, "status": {"phase": "Bound", "capacity": {"storage": str(vol.capacity)}}}
    mark = s.relay.mark()
    s.box.run_pods([pv, pvc, pod], "starting a pod on the grown claim")
    why = ("volume_expand.go 'Verify if offline PVC expansion works': the claim grown while "
           "no pod used it; the next pod sees the new size and the data")
    if not s.calls("NodeExpandVolume", mark):
        raise CheckFailed(
            "the kubelet in the box did not call NodeExpandVolume for the grown claim (a bug "
            "in kubevol's node side, not in the driver)",
            expected="NodeExpandVolume to the new size", why=why)
    if block:
        dev = s.box.device_path(uid, vol.name)
        expect_block_device(dev)
        size = device_size(dev)
        if size < new:
            raise CheckFailed(f"the pod's device has {size} bytes after expansion to {new}",
                              expected=f"{new} bytes", why=why)
        if pread(dev, len(data), 0) != data:
            raise CheckFailed("the grown device lost what was written before",
                              expected="the same bytes", why=why)
        return
    path = s.box.volume_path(uid, vol.name)
    expect_mounted(path, "NodePublishVolume")
    read_back(os.path.join(path, "before"), data, "the pod on the grown volume", why)
    st = os.statvfs(path)
    size = st.f_blocks * st.f_frsize
    if size < new and before < new:
        raise CheckFailed(
            f"the filesystem at the pod's path has {size} bytes after expansion to {new} (it "
            f"had {before})", expected="a filesystem of the new size", why=why)


def offline_filesystem(s: Session) -> None:
    _offline(s, block=False)


def offline_block(s: Session) -> None:
    _offline(s, block=True)


EXPAND_CHECKS: tuple[Check, ...] = (
    check("volume_expand/offline-filesystem",
          "volume_expand.go: Verify if offline PVC expansion works", offline_filesystem),
    check("volume_expand/offline-block",
          "volume_expand.go: Verify if offline PVC expansion works (Block)", offline_block),
)
