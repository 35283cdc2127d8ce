"""The plan of a repair: every destructive action ``reconstruct --repair`` takes (unmount,
unmap, remove a directory, clean a volume that could not be rebuilt, unmount a subPath bind
whose volume directory is gone, unstage, detach), each
with its pod, volume, plugin and the reason the ownership model allows it, and everything
found that is left alone, with why.

:func:`plan_repair` only reads: it is the ``--dry-run`` output, and the same plan is shown
before a real repair, which then runs with the same :class:`~kubevol.node.owners.Ownership`
and desired state, so it does these actions and no others. An action that the last line of
defence will refuse (a process or another mount namespace holds its path:
:mod:`kubevol.node.holders`) says so in ``refused``; the plan looks once, as the repair does.
"""

from __future__ import annotations

import os

import attrs

from kubevol import layout
from kubevol.node.holders import Holders
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.mountcheck import STILL_MOUNTED
from kubevol.node.reconstruct import FoundVolume, OrphanSubpath, Reconstruction
from kubevol.node.state import VolumeMode

#: What a planned action does.
UNMOUNT = "unmount"
UNMAP = "unmap"
REMOVE_DIR = "remove dir"
CLEAN = "clean"
UNSTAGE = "unstage"
DETACH = "detach"
REMOVE_POD_DIR = "remove pod dir"
UNMOUNT_SUBPATH = "unmount subPath bind"

#: Mount checks that mean something is mounted there (to unmount).
_MOUNTED = STILL_MOUNTED


@attrs.frozen(kw_only=True)
class PlannedAction:
    """One destructive action of a repair, or one thing it leaves alone (``action`` "")."""

    action: str
    pod_uid: str
    volume: str
    plugin: str
    path: str
    reason: str
    #: Why the action will be refused when it runs (something holds its path), or "".
    refused: str = ""

    def to_dict(self) -> dict[str, str]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class RepairPlan:
    """What a repair does, and what it leaves alone."""

    actions: tuple[PlannedAction, ...]
    left: tuple[PlannedAction, ...]
    #: Processes whose open files could not be read (not root): refusals may be missing.
    uninspected: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "actions": [a.to_dict() for a in self.actions],
            "left": [a.to_dict() for a in self.left],
            "uninspected_processes": self.uninspected,
        }


def plan_repair(
    result: Reconstruction, manager: NodeVolumeManager, holders: Holders | None = None
) -> RepairPlan:
    """The repair of ``result`` (a scan not cleaned yet) by ``manager`` (its desired state
    and ownership as they will be when it runs). Reads only. ``holders``: what holds paths
    under the pods directory (a snapshot is taken when None)."""
    plan = _Planner(manager, holders or manager.generator.holders_once().get())
    for found in result.volumes:
        plan.volume(found)
    plan.devices(result.volumes)
    for failed in result.failures:
        uid = failed.dir.pod_uid
        verdict = manager.failure_verdict(failed)
        where = {"pod_uid": uid, "volume": failed.dir.spec_name, "plugin": failed.dir.plugin_name,
                     "path": failed.dir.path}
        if not verdict.allowed:
            plan.leave(**where, reason=verdict.reason)
        elif manager.desired.pod(uid) is not None:
            plan.leave(**where, reason="the pod is desired; set-up redoes it")
        else:
            refused = manager.volume_held(failed.dir, plan.holders, "clean")
            plan.act(CLEAN, **where, reason=f"{verdict.reason}; could not be rebuilt",
                     refused=refused)
            plan.torn_pods.add(uid)
            if refused:
                plan.held_pods.add(uid)
    for binds in result.orphan_subpaths:
        plan.orphan_subpath(binds)
    kept_pods: set[str] = set()
    for unknown in result.unknown:
        d = unknown.dir
        plan.leave(pod_uid=d.pod_uid, volume=d.spec_name, plugin=d.plugin_name, path=d.path,
                   reason=unknown.reason)
        kept_pods.add(d.pod_uid)
    pods_on_disk = manager.pods_on_disk()
    claimed = manager.claimed_device_mounts()
    for orphan in result.orphans:
        if orphan.path in claimed:
            continue
        verdict = manager.orphan_verdict(orphan, pods_on_disk)
        where = {"pod_uid": "", "volume": "", "plugin": orphan.plugin_name, "path": orphan.path}
        if verdict.allowed:
            plan.act(UNSTAGE, **where, reason=f"orphan device mount: {verdict.reason}")
        else:
            plan.leave(**where, reason=f"orphan device mount: {verdict.reason}")
    for uid in sorted(pods_on_disk | plan.torn_pods):
        verdict = manager.ownership.pod(uid)
        if uid in kept_pods and verdict.allowed and manager.desired.pod(uid) is None:
            # remove_pod_dir refuses while a volume directory is left: say so up front.
            plan.leave(pod_uid=uid, volume="", plugin="", path=manager.host.get_pod_dir(uid),
                       reason="pod directory holds a volume of an unknown plugin, left alone")
        elif verdict.allowed and manager.desired.pod(uid) is None:
            pod_dir = manager.host.get_pod_dir(uid)
            refused = plan.holders.why_refused("remove the pod directory", [pod_dir])
            if uid in plan.held_pods and not refused:
                refused = "a volume of the pod is held (above); left in place"
            plan.act(REMOVE_POD_DIR, pod_uid=uid, volume="", plugin="",
                     path=pod_dir, reason=verdict.reason, refused=refused)
    return RepairPlan(actions=tuple(plan.actions), left=tuple(plan.left),
                      uninspected=plan.holders.uninspected)


class _Planner:
    def __init__(self, manager: NodeVolumeManager, holders: Holders) -> None:
        self.manager = manager
        self.holders = holders
        #: Pods with a volume whose tear-down or clean will be refused.
        self.held_pods: set[str] = set()
        self.actions: list[PlannedAction] = []
        self.left: list[PlannedAction] = []
        self.torn_pods: set[str] = set()
        #: unique volume name -> pods whose use of it is torn down
        self._torn: dict[str, set[str]] = {}

    def act(self, action: str, **fields: str) -> None:
        self.actions.append(PlannedAction(action=action, **fields))

    def leave(self, **fields: str) -> None:
        self.left.append(PlannedAction(action="", **fields))

    def volume(self, found: FoundVolume) -> None:
        d = found.dir
        where = {"pod_uid": d.pod_uid, "volume": d.spec_name, "plugin": d.plugin_name}
        verdict = self.manager.ownership.pod(d.pod_uid)
        if not verdict.allowed:
            self.leave(**where, path=d.path, reason=verdict.reason)
            return
        if self.manager.desired.pod(d.pod_uid) is not None:
            return  # set up again, not torn down: nothing destructive
        reason = f"{verdict.reason}; not wanted"
        refused = ""
        if d.mode is not VolumeMode.BLOCK:  # the tear-down checks; unmap does not
            refused = self.manager.volume_held(d, self.holders, "tear down")
        for sub in found.subpaths:
            self.act(UNMOUNT, **where, path=sub, reason=f"{reason} (subPath bind)",
                     refused=refused)
        if d.mode is VolumeMode.BLOCK:
            self.act(UNMAP, **where, path=found.mount_path, reason=reason)
        elif found.mount in _MOUNTED:
            self.act(UNMOUNT, **where, path=found.mount_path, reason=reason, refused=refused)
        self.act(REMOVE_DIR, **where, path=d.path, reason=reason, refused=refused)
        self.torn_pods.add(d.pod_uid)
        if refused:
            self.held_pods.add(d.pod_uid)
            return  # still used by this pod: its device stays
        self._torn.setdefault(found.unique_name, set()).add(d.pod_uid)

    def orphan_subpath(self, orphan: OrphanSubpath) -> None:
        where = {"pod_uid": orphan.pod_uid, "volume": orphan.volume, "plugin": ""}
        verdict = self.manager.orphan_subpath_verdict(orphan)
        paths = orphan.paths or (os.path.join(orphan.pod_dir, layout.POD_VOLUME_SUBPATHS_DIR,
                                              orphan.volume),)
        if not verdict.allowed:
            for path in paths:
                self.leave(**where, path=path, reason=f"{orphan.reason}: {verdict.reason}")
            return
        refused = self.holders.why_refused("unmount the subPath bind", orphan.paths)
        for path in paths:
            action = UNMOUNT_SUBPATH if path in orphan.mounted else REMOVE_DIR
            self.act(action, **where, path=path, reason=f"{verdict.reason}; {orphan.reason}",
                     refused=refused)
        self.torn_pods.add(orphan.pod_uid)
        if refused:
            self.held_pods.add(orphan.pod_uid)

    def devices(self, volumes: tuple[FoundVolume, ...]) -> None:
        users: dict[str, set[str]] = {}
        first: dict[str, FoundVolume] = {}
        for found in volumes:
            users.setdefault(found.unique_name, set()).add(found.dir.pod_uid)
            first.setdefault(found.unique_name, found)
        for unique, torn in self._torn.items():
            if users[unique] - torn or self.manager.desired.is_desired(unique):
                continue  # another pod still uses it
            found = first[unique]
            where = {"pod_uid": "", "volume": found.volume_name, "plugin": found.dir.plugin_name}
            reason = "its last pod volume is torn down"
            if found.device_mount_path and found.device in _MOUNTED:
                self.act(UNSTAGE, **where, path=found.device_mount_path, reason=reason)
            if found.attachable:
                self.act(DETACH, **where, path="", reason=reason)
