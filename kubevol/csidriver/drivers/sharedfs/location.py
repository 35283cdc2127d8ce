"""Where a sharedfs volume lives: a network filesystem (what ``mount -t FSTYPE -o OPTIONS
SOURCE`` mounts) and the volume's sub-directory in it.

Read from CreateVolume parameters (a StorageClass) or from a volume context (a
PersistentVolume's ``volumeAttributes``), in one of three spellings:

- kubevol's own: ``source`` (``server:/export``, ``mgs@tcp:/fsname``, ``host:/glustervol``),
  ``fstype`` (nfs, nfs4, ceph, lustre, glusterfs, ...), ``mountOptions`` (comma-separated),
  ``subDir``;
- csi-driver-nfs's: ``server`` and ``share`` (fstype ``nfs`` unless given), ``subDir``;
- Azure Lustre's: ``mgs-ip-address`` and ``fs-name`` (source ``MGS@tcp:/FSNAME``, fstype
  ``lustre``), ``sub-dir``.

``subDir`` may hold the templates csi-driver-nfs expands, ``${pvc.metadata.name}``,
``${pvc.metadata.namespace}`` and ``${pv.metadata.name}``, filled from the parameters the
external-provisioner adds with ``--extra-create-metadata`` (``csi.storage.k8s.io/pvc/name``
...). ``onDelete`` (``delete``, ``retain``, ``archive``) says what DeleteVolume does with the
sub-directory. Everything is validated: a source cannot pass for a mount option, a
sub-directory cannot leave the filesystem, an option cannot turn the mount into a bind.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping

import attrs

from kubevol.errors import KubevolError
from kubevol.mount.mountinfo import MountInfo

SOURCE = "source"
FSTYPE = "fstype"
MOUNT_OPTIONS = "mountOptions"
SUB_DIR = "subDir"
ON_DELETE = "onDelete"
#: csi-driver-nfs's parameters.
NFS_SERVER = "server"
NFS_SHARE = "share"
#: Azure Lustre's volume context.
LUSTRE_MGS = "mgs-ip-address"
LUSTRE_FS_NAME = "fs-name"
LUSTRE_SUB_DIR = "sub-dir"
#: What the external-provisioner adds with ``--extra-create-metadata``.
PVC_NAME = "csi.storage.k8s.io/pvc/name"
PVC_NAMESPACE = "csi.storage.k8s.io/pvc/namespace"
PV_NAME = "csi.storage.k8s.io/pv/name"
#: Marks a record the node made from a volume context alone (a static PersistentVolume).
STATIC = "sharedfs.kubevol.io/static"

TEMPLATES = {
    "${pvc.metadata.name}": PVC_NAME,
    "${pvc.metadata.namespace}": PVC_NAMESPACE,
    "${pv.metadata.name}": PV_NAME,
}
_TEMPLATE = re.compile(r"\$\{[^}]*\}")
_FSTYPE = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
#: Options that would make ``mount`` do something else than mount the source.
_FORBIDDEN_OPTIONS = frozenset({"bind", "rbind", "move", "remount", "make-shared", "x-mount.mkdir"})
#: Filesystem types whose mount table entry reads otherwise (a FUSE client, NFS versions).
_TABLE_TYPES = {"nfs": {"nfs", "nfs4"}, "nfs4": {"nfs", "nfs4"}}


class LocationError(KubevolError, ValueError):
    """Parameters or a volume context that do not name a filesystem and sub-directory."""


class OnDelete(enum.StrEnum):
    """What DeleteVolume does with the volume's sub-directory."""

    DELETE = "delete"
    RETAIN = "retain"
    ARCHIVE = "archive"


@attrs.frozen(kw_only=True)
class Filesystem:
    """A network filesystem as ``mount(8)`` takes it."""

    source: str
    fstype: str
    mount_options: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        check_source(self.source)
        if not _FSTYPE.fullmatch(self.fstype):
            raise LocationError(f"fstype {self.fstype!r} is not a filesystem type")
        for option in self.mount_options:
            check_option(option)

    def with_options(self, extra: tuple[str, ...]) -> Filesystem:
        """The same filesystem with ``extra`` options added (each once)."""
        options = tuple(dict.fromkeys((*self.mount_options, *extra)))
        return attrs.evolve(self, mount_options=options)

    def table_types(self) -> set[str]:
        """The ``fs_type`` values its mount table entries can have."""
        return {*_TABLE_TYPES.get(self.fstype, {self.fstype}), f"fuse.{self.fstype}"}

    def shown_by(self, entry: MountInfo) -> bool:
        """Whether the mount table ``entry`` is a mount of this filesystem (same source,
        a type it is shown as)."""
        return (
            entry.fs_type in self.table_types()
            and entry.source.rstrip("/") == self.source.rstrip("/")
        )


@attrs.frozen(kw_only=True)
class VolumeLocation:
    """A volume: its filesystem, its sub-directory ("" for the whole filesystem) and what
    DeleteVolume does with it. ``static`` volumes were never created by this driver."""

    filesystem: Filesystem
    sub_dir: str
    on_delete: OnDelete = OnDelete.DELETE
    static: bool = False

    @property
    def root(self) -> str:
        """The sub-directory as a mount table root (``/`` + sub_dir)."""
        return "/" + self.sub_dir

    def context(self) -> dict[str, str]:
        """The volume context CreateVolume answers (what a node needs to stage)."""
        out = {
            SOURCE: self.filesystem.source,
            FSTYPE: self.filesystem.fstype,
            SUB_DIR: self.sub_dir,
        }
        if self.filesystem.mount_options:
            out[MOUNT_OPTIONS] = ",".join(self.filesystem.mount_options)
        return out


def check_source(source: str) -> None:
    """A mount source: not empty, not an option (leading ``-``), no white space or NUL."""
    if not source or source.startswith("-") or any(c.isspace() or c == "\0" for c in source):
        raise LocationError(f"source {source!r} is not a filesystem source")


def check_option(option: str) -> None:
    """A mount option: not empty, no comma, white space or NUL, nothing that binds or moves."""
    if (
        not option
        or option.startswith("-")
        or any(c.isspace() or c in ",\0" for c in option)
        or option.partition("=")[0] in _FORBIDDEN_OPTIONS
    ):
        raise LocationError(f"mount option {option!r} is not allowed")


def parse_options(text: str) -> tuple[str, ...]:
    """``a,b=c`` as ``("a", "b=c")`` (blanks between commas dropped), each checked."""
    options = tuple(o.strip() for o in text.split(",") if o.strip())
    for option in options:
        check_option(option)
    return options


def clean_sub_dir(raw: str) -> str:
    """``raw`` as a relative, normalised path inside the filesystem ("" for its root).
    Leading and trailing slashes are dropped; ``.``/``..`` components, NUL, and names
    over 255 bytes are refused."""
    parts = [p for p in raw.strip("/").split("/") if p]
    for part in parts:
        if part in (".", "..") or "\0" in part or len(part.encode()) > 255:
            raise LocationError(f"sub-directory {raw!r} leaves the filesystem or is invalid")
    return "/".join(parts)


def expand_sub_dir(template: str, values: Mapping[str, str]) -> str:
    """``template`` with csi-driver-nfs's ``${...}`` templates filled from ``values``."""
    out = template
    for placeholder, key in TEMPLATES.items():
        if placeholder in out:
            value = values.get(key, "")
            if not value:
                raise LocationError(
                    f"subDir {template!r} uses {placeholder} but no {key} parameter was given "
                    "(run the external-provisioner with --extra-create-metadata)"
                )
            out = out.replace(placeholder, value)
    left = _TEMPLATE.search(out)
    if left:
        raise LocationError(f"subDir {template!r}: unknown template {left.group(0)}")
    return out


def filesystem_of(values: Mapping[str, str], default: Filesystem | None = None) -> Filesystem:
    """The filesystem ``values`` name (any of the three spellings), else ``default``."""
    fstype = values.get(FSTYPE, "")
    if LUSTRE_MGS in values or LUSTRE_FS_NAME in values:
        mgs, name = values.get(LUSTRE_MGS, ""), values.get(LUSTRE_FS_NAME, "")
        if not mgs or not name:
            raise LocationError(f"{LUSTRE_MGS} and {LUSTRE_FS_NAME} go together")
        source = mgs if "@" in mgs else f"{mgs}@tcp"
        source, fstype = f"{source}:/{name.strip('/')}", fstype or "lustre"
    elif NFS_SERVER in values or NFS_SHARE in values:
        server, share = values.get(NFS_SERVER, ""), values.get(NFS_SHARE, "")
        if not server or not share:
            raise LocationError(f"{NFS_SERVER} and {NFS_SHARE} go together")
        source, fstype = f"{server}:{share}", fstype or "nfs"
    elif SOURCE in values:
        source = values[SOURCE]
        if not fstype:
            raise LocationError(f"{SOURCE} {source!r} needs an {FSTYPE}")
    elif default is not None:
        return default
    else:
        raise LocationError(
            f"no filesystem named: give {SOURCE} and {FSTYPE} (or {NFS_SERVER}/{NFS_SHARE}, "
            f"or {LUSTRE_MGS}/{LUSTRE_FS_NAME}), or start the driver with --source and --fstype"
        )
    options = parse_options(values.get(MOUNT_OPTIONS, ""))
    if (
        not options
        and default is not None
        and MOUNT_OPTIONS not in values
        and (source, fstype) == (default.source, default.fstype)
    ):
        options = default.mount_options
    return Filesystem(source=source, fstype=fstype, mount_options=options)


def names_filesystem(values: Mapping[str, str]) -> bool:
    """Whether ``values`` name a filesystem themselves (not through a default)."""
    return any(k in values for k in (SOURCE, NFS_SERVER, NFS_SHARE, LUSTRE_MGS, LUSTRE_FS_NAME))


def location_of(
    values: Mapping[str, str],
    *,
    name: str = "",
    default: Filesystem | None = None,
    on_delete: OnDelete = OnDelete.DELETE,
) -> VolumeLocation:
    """The location ``values`` describe. Without a ``subDir``/``sub-dir``, a volume created
    under ``name`` gets the sub-directory ``name`` (as csi-driver-nfs does); a static one
    (no ``name``) is the whole filesystem. Raises :class:`LocationError`."""
    filesystem = filesystem_of(values, default)
    raw = values.get(SUB_DIR, values.get(LUSTRE_SUB_DIR))
    if raw is None:
        raw = name
        if "/" in name or name in (".", ".."):
            raise LocationError(f"volume name {name!r} cannot be a sub-directory; give subDir")
    sub_dir = clean_sub_dir(expand_sub_dir(raw, values))
    policy = values.get(ON_DELETE, on_delete.value)
    try:
        chosen = OnDelete(policy.lower())
    except ValueError:
        raise LocationError(
            f"{ON_DELETE} {policy!r} is not one of {', '.join(o.value for o in OnDelete)}"
        ) from None
    static = values.get(STATIC) == "true"
    return VolumeLocation(
        filesystem=filesystem,
        sub_dir=sub_dir,
        on_delete=OnDelete.RETAIN if static else chosen,
        static=static,
    )
