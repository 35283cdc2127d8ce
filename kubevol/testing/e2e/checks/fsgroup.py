"""``fsgroupchangepolicy``: the ownership and permissions a pod's ``fsGroup`` gives its
volume, per ``fsGroupChangePolicy`` (``Always``: every file, every time; ``OnRootMismatch``:
only when the volume root's group or bits do not match already), as the kubelet applies them
after NodePublishVolume when the CSIDriver's ``fsGroupPolicy`` says so; and, for a driver
advertising VOLUME_MOUNT_GROUP, the fsGroup the kubelet hands the driver instead.

The "pod" writes as root, as a container whose files get the volume's setgid group.
"""

from __future__ import annotations

import os
import stat

from kubevol.csi import types as t
from kubevol.testing.e2e.checks.core import Check, check, expect_mounted, payload, write_file
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped
from kubevol.testing.e2e.session import Session, Volume, mount_options_at

#: The first pod's fsGroup, the group the first pod gives its files, another pod's fsGroup.
FIRST_GROUP, CHGRP_GROUP, OTHER_GROUP = 1000, 2000, 3000
FILES = ("file1", os.path.join("subdir", "file2"))


def _need_kubelet_ownership(s: Session) -> None:
    if t.NodeCapability.VOLUME_MOUNT_GROUP in s.info.node:
        raise CheckSkipped("the driver advertises VOLUME_MOUNT_GROUP: the kubelet hands it "
                           "the fsGroup and changes no ownership itself (see "
                           "fsgroupchangepolicy/volume-mount-group)")
    policy = s.csidriver_spec("fsGroupPolicy")
    if policy != "File":
        raise CheckSkipped(f"the driver's CSIDriver fsGroupPolicy is {policy}: the kubelet "
                           "applies fsGroup to these volumes (no fsType) only with File")


def _run(s: Session, vol: Volume, group: int, policy: str, doing: str) -> str:
    return s.run_pod([vol], doing, objects=[s.csidriver_object()],
                     security_context={"fsGroup": group, "fsGroupChangePolicy": policy})


def _groups(root: str) -> dict[str, int]:
    return {name: os.lstat(os.path.join(root, name)).st_gid for name in FILES}


def _expect_groups(root: str, want: int, what: str, why: str) -> None:
    found = _groups(root)
    wrong = {name: gid for name, gid in found.items() if gid != want}
    if wrong:
        raise CheckFailed(
            f"{what}: " + ", ".join(f"{n} has group {g}" for n, g in sorted(wrong.items())),
            expected=f"group {want} on every file", why=why)


def _expect_root_owned(root: str, group: int, why: str) -> None:
    st = os.stat(root)
    if st.st_gid != group or st.st_mode & 0o2070 != 0o2070:
        raise CheckFailed(
            f"the volume root {root} has group {st.st_gid} and mode "
            f"{stat.filemode(st.st_mode)} in a pod whose fsGroup is {group}",
            expected=f"group {group}, group rwx and setgid",
            why=why + " (pkg/volume/volume_linux.go SetVolumeOwnership)")


def _fsgroup(s: Session, policy: str, *, chgrp: bool, second: int) -> None:
    _need_kubelet_ownership(s)
    vol = s.create_volume()
    why = (f"fsgroupchangepolicy.go ({policy}): the kubelet gives the pod's fsGroup to the "
           "volume after NodePublishVolume, per fsGroupChangePolicy")
    first = _run(s, vol, FIRST_GROUP, policy, f"starting a pod with fsGroup {FIRST_GROUP}")
    root = s.box.volume_path(first, vol.name)
    expect_mounted(root, "NodePublishVolume")
    _expect_root_owned(root, FIRST_GROUP, why)
    os.makedirs(os.path.join(root, "subdir"), exist_ok=True)
    for name in FILES:
        write_file(os.path.join(root, name), payload(512, name), "the first pod")
    _expect_groups(root, FIRST_GROUP, "files the first pod created", why + "; new files "
                   "inherit the setgid group of the volume's directories")
    if chgrp:
        for name in FILES:
            os.chown(os.path.join(root, name), -1, CHGRP_GROUP)
    s.delete_pod(first, "deleting the first pod")
    second_uid = _run(s, vol, second, policy, f"starting a second pod with fsGroup {second}")
    root = s.box.volume_path(second_uid, vol.name)
    _expect_root_owned(root, second, why)
    skips = policy == "OnRootMismatch" and chgrp and second == FIRST_GROUP
    want = CHGRP_GROUP if skips else second
    if skips:
        why += ("; OnRootMismatch skips the walk when the root already has the pod's "
                "fsGroup, so files the first pod gave another group keep it (the driver "
                "must not change the volume's ownership at stage or publish)")
    _expect_groups(root, want, f"in the second pod (fsGroup {second}"
                   + (f", files chgrp'ed to {CHGRP_GROUP} by the first pod)" if chgrp else ")"),
                   why)


def on_root_mismatch_new_group(s: Session) -> None:
    _fsgroup(s, "OnRootMismatch", chgrp=False, second=OTHER_GROUP)


def on_root_mismatch_chgrp_other_group(s: Session) -> None:
    _fsgroup(s, "OnRootMismatch", chgrp=True, second=OTHER_GROUP)


def on_root_mismatch_chgrp_same_group(s: Session) -> None:
    _fsgroup(s, "OnRootMismatch", chgrp=True, second=FIRST_GROUP)


def always_new_group(s: Session) -> None:
    _fsgroup(s, "Always", chgrp=False, second=OTHER_GROUP)


def always_chgrp_same_group(s: Session) -> None:
    _fsgroup(s, "Always", chgrp=True, second=FIRST_GROUP)


def always_chgrp_other_group(s: Session) -> None:
    _fsgroup(s, "Always", chgrp=True, second=OTHER_GROUP)


def volume_mount_group(s: Session) -> None:
    s.need_node(t.NodeCapability.VOLUME_MOUNT_GROUP,
                "only then does the kubelet hand the fsGroup to the driver")
    if s.csidriver_spec("fsGroupPolicy") == "None":
        raise CheckSkipped("the driver's CSIDriver fsGroupPolicy is None: no fsGroup is "
                           "passed")
    vol = s.create_volume()
    mark = s.relay.mark()
    uid = _run(s, vol, FIRST_GROUP, "Always", f"starting a pod with fsGroup {FIRST_GROUP}")
    why = ("fsgroupchangepolicy.go with a driver that has VOLUME_MOUNT_GROUP (csi_mock_volume"
           ".go 'Delegate FSGroup to CSI driver'): the kubelet passes the fsGroup as "
           "volume_mount_group and the driver makes the volume usable by that group")
    sent = s.calls("NodePublishVolume", mark) + s.calls("NodeStageVolume", mark)
    wanted = f'volume_mount_group: "{FIRST_GROUP}"'
    if not sent or not all(wanted in c for c in sent):
        raise CheckFailed("the node side did not pass the fsGroup to the driver",
                          expected=wanted, why=why)
    if s.config.mock:
        return
    root = s.box.volume_path(uid, vol.name)
    expect_mounted(root, "NodePublishVolume")
    st = os.stat(root)
    options = mount_options_at(root) or set()
    if st.st_gid != FIRST_GROUP and not any(o in options for o in (
            f"gid={FIRST_GROUP}", f"group={FIRST_GROUP}")):
        raise CheckFailed(
            f"NodePublishVolume got volume_mount_group {FIRST_GROUP} but the volume root has "
            f"group {st.st_gid} and its mount no gid= option ({','.join(sorted(options))})",
            expected=f"the volume usable by group {FIRST_GROUP}",
            why=why + "; CSI spec VolumeCapability.MountVolume.volume_mount_group")


FSGROUP_CHECKS: tuple[Check, ...] = (
    check("fsgroupchangepolicy/on-root-mismatch-new-fsgroup",
          "fsgroupchangepolicy.go: (OnRootMismatch)[LinuxOnly], pod created with an initial "
          "fsgroup, new pod fsgroup applied to volume contents", on_root_mismatch_new_group),
    check("fsgroupchangepolicy/on-root-mismatch-chgrp-new-fsgroup",
          "fsgroupchangepolicy.go: (OnRootMismatch)[LinuxOnly], pod created with an initial "
          "fsgroup, volume contents ownership changed via chgrp in first pod, new pod with "
          "different fsgroup applied to the volume contents",
          on_root_mismatch_chgrp_other_group),
    check("fsgroupchangepolicy/on-root-mismatch-chgrp-same-fsgroup",
          "fsgroupchangepolicy.go: (OnRootMismatch)[LinuxOnly], pod created with an initial "
          "fsgroup, volume contents ownership changed via chgrp in first pod, new pod with "
          "same fsgroup skips ownership changes to the volume contents",
          on_root_mismatch_chgrp_same_group),
    check("fsgroupchangepolicy/always-new-fsgroup",
          "fsgroupchangepolicy.go: (Always)[LinuxOnly], pod created with an initial fsgroup, "
          "new pod fsgroup applied to volume contents", always_new_group),
    check("fsgroupchangepolicy/always-chgrp-same-fsgroup",
          "fsgroupchangepolicy.go: (Always)[LinuxOnly], pod created with an initial fsgroup, "
          "volume contents ownership changed via chgrp in first pod, new pod with same "
          "fsgroup applied to the volume contents", always_chgrp_same_group),
    check("fsgroupchangepolicy/always-chgrp-new-fsgroup",
          "fsgroupchangepolicy.go: (Always)[LinuxOnly], pod created with an initial fsgroup, "
          "volume contents ownership changed via chgrp in first pod, new pod with different "
          "fsgroup applied to the volume contents", always_chgrp_other_group),
    check("fsgroupchangepolicy/volume-mount-group",
          "../csi_mock/csi_fsgroup_mount.go: Delegate FSGroup to CSI driver "
          "[LinuxOnly] should pass FSGroup to CSI driver if it is set in pod and driver "
          "supports VOLUME_MOUNT_GROUP", volume_mount_group, data=False),
)
