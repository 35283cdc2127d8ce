"""The unstage guard: may a device mount path (a staging or global mount) be unmounted now?

Before unmounting a device mount path the kubelet lists every other mount of the same
major:minor with the same mountinfo root and refuses if any lies outside its own plugin
path. Every mount of one Lustre (or CephFS, NFS...) filesystem has root ``/`` and one device
number, so two volumes staged from one filesystem block each other's unstage for ever
(Kubernetes issue 105323). Two policies:

``kubelet``
    Kubernetes exactly: ``GetMountRefs`` (same root, same major:minor) then ``HasMountRefs``
    (a reference counts unless it contains the path's ``/plugins/kubernetes.io/…`` part).
    :func:`kubelet_refs_verdict` applies ``HasMountRefs`` to references a plugin found
    itself (the default of ``DeviceMountableVolumePlugin.device_unmount_verdict``).
``safe``
    Candidates are mounts of the same device whose root equals the device mount's root or
    lies under it (a bind of a sub-directory uses the volume too); when a detach follows,
    every other mount of the device, whatever its root (unless the device holds the
    kubelet root itself: nothing detaches the node's own filesystem). Each is attributed:
    a mount of this volume blocks; another volume's mount does not (each mount keeps the
    superblock alive) unless the device is detached afterwards; the kubelet root seen
    through a bind of the root itself (same device, same root path, verified to be the
    same directory) is ignored; a mount outside the kubelet's tree blocks when a detach
    follows or the source is a local block device, and is otherwise reported as a warning.

Cost: one pass over the table finds the mounts over the device mount path and over the
kubelet root, one search the lines of the device; where else the root is visible is looked
up only for a reference outside the root. So a check costs about what Kubernetes'
``SearchMountPoints`` costs, plus attributing each reference, on a node of any size.

The node layer asks a device-mountable plugin for ONE verdict before an unstage and hands
it to ``unmount_device``: the guard runs once per unstage.
"""

from __future__ import annotations

import enum
import json
import os
import posixpath
import stat
from collections.abc import Sequence

import attrs

from kubevol.errors import DeviceStillMountedError, MountError
from kubevol.layout import relative_to
from kubevol.mount.attribution import VolumeIdentity, attribute
from kubevol.mount.helpers import is_corrupted_error, path_exists
from kubevol.mount.mountinfo import MountInfo
from kubevol.mount.mountread import PROC_MOUNTINFO, read_mountinfo_bytes
from kubevol.mount.table import MountTable, MountTableCache
from kubevol.util.lifecycle import ClosesOnExit

#: The part of a device mount path Kubernetes' ``HasMountRefs`` looks for in a reference.
KUBERNETES_PLUGIN_PATH_PREFIX = "/plugins/kubernetes.io/"


class GuardPolicy(enum.StrEnum):
    """Which rules decide whether a reference blocks the unmount."""

    SAFE = "safe"
    KUBELET = "kubelet"


class RefKind(enum.StrEnum):
    """Who a reference to the device mount belongs to."""

    #: A mount of the same volume (a pod's bind mount, a sub-directory bind, ...).
    SAME_VOLUME = "same-volume"
    #: A kubelet-managed mount of another volume of the same filesystem.
    OTHER_VOLUME = "other-volume"
    #: The device mount path itself, seen through a bind mount of the kubelet root.
    KUBELET_ROOT_ALIAS = "kubelet-root-alias"
    #: A mount outside the kubelet's tree: someone else uses the filesystem.
    FOREIGN = "foreign"
    #: A reference a plugin reported by mount point alone (:func:`kubelet_refs_verdict`):
    #: without the mount table nobody can tell whose it is.
    UNATTRIBUTED = "unattributed"


@attrs.frozen(kw_only=True)
class MountRef:
    """One other mount of the device mount's filesystem, and what the policy makes of it."""

    mount_point: str
    kind: RefKind
    blocking: bool
    reason: str

    def to_dict(self) -> dict[str, object]:
        """The JSON shape: ``{"mount_point", "kind", "blocking", "reason"}``."""
        return {
            "mount_point": self.mount_point,
            "kind": self.kind.value,
            "blocking": self.blocking,
            "reason": self.reason,
        }


@attrs.frozen(kw_only=True)
class UnmountVerdict:
    """Whether ``path`` may be unmounted under ``policy``, with every reference explained."""

    path: str
    policy: GuardPolicy
    allowed: bool
    refs: tuple[MountRef, ...]
    #: One line saying why; for a blocked ``kubelet`` verdict, Kubernetes' error text.
    message: str

    @property
    def blocking_refs(self) -> tuple[MountRef, ...]:
        """The references that block the unmount."""
        return tuple(r for r in self.refs if r.blocking)

    @property
    def warnings(self) -> tuple[str, ...]:
        """Reasons of foreign references the policy let pass (``safe`` on a network fs)."""
        return tuple(
            f"{r.mount_point}: {r.reason}"
            for r in self.refs
            if r.kind is RefKind.FOREIGN and not r.blocking
        )

    def to_dict(self) -> dict[str, object]:
        """The JSON shape: ``{"path", "allowed", "policy", "refs": [...]}``."""
        return {
            "path": self.path,
            "allowed": self.allowed,
            "policy": self.policy.value,
            "refs": [r.to_dict() for r in self.refs],
        }

    def raise_if_blocked(self) -> None:
        """Raise :class:`~kubevol.errors.DeviceStillMountedError` unless allowed."""
        if not self.allowed:
            raise DeviceStillMountedError(
                self.message, [r.mount_point for r in self.blocking_refs]
            )


def check_unmount_device(
    device_mount_path: str,
    *,
    root_dir: str,
    policy: GuardPolicy | str = GuardPolicy.SAFE,
    detach_follows: bool = False,
    mountinfo_path: str = PROC_MOUNTINFO,
    table: MountTable | None = None,
) -> UnmountVerdict:
    """Decide whether ``device_mount_path`` may be unmounted (see the module docstring).

    ``root_dir`` is the kubelet root the layout is read under; ``detach_follows`` says the
    device will be detached from the node after the unmount. ``table`` is a snapshot to use
    instead of reading ``mountinfo_path`` (from a :class:`~kubevol.mount.table.MountTableCache`).
    A missing path or a corrupted mount is allowed with no references, as in Kubernetes.
    Does not change anything. Raises ``ValueError`` for an unknown policy and
    :class:`~kubevol.errors.MountError` when the path cannot be checked or the mount table
    cannot be read or has no mount containing the path.
    """
    policy = GuardPolicy(policy)
    path = os.path.abspath(device_mount_path)
    try:
        exists = path_exists(path)
    except OSError as exc:
        if not is_corrupted_error(exc):
            raise MountError(exc.errno, f"cannot check {path!r}: {exc.strerror}") from exc
        return _allowed_empty(path, policy, "is a corrupted mount: nothing uses it any more")
    if not exists:
        return _allowed_empty(path, policy, "does not exist: nothing to unmount")
    if table is None:
        table = MountTable(read_mountinfo_bytes(mountinfo_path))
    context = _Context.build(table, path, os.path.realpath(root_dir), detach_follows)
    if policy is GuardPolicy.KUBELET:
        return _kubelet_verdict(context, path)
    return _safe_verdict(context, path)


def kubelet_refs_verdict(device_mount_path: str, refs: Sequence[str]) -> UnmountVerdict:
    """The kubelet's rule on references already found (a plugin's ``get_device_mount_refs``,
    Kubernetes' ``GetMountRefs``): ``HasMountRefs`` decides which count, and a blocked
    verdict carries Kubernetes' error text. The references stay unattributed."""
    out = []
    for ref in refs:
        blocking, rule = _kubelet_counts(device_mount_path, ref)
        out.append(
            MountRef(mount_point=ref, kind=RefKind.UNATTRIBUTED, blocking=blocking, reason=rule)
        )
    return _kubelet_outcome(device_mount_path, out)


class UnmountGuard(ClosesOnExit):
    """:func:`check_unmount_device` with a cached mount table: repeated checks on an
    unchanged table do not read or parse it again. Close it (or use ``with``) when done."""

    def __init__(
        self,
        *,
        root_dir: str,
        policy: GuardPolicy | str = GuardPolicy.SAFE,
        mountinfo_path: str = PROC_MOUNTINFO,
    ) -> None:
        self.root_dir = root_dir
        self.policy = GuardPolicy(policy)
        self._cache = MountTableCache(mountinfo_path)

    @property
    def table_reads(self) -> int:
        """How many times the mount table was actually read."""
        return self._cache.reads

    def check(self, device_mount_path: str, *, detach_follows: bool = False) -> UnmountVerdict:
        """:func:`check_unmount_device` for ``device_mount_path`` with this guard's settings."""
        return check_unmount_device(
            device_mount_path,
            root_dir=self.root_dir,
            policy=self.policy,
            detach_follows=detach_follows,
            table=self._cache.table(),
        )

    def close(self) -> None:
        """Release the mount table descriptor. Idempotent."""
        self._cache.close()


def _allowed_empty(path: str, policy: GuardPolicy, why: str) -> UnmountVerdict:
    return UnmountVerdict(
        path=path, policy=policy, allowed=True, refs=(), message=f"{path} {why}"
    )


@attrs.define(kw_only=True, eq=False)
class _Context:
    """Everything the policies need about the device mount and the kubelet root."""

    table: MountTable
    path: str  # resolved
    root_dir: str  # resolved
    entry: MountInfo  # the mount containing path
    root: str  # path's place inside its filesystem
    rel: str | None  # path relative to root_dir, if under it
    volume: VolumeIdentity | None
    volume_problem: str
    root_entry: MountInfo | None  # the mount containing root_dir
    detach_follows: bool
    _aliases: tuple[str, ...] | None = None

    def aliases(self) -> tuple[str, ...]:
        """Where else root_dir is visible; looked up only for a reference outside the root,
        so a check whose references all lie under the root never searches for them."""
        if self._aliases is None:
            self._aliases = tuple(_root_aliases(self.table, self.root_dir, self.root_entry))
        return self._aliases

    @classmethod
    def build(cls, table: MountTable, path: str, root_dir: str, detach_follows: bool) -> _Context:
        real = os.path.realpath(path)
        entry, root_entry = table.find_containing_all((real, root_dir))
        if entry is None:
            raise MountError(f"failed to get root path and major:minor for {real}")
        root = posixpath.normpath(
            posixpath.join(entry.root, posixpath.relpath(real, entry.mount_point))
        )
        rel = relative_to(real, root_dir)
        volume, problem = None, "the device mount path is not under the kubelet root"
        if rel is not None:
            described = attribute(root_dir, rel)
            if described is None:
                problem = "the device mount path is not in the kubelet's layout"
            else:
                volume, problem = described.volume, described.problem
        return cls(
            table=table,
            path=real,
            root_dir=root_dir,
            entry=entry,
            root=root,
            rel=rel,
            volume=volume,
            volume_problem=problem,
            root_entry=root_entry,
            detach_follows=detach_follows,
        )

    def candidates(self, *, under: bool, any_root: bool = False) -> list[MountInfo]:
        """Other mounts of the device with the same root (or, with ``under``, below it; with
        ``any_root``, whatever their root)."""
        root = None if any_root else self.root
        return [
            e
            for e in self.table.with_device(self.entry.major, self.entry.minor, root, under=under)
            if e.id != self.entry.id
        ]


def _kubelet_counts(device_mount_path: str, ref: str) -> tuple[bool, str]:
    """Kubernetes' ``HasMountRefs`` for one reference: it counts unless it contains the
    device mount path from its ``/plugins/kubernetes.io/`` part on (the whole path when
    it has none), i.e. unless it is the same mount seen through a bind of the root."""
    marker = device_mount_path.find(KUBERNETES_PLUGIN_PATH_PREFIX)
    path_to_find = device_mount_path[marker:] if marker >= 0 else device_mount_path
    if path_to_find in ref:
        return False, f"ignored by the kubelet: it contains {path_to_find!r}"
    return True, f"counted by the kubelet: it lacks {path_to_find!r}"


def _kubelet_outcome(given_path: str, refs: list[MountRef]) -> UnmountVerdict:
    allowed = not any(r.blocking for r in refs)
    if allowed:
        message = f"{given_path} may be unmounted: no reference counts for the kubelet"
    else:
        # Kubernetes' fmt.Errorf("... %q ... %v", deviceMountPath, refs): every reference.
        message = (
            f"the device mount path {_go_quote(given_path)} is still mounted by other "
            f"references [{' '.join(r.mount_point for r in refs)}]"
        )
    return UnmountVerdict(
        path=given_path, policy=GuardPolicy.KUBELET, allowed=allowed, refs=tuple(refs),
        message=message,
    )


def _kubelet_verdict(ctx: _Context, given_path: str) -> UnmountVerdict:
    # SearchMountPoints: the same root exactly, the same major:minor.
    out = []
    for entry in ctx.candidates(under=False):
        kind, why = _classify(ctx, entry)
        blocking, rule = _kubelet_counts(given_path, entry.mount_point)
        out.append(
            MountRef(mount_point=entry.mount_point, kind=kind, blocking=blocking,
                     reason=f"{why}; {rule}")
        )
    return _kubelet_outcome(given_path, out)


def _safe_verdict(ctx: _Context, given_path: str) -> UnmountVerdict:
    out = []
    # A detach takes the device away from every mount of it, whatever part of the
    # filesystem each shows (a bind of a sub-directory staged here does not protect a
    # mount of the whole filesystem elsewhere). Not so when the device holds the kubelet
    # root itself: a volume bound from the node's own filesystem (hostpath-style) has a
    # logical attachment, no detach can take that device away, and only mounts of the
    # volume's own directory are its users.
    own_filesystem = ctx.root_entry is not None and ctx.root_entry.device == ctx.entry.device
    any_root = ctx.detach_follows and not own_filesystem
    for entry in ctx.candidates(under=True, any_root=any_root):
        kind, why = _classify(ctx, entry)
        blocking, rule = _safe_rule(ctx, entry, kind)
        out.append(
            MountRef(mount_point=entry.mount_point, kind=kind, blocking=blocking,
                     reason=f"{why}; {rule}")
        )
    blockers = [r.mount_point for r in out if r.blocking]
    if blockers:
        message = (
            f"the device mount path {_go_quote(given_path)} is still used by "
            f"{', '.join(blockers)}"
        )
    else:
        message = f"{given_path} may be unmounted: no other mount needs it"
    return UnmountVerdict(
        path=given_path, policy=GuardPolicy.SAFE, allowed=not blockers, refs=tuple(out),
        message=message,
    )


def _safe_rule(ctx: _Context, entry: MountInfo, kind: RefKind) -> tuple[bool, str]:
    if kind is RefKind.KUBELET_ROOT_ALIAS:
        return False, "not a user: the same mount seen through another path"
    if kind is RefKind.SAME_VOLUME:
        if entry.mount_point == ctx.path:
            return False, "stacked on the device mount path itself, which the unstage unmounts"
        return True, "this volume is still in use there"
    if kind is RefKind.OTHER_VOLUME:
        if ctx.detach_follows:
            return True, "the device is detached after the unmount, which would break it"
        return False, "unmounting this path leaves that mount working (it holds the filesystem)"
    if ctx.detach_follows:
        return True, "the device is detached after the unmount, which would break it"
    if _is_local_block_device(entry.source):
        return True, f"{entry.source} is a local block device: the unstage may tear it down"
    return False, (
        "warning: cannot tell whether it uses this volume; unmounting this path leaves it "
        "working since no detach follows and the source is not a local block device"
    )


def _classify(ctx: _Context, entry: MountInfo) -> tuple[RefKind, str]:
    """Attribute ``entry`` to this volume, another volume, a root alias, or someone else."""
    point = entry.mount_point
    if entry.root == ctx.root:
        sub = ""
    elif relative_to(entry.root, ctx.root) is not None:
        sub = f" (sub-directory {entry.root})"
    else:
        sub = f" (filesystem path {entry.root})"
    if relative_to(point, ctx.path) is not None:
        return RefKind.SAME_VOLUME, f"inside the device mount path{sub}"
    rel = relative_to(point, ctx.root_dir)
    via = ""
    if rel is None:
        for alias in ctx.aliases():
            rel = relative_to(point, alias)
            if rel is not None:
                via = f" through {alias}, a bind mount of the kubelet root"
                break
    if rel is not None and rel == ctx.rel and entry.root == ctx.root:
        return RefKind.KUBELET_ROOT_ALIAS, f"the device mount path seen{via}"
    if rel is None:
        # A path that merely ends like the device mount path (another kubelet-style root
        # elsewhere) is someone else's mount: only a verified bind of the root is an alias.
        return RefKind.FOREIGN, f"mounted outside the kubelet root{sub}, source {entry.source}"
    described = attribute(ctx.root_dir, rel)
    if described is None:
        return RefKind.FOREIGN, f"under the kubelet root{via} but in no kubelet layout{sub}"
    where = f"kubelet {described.role}" + (
        f" of pod {described.pod_uid}" if described.pod_uid else ""
    )
    if via:
        where += f" (seen{via})"
    if described.volume is None or ctx.volume is None:
        problem = described.problem if described.volume is None else ctx.volume_problem
        return RefKind.SAME_VOLUME, f"{where}{sub}; assumed to be this volume: {problem}"
    if described.volume == ctx.volume:
        return RefKind.SAME_VOLUME, f"{where} of this volume ({described.volume.description}){sub}"
    return RefKind.OTHER_VOLUME, f"{where} of {described.volume.description}{sub}"


def _root_aliases(table: MountTable, root_dir: str, entry: MountInfo | None) -> list[str]:
    """Other places where the directory ``root_dir`` is visible: binds of the root itself,
    i.e. mounts of its device whose root is the root directory's own path in that
    filesystem (``entry`` is the mount containing ``root_dir``), verified to show the same
    directory. A bind of a parent (say the whole root filesystem at ``/host``) is not one:
    what shows under it is not kubelet-managed from this root's point of view."""
    if entry is None:
        return []
    fs_path = posixpath.normpath(
        posixpath.join(entry.root, posixpath.relpath(root_dir, entry.mount_point))
    )
    aliases = []
    for other in table.with_device(entry.major, entry.minor, fs_path):
        alias = other.mount_point
        elsewhere = relative_to(alias, root_dir) is None and relative_to(root_dir, alias) is None
        if elsewhere and _same_directory(alias, root_dir):
            aliases.append(alias)
    return aliases


def _same_directory(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _is_local_block_device(source: str) -> bool:
    if source.startswith("/dev/"):
        return True
    try:
        return source.startswith("/") and stat.S_ISBLK(os.stat(source).st_mode)
    except OSError:
        return False


def _go_quote(text: str) -> str:
    """Go's ``%q`` for ordinary text: double quotes, backslash escapes."""
    return json.dumps(text, ensure_ascii=False)
