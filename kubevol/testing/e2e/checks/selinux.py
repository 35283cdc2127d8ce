"""``selinuxmount``: with SELinux mounts enabled (the CSIDriver's ``seLinuxMount: true``)
the kubelet mounts a pod's volume with the pod's SELinux label, passing
``context="<label>"`` as one more mount flag to NodeStageVolume and NodePublishVolume; the
driver mounts with it, so that the kernel labels every file at once instead of the runtime
relabelling them one by one.

What is really checked: the driver accepts the flag in both calls and mounts the volume
(a label holds a comma, ``s0:c0,c1``, inside the quotes: a driver that splits or checks
mount flags naively refuses it); on a host with SELinux (``/sys/fs/selinux``) the mount also
shows the ``context=`` option. A kernel without SELinux ignores the option, so there the
check cannot tell a driver that applied it from one that dropped it, and says so in its
``mirrors`` line only: it still passes.

kubevol's node volume manager does not derive a pod's label (``seLinuxOptions``) yet, so
this check drives the ``kubernetes.io/csi`` plugin of the box directly (mount_device, then
set_up, with the label the kubelet would compute), and tears down the same way.
"""

from __future__ import annotations

import contextlib
import os

from kubevol.csi import types as t
from kubevol.errors import KubevolError
from kubevol.node.manifests import manifests_from_objects, pod_object
from kubevol.plugins.csi import CSI_PLUGIN_NAME, CSIPlugin
from kubevol.spec import Spec
from kubevol.testing.e2e.checks.core import Check, check, expect_mounted
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped
from kubevol.testing.e2e.session import Session, mount_options_at
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions

#: The label of a pod whose seLinuxOptions level is ``s0:c0,c1`` (container_file_t).
LABEL = "system_u:object_r:container_file_t:s0:c0,c1"
SELINUX_FS = "/sys/fs/selinux"


def context_mount_option(s: Session) -> None:
    if s.csidriver_spec("seLinuxMount") is not True:
        raise CheckSkipped(
            "the driver's CSIDriver object does not set seLinuxMount: true"
            + (" (give it with --csidriver FILE)" if s.config.csidriver is None else "")
            + ": the kubelet passes it no context= mount option")
    if t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME in s.info.controller:
        raise CheckSkipped("the driver needs ControllerPublishVolume, which this check (it "
                           "drives the CSI plugin directly) does not make")
    vol = s.create_volume(access_mode="ReadWriteOncePod")
    pv, pvc = s.claim_objects(vol)[-2:]
    uid, pod = s.pod([vol])
    runtime = s.box.runtime
    runtime.learn(manifests_from_objects([s.csidriver_object(), pv, pvc],
                                         "the SELinux mount check's objects"))
    plugin = runtime.mgr.find_plugin_by_name(CSI_PLUGIN_NAME)
    if not isinstance(plugin, CSIPlugin):
        raise RuntimeError(f"{CSI_PLUGIN_NAME} is not kubevol's CSI plugin")
    spec = Spec.from_manifest(dict(pv))
    staged = t.NodeCapability.STAGE_UNSTAGE_VOLUME in s.info.node
    device_mounter = plugin.new_device_mounter()
    staging = device_mounter.get_device_mount_path(spec) if staged else ""
    why = ("selinuxmount.go 'Pod with RWOP volume and the default policy should mount volumes "
           "with SELinux mount option': "
           f"the kubelet passes context=\"{LABEL}\" in VolumeCapability.mount.mount_flags of "
           "NodeStageVolume and NodePublishVolume; the driver mounts with it")
    mark = s.relay.mark()
    target = s.box.volume_path(uid, vol.name)
    try:
        try:
            if staged:
                device_mounter.mount_device(spec, "", staging,
                                            DeviceMounterArgs(selinux_label=LABEL))
            mounter = plugin.new_mounter(spec, pod_object(pod),
                                         VolumeOptions(pv_name=vol.name))
            mounter.set_up(MounterArgs(selinux_label=LABEL))
        except KubevolError as exc:
            raise CheckFailed(
                f"the driver refused the volume with the kubelet's SELinux mount option: {exc}",
                expected=f'OK, the volume mounted with context="{LABEL}"', why=why) from exc
        for rpc in ("NodeStageVolume", "NodePublishVolume") if staged else (
                "NodePublishVolume",):
            sent = s.calls(rpc, mark)
            if not sent or "context=" not in sent[-1]:
                raise CheckFailed(f"the node side sent {rpc} without the context= mount flag",
                                  expected=f'mount_flags context="{LABEL}"', why=why)
        expect_mounted(target, "NodePublishVolume")
        if os.path.isdir(SELINUX_FS):
            options = mount_options_at(target) or set()
            if not any(o.startswith("context=") for o in options):
                raise CheckFailed(
                    f"the pod's mount at {target} has no context= option "
                    f"({','.join(sorted(options))}) on a host with SELinux",
                    expected=f'context="{LABEL}" among the mount options', why=why)
    finally:
        with contextlib.suppress(KubevolError, OSError):
            plugin.new_unmounter(vol.name, uid).tear_down_at(target)
        if staged:
            with contextlib.suppress(KubevolError, OSError):
                plugin.new_device_unmounter().unmount_device(staging)


SELINUX_CHECKS: tuple[Check, ...] = (
    check("selinuxmount/context-mount-option",
          "selinuxmount.go: Pod with RWOP volume and the default policy should mount volumes "
          "with SELinux mount option (the option in the mount table checked only on a host "
          "with SELinux)",
          context_mount_option),
)
