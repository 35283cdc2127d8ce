"""Covers kubevol.node.owners.

The ownership model: which pods, volumes and orphan device mounts kubevol may destroy,
and the reason it gives either way."""

from __future__ import annotations

import pytest

from kubevol.errors import InvalidPathSegmentError
from kubevol.node.owners import Ownership, csi_driver_of

PLUGINS = "/r/plugins"
CSI_MOUNT = f"{PLUGINS}/kubernetes.io/csi/hp.example.com/abc/globalmount"


def test_recorded_and_named_gone_pods_are_owned_with_their_reason() -> None:
    """A recorded pod and a pod named gone may be torn down, each saying why; any other
    pod may not, and the refusal names the way to give it (--pod-gone)."""
    records = {"r1"}
    owners = Ownership(recorded=lambda: records, gone=["g1"])
    assert owners.pod("r1").allowed and "pod record" in owners.pod("r1").reason
    assert owners.pod("g1").allowed and "named gone" in owners.pod("g1").reason
    other = owners.pod("x1")
    assert not other.allowed and "--pod-gone" in other.reason
    assert owners("r1") and not owners("x1")
    records.add("x1")  # records are read on every question
    assert owners("x1")


def test_sole_agent_owns_every_pod() -> None:
    """The library default (an agent alone on its root) owns every pod."""
    assert Ownership.sole_agent().pod("anything").allowed
    assert not Ownership().pod("anything").allowed


def test_gone_uids_are_validated() -> None:
    """A UID that would escape the root is refused when named."""
    with pytest.raises(InvalidPathSegmentError):
        Ownership(gone=["../x"])


def test_volume_of_an_unknown_plugin_is_left_alone_even_for_an_owned_pod() -> None:
    """Nothing knows how to undo a volume of a plugin kubevol does not have."""
    owners = Ownership(gone=["g1"])
    verdict = owners.volume("g1", "vendor.example/magic", plugin_known=False)
    assert not verdict.allowed and "unknown plugin 'vendor.example/magic'" in verdict.reason
    assert owners.volume("g1", "kubernetes.io/empty-dir", plugin_known=True).allowed
    assert not owners.volume("x1", "kubernetes.io/empty-dir", plugin_known=True).allowed


def test_orphan_device_mount_needs_its_driver_and_no_foreign_pod() -> None:
    """An orphan device mount is unmounted only for a plugin and CSI driver kubevol has,
    and only when no pod of another owner is on the root (it may be about to use it)."""
    owners = Ownership(recorded=lambda: {"r1"}, drivers=lambda: {"hp.example.com"})
    ok = owners.device_mount(CSI_MOUNT, "kubernetes.io/csi", plugins_dir=PLUGINS,
                             pods_on_disk={"r1"})
    assert ok.allowed and "every pod on this root is kubevol's" in ok.reason
    foreign = owners.device_mount(CSI_MOUNT, "kubernetes.io/csi", plugins_dir=PLUGINS,
                                  pods_on_disk={"r1", "kubelet-pod"})
    assert not foreign.allowed and "kubelet-pod" in foreign.reason
    other_driver = owners.device_mount(
        f"{PLUGINS}/kubernetes.io/csi/ebs.csi.aws.com/abc/globalmount", "kubernetes.io/csi",
        plugins_dir=PLUGINS, pods_on_disk=(),
    )
    assert not other_driver.allowed and "ebs.csi.aws.com is not kubevol's" in other_driver.reason
    unknown = owners.device_mount(f"{PLUGINS}/vendor/x", "", plugins_dir=PLUGINS,
                                  pods_on_disk=())
    assert not unknown.allowed and "unknown plugin" in unknown.reason


def test_csi_driver_of_reads_the_driver_segment() -> None:
    """The driver is the segment after plugins/kubernetes.io/csi/."""
    assert csi_driver_of(CSI_MOUNT, PLUGINS) == "hp.example.com"
    assert csi_driver_of(f"{PLUGINS}/kubernetes.io/csi", PLUGINS) == ""
    assert csi_driver_of("/elsewhere/kubernetes.io/csi/d/x", PLUGINS) == ""
