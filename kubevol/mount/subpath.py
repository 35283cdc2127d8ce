"""subPath bind mounts, made safely (the kubelet's ``pkg/volume/util/subpath``).

A container's ``volumeMounts[i].subPath`` is bound from inside its volume to
``pods/<uid>/volume-subpaths/<volume>/<container>/<i>``, and the container runtime then
mounts that. The path inside the volume is user-controlled: a symlink (planted before, or
swapped in while the kubelet works) must never make the bind show something outside the
volume (CVE-2017-1002101, CVE-2021-25741). So:

1. the subPath is refused if absolute or with a ``..`` component;
2. symlinks are resolved once and the result must lie within the (resolved) volume;
3. the result is then opened component by component from the volume root with
   ``openat(O_PATH|O_NOFOLLOW)``: a component that is (or has just become) a symlink is
   refused;
4. the bind's source is the opened descriptor, ``/proc/<pid>/fd/<n>``: whatever happens
   to the path afterwards, the bind shows what was checked.

Missing directories of a subPath are created the same way (``mkdirat`` then ``openat``
with ``O_NOFOLLOW``), with the volume root's permissions. Clean-up unmounts every bind of a
volume and removes the directories; it never deletes through a mount.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import stat

import attrs

from kubevol import layout
from kubevol.errors import KubevolError, MountError
from kubevol.mount.helpers import is_corrupted_error
from kubevol.mount.interface import MountInterface

log = logging.getLogger(__name__)

_OPEN_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class SubPathError(KubevolError, ValueError):
    """A subPath that is invalid, escapes its volume, or could not be bound."""


@attrs.frozen(kw_only=True)
class Subpath:
    """One ``volumeMounts[]`` entry with a subPath (the kubelet's ``subpath.Subpath``)."""

    #: Index of the entry in the container's ``volumeMounts``.
    volume_mount_index: int
    #: ``volume_path`` joined with the subPath.
    path: str
    #: The pod's volume name (``spec.volumes[].name``).
    volume_name: str
    #: Where the volume is set up for the pod.
    volume_path: str
    #: ``pods/<uid>`` under the kubelet root.
    pod_dir: str
    container_name: str

    def bind_target(self) -> str:
        """``pods/<uid>/volume-subpaths/<volume>/<container>/<index>``."""
        return posixpath.join(
            self.pod_dir, layout.POD_VOLUME_SUBPATHS_DIR,
            layout.validate_path_segment(self.volume_name, "volume name"),
            layout.validate_path_segment(self.container_name, "container name"),
            str(int(self.volume_mount_index)),
        )


def validate_sub_path(sub_path: str) -> str:
    """``sub_path`` if it is relative and has no ``..`` component, else SubPathError."""
    if "\0" in sub_path:
        raise SubPathError(f"subPath {sub_path!r} must not contain NUL")
    if sub_path.startswith("/"):
        raise SubPathError(f"error SubPath `{sub_path}` must not be an absolute path")
    if ".." in sub_path.split("/"):
        raise SubPathError(f"unable to provision SubPath `{sub_path}`: must not contain '..'")
    return sub_path


def _within(path: str, base: str) -> bool:
    rel = posixpath.relpath(path, base)
    return rel == "." or not (rel == ".." or rel.startswith("../"))


def safe_open(path: str, base: str) -> int:
    """Open ``path`` (which must lie within ``base``) with ``O_PATH``, walking from
    ``base`` one component at a time without following symlinks. Returns the descriptor;
    the caller closes it. Raises SubPathError when a component is a symlink or the path
    leaves ``base``, ``OSError`` for other failures."""
    path, base = posixpath.normpath(path), posixpath.normpath(base)
    if not _within(path, base):
        raise SubPathError(f"path {path} is outside of allowed base {base}")
    rel = posixpath.relpath(path, base)
    segments = [] if rel == "." else rel.split("/")
    # The base is the one directory under our control: it must not be a symlink either.
    parent = os.open(base, _OPEN_DIR)
    try:
        current = base
        for seg in segments:
            current = posixpath.join(current, seg)
            if not _within(current, base) or seg in ("", ".", ".."):
                raise SubPathError(f"path {current} is outside of allowed base {base}")
            # Trigger an automount, if any, before opening (openat does not).
            with contextlib.suppress(OSError):
                os.stat(seg + "/", dir_fd=parent, follow_symlinks=False)
            child = os.open(seg, _OPEN_PATH, dir_fd=parent)
            if stat.S_ISLNK(os.fstat(child).st_mode):
                os.close(child)
                raise SubPathError(f"unexpected symlink found {current}")
            os.close(parent)
            parent = child
        if not segments:  # the subPath is the volume root itself: hand out an O_PATH fd
            child = os.open(".", _OPEN_PATH | os.O_DIRECTORY, dir_fd=parent)
            os.close(parent)
            parent = child
    except BaseException:
        os.close(parent)
        raise
    return parent


def safe_make_dir(sub_path: str, base: str, perm: int) -> None:
    """Create the directories of ``base/sub_path`` that are missing, each with ``perm``,
    never through a symlink. An existing directory is success; an existing non-directory
    is ``NotADirectoryError``."""
    validate_sub_path(sub_path)
    target = posixpath.normpath(posixpath.join(base, sub_path))
    if not _within(target, base):
        raise SubPathError(f"path {target} is outside of allowed base {base}")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode):
            return
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", target)
    existing, to_create = _existing_prefix(base, target)
    real_existing = os.path.realpath(existing)
    real_base = os.path.realpath(base)
    if not _within(real_existing, real_base):
        raise SubPathError(f"path {real_existing} is outside of allowed base {real_base}")
    fd = _open_dir_safely(real_existing, real_base)
    try:
        for name in to_create:
            os.mkdir(name, perm, dir_fd=fd)
            child = os.open(name, _OPEN_DIR | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
            # mkdir's mode is filtered by the umask; chmod through the fd, not the path
            # (the path can be swapped after mkdirat).
            os.fchmod(fd, perm)
    finally:
        os.close(fd)


def _open_dir_safely(path: str, base: str) -> int:
    """A readable directory fd for ``path``, reached like :func:`safe_open`."""
    opath = safe_open(path, base)
    try:
        return os.open(f"/proc/self/fd/{opath}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(opath)


def _existing_prefix(base: str, target: str) -> tuple[str, list[str]]:
    """The longest existing path of ``target`` under ``base`` and the components to create
    below it (stat follows links here: the result is checked and re-walked safely after)."""
    rel = posixpath.relpath(target, base)
    parts = [] if rel == "." else rel.split("/")
    current = base
    for i, part in enumerate(parts):
        candidate = posixpath.join(current, part)
        try:
            os.stat(candidate)
        except FileNotFoundError:
            return current, parts[i:]
        current = candidate
    return current, []


def prepare_safe_subpath(mounter: MountInterface, subpath: Subpath) -> str:
    """Bind ``subpath.path`` at its target as the module describes; returns the target.

    Idempotent: a target already bound to the same file is left as it is; one bound to
    something else is unmounted and bound again. On failure nothing is left mounted.
    """
    try:
        volume_path = os.path.realpath(subpath.volume_path, strict=True)
        path = os.path.realpath(subpath.path, strict=True)
    except OSError as exc:
        raise SubPathError(f"error resolving symlinks in {exc.filename}: {exc.strerror}") from exc
    if not _within(path, volume_path):
        raise SubPathError(f"subpath {path!r} not within volume path {volume_path!r}")
    fd = safe_open(path, volume_path)
    try:
        resolved = attrs.evolve(subpath, path=path, volume_path=volume_path)
        target, already = _prepare_target(mounter, resolved, fd)
        if already:
            return target
        source = f"/proc/{os.getpid()}/fd/{fd}"
        try:
            mounter.mount(source, target, "", ["bind"])
        except MountError as exc:
            _clean_one(mounter, target)
            raise MountError(f"error mounting {subpath.path}: {exc}") from exc
        log.debug("bound subPath %s at %s", subpath.path, target)
        return target
    finally:
        os.close(fd)


def _prepare_target(mounter: MountInterface, subpath: Subpath, fd: int) -> tuple[str, bool]:
    target = subpath.bind_target()
    try:
        mounted = not mounter.is_likely_not_mount_point(target)
    except FileNotFoundError:
        mounted = False
    if mounted:
        if _same_file(os.fstat(fd), target):
            return target, True
        mounter.unmount(target)
    os.makedirs(posixpath.dirname(target), mode=0o750, exist_ok=True)
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        with contextlib.suppress(FileExistsError):
            os.mkdir(target, 0o750)
    else:
        # A file is enough for any non-directory (file, device, socket, ...): the bind
        # gives it the source's type.
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o640))
    return target, False


def _same_file(st: os.stat_result, target: str) -> bool:
    try:
        other = os.lstat(target)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)


def _clean_one(mounter: MountInterface, path: str) -> None:
    """Unmount ``path`` while mounted (binds can stack), then remove the empty dir or the
    file made for the bind. Never removes anything that stays mounted."""
    for _ in range(16):
        try:
            mounted = not mounter.is_likely_not_mount_point(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            if not is_corrupted_error(exc):
                raise
            mounted = True
        if not mounted:
            break
        mounter.unmount(path)
    else:
        raise MountError(f"{path} is still mounted after unmounting it 16 times; left in place")
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        os.rmdir(path)
    else:
        os.unlink(path)


def clean_subpaths(mounter: MountInterface, pod_dir: str, volume_name: str) -> None:
    """Unmount and remove every subPath bind of ``volume_name`` in the pod
    (``volume-subpaths/<volume>/*/*``), then the emptied directories. Idempotent."""
    volume_dir = posixpath.join(pod_dir, layout.POD_VOLUME_SUBPATHS_DIR,
                                layout.validate_path_segment(volume_name, "volume name"))
    try:
        containers = sorted(os.listdir(volume_dir))
    except FileNotFoundError:
        return
    for container in containers:
        container_dir = posixpath.join(volume_dir, container)
        if not os.path.isdir(container_dir) or os.path.islink(container_dir):
            log.debug("not a container directory: %s", container_dir)
            continue
        for index in sorted(os.listdir(container_dir)):
            _clean_one(mounter, posixpath.join(container_dir, index))
        os.rmdir(container_dir)
    os.rmdir(volume_dir)
    # The last volume of the pod takes the pod's volume-subpaths directory with it.
    with contextlib.suppress(OSError):
        os.rmdir(posixpath.dirname(volume_dir))


def list_subpaths(pod_dir: str, volume_name: str) -> list[str]:
    """Every bind target of ``volume_name`` in the pod (``volume-subpaths/<volume>/*/*``)."""
    volume_dir = posixpath.join(pod_dir, layout.POD_VOLUME_SUBPATHS_DIR, volume_name)
    out: list[str] = []
    try:
        containers = sorted(os.listdir(volume_dir))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for container in containers:
        container_dir = posixpath.join(volume_dir, container)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            out.extend(posixpath.join(container_dir, i) for i in sorted(os.listdir(container_dir)))
    return out
