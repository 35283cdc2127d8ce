"""Real mounts for tests: ext4 images on loop devices, tmpfs, bind mounts, a FUSE mount
whose daemon was killed (a corrupted mount), and a kubelet-style tree to stage volumes in.

:class:`MountRig` records everything it creates and undoes it in :meth:`MountRig.cleanup`,
in order: mounts (last first), then helper processes, then loop devices. Use it from a
fixture with a finalizer, as root, inside a private mount namespace
(``unshare -m --propagation private``) so that nothing can leak to the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from kubevol.mount.mountinfo import parse_mountinfo


class RigError(RuntimeError):
    """A command the rig ran failed; the message has its output."""


def run(*args: str) -> str:
    """Run a command and return its output; raises :class:`RigError` when it fails."""
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RigError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def mounted_at(path: Path) -> bool:
    """Whether the current mount table has an entry at ``path``."""
    return any(e.mount_point == str(path) for e in parse_mountinfo())


def mounts_under(path: Path | str) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace, in mount-table order (a
    mount on top of another comes after it). Reads only the mount table: resolving links
    would stat the path, which on a FUSE mount asks (or hangs on) its daemon."""
    base = os.path.abspath(path)
    return [
        e.mount_point
        for e in parse_mountinfo()
        if e.mount_point == base or e.mount_point.startswith(base + "/")
    ]


def unmount_all_under(path: Path | str) -> list[str]:
    """Unmount (lazily) everything at or below ``path``, last mounted first; returns what
    was unmounted. For a test's finalizer: a test that failed half-way leaves no mount."""
    points = list(reversed(mounts_under(path)))
    for point in points:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return points


class MountRig:
    """Creates real mounts, loop devices and FUSE daemons under one directory and undoes
    them all in :meth:`cleanup`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._mounts: list[Path] = []
        self._loops: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    def image(self, name: str = "disk.img", size_mib: int = 32, *, ext4: bool = True) -> Path:
        """A sparse image file, formatted ext4 unless ``ext4=False``."""
        img = self.base / name
        with open(img, "wb") as f:
            f.truncate(size_mib << 20)
        if ext4:
            run("mkfs.ext4", "-q", "-F", str(img))
        return img

    def loop(self, image: Path | None = None) -> str:
        """Attach ``image`` (default: a fresh ext4 image) to a free loop device."""
        img = image if image is not None else self.image(f"disk{len(self._loops)}.img")
        dev = run("losetup", "-f", "--show", str(img)).strip()
        self._loops.append(dev)
        return dev

    def mount(self, source: str, target: Path, *options: str, fstype: str = "") -> Path:
        """``mount [-t fstype] [-o options] source target`` (creating target as a directory
        unless something, such as a file to bind a file onto, is there already)."""
        if not os.path.lexists(target):
            target.mkdir(parents=True)
        args = ["mount"]
        if fstype:
            args += ["-t", fstype]
        if options:
            args += ["-o", ",".join(options)]
        run(*args, source, str(target))
        self._mounts.append(target)
        return target

    def bind(self, source: Path, target: Path) -> Path:
        """A bind mount of ``source`` at ``target``."""
        return self.mount(str(source), target, "bind")

    def rbind(self, source: Path, target: Path) -> Path:
        """A recursive bind mount (submounts come along, as when a kubelet root is shared)."""
        target.mkdir(parents=True, exist_ok=True)
        run("mount", "--rbind", str(source), str(target))
        self._mounts.append(target)
        return target

    def tmpfs(self, target: Path) -> Path:
        """A fresh tmpfs at ``target``."""
        return self.mount("tmpfs", target, "size=4m", fstype="tmpfs")

    def device_alias(self, device: str, path: Path) -> Path:
        """Another block device node for ``device`` (same major:minor, another name): mounting
        through it gives a mount with the same device number and another source, as Lustre
        mounts of another sub-directory show."""
        rdev = os.stat(device).st_rdev
        os.mknod(path, 0o600 | 0o060000, rdev)  # S_IFBLK
        return path

    def corrupted(self, target: Path) -> Path:
        """A bindfs FUSE mount at ``target`` whose daemon has been killed: stat answers ENOTCONN."""
        src = self.base / f"bindfs-src-{len(self._procs)}"
        src.mkdir()
        target.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(["bindfs", "-f", str(src), str(target)])
        self._procs.append(proc)
        self._mounts.append(target)
        deadline = time.monotonic() + 10
        while not mounted_at(target):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RigError("bindfs did not mount")
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return target

    def unmount(self, target: Path) -> None:
        """Unmount one mount made by this rig (the test wants it gone before the end)."""
        run("umount", str(target))
        self._mounts.reverse()
        self._mounts.remove(target)
        self._mounts.reverse()

    def cleanup(self) -> None:
        """Undo everything, last first; report what could not be undone."""
        problems = []
        for target in reversed(self._mounts):
            while mounted_at(target):
                result = subprocess.run(
                    ["umount", str(target)], capture_output=True, text=True, check=False
                )
                if result.returncode != 0:
                    lazy = subprocess.run(
                        ["umount", "-l", str(target)], capture_output=True, check=False
                    )
                    if lazy.returncode != 0:
                        problems.append(f"umount {target}: {result.stderr.strip()}")
                        break
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for dev in self._loops:
            result = subprocess.run(
                ["losetup", "-d", dev], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                problems.append(f"losetup -d {dev}: {result.stderr.strip()}")
        self._mounts.clear()
        self._loops.clear()
        self._procs.clear()
        if problems:
            raise RigError("; ".join(problems))


class KubeletTree:
    """A kubelet root with the CSI plugin's layout: global mounts and pod mounts, each with
    the vol_data.json the CSI plugin writes beside it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def global_mount(self, handle: str, driver: str = "lustre.csi.example.com") -> Path:
        """``plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`` (created)."""
        # The kubelet's staging directory (csi_attacher.go, MakeDeviceMountPath): the hex
        # SHA-256 of the volume handle, computed here, not by kubevol's layout under test.
        vol_dir = (self.root / "plugins/kubernetes.io/csi" / driver
                   / hashlib.sha256(handle.encode()).hexdigest())
        path = vol_dir / "globalmount"
        path.mkdir(parents=True, exist_ok=True)
        data = {"volumeHandle": handle, "driverName": driver}
        (vol_dir / "vol_data.json").write_text(json.dumps(data))
        return path

    def pod_mount(
        self, pod_uid: str, spec_name: str, handle: str, driver: str = "lustre.csi.example.com"
    ) -> Path:
        """``pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount`` (created)."""
        vol_dir = self.root / "pods" / pod_uid / "volumes/kubernetes.io~csi" / spec_name
        path = vol_dir / "mount"
        path.mkdir(parents=True, exist_ok=True)
        data = {
            "specVolID": spec_name,
            "volumeHandle": handle,
            "driverName": driver,
            "nodeName": "node-1",
            "volumeLifecycleMode": "Persistent",
            "attachmentID": "",
        }
        (vol_dir / "vol_data.json").write_text(json.dumps(data))
        return path


