"""The bundled hostpath CSI driver served for real (gRPC over a unix socket, loop devices,
bind mounts), with the node requests it answers recorded: what a test compares with the
kubelet's arguments."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.testing.mount_rig import unmount_all_under

MiB = 1 << 20


class RecordedHostPath:
    """A served hostpath driver whose ``rpcs`` (node service method names, e.g.
    ``node_expand_volume``) are recorded as they arrive, then answered by the driver."""

    def __init__(self, state_dir: Path, rpcs: tuple[str, ...]) -> None:
        driver = HostPathDriver(HostPathConfig(state_dir=str(state_dir), node_id="n1"))
        self._lock = threading.Lock()
        self._calls: dict[str, list[Any]] = {name: [] for name in rpcs}
        node: Any = driver.plugin.node
        for name in rpcs:
            setattr(node, name, self._recording(name, getattr(node, name)))
        self.running: RunningDriver = driver.serve()

    def _recording(self, name: str, real: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def call(request: Any, context: Any) -> Any:
            copy = type(request)()
            copy.CopyFrom(request)
            with self._lock:
                self._calls[name].append(copy)
            return real(request, context)

        return call

    @property
    def endpoint(self) -> str:
        return self.running.endpoint

    def calls(self, name: str) -> list[Any]:
        """The requests of ``name`` received so far, in order."""
        with self._lock:
            return list(self._calls[name])

    def create_volume(self, name: str, size: int, *, block: bool = False) -> str:
        cap = t.VolumeCapability.block() if block else t.VolumeCapability.mount()
        with CSIClient(self.endpoint) as client:
            volume = client.create_volume(
                name, [cap], capacity_range=t.CapacityRange(required_bytes=size)
            )
        return volume.volume_id

    def controller_expand(self, volume_id: str, size: int) -> None:
        """What the external-resizer does before the claim's new size reaches a node."""
        with CSIClient(self.endpoint) as client:
            result = client.controller_expand_volume(
                volume_id, t.CapacityRange(required_bytes=size)
            )
        assert result.capacity_bytes == size

    def stop(self) -> None:
        self.running.stop()


def device_size(path: str) -> int:
    """The size of the block device at ``path`` (a link or bind of its node), in bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


@contextlib.contextmanager
def recorded_hostpath(tmp_path: Path, rpcs: Sequence[str]) -> Iterator[RecordedHostPath]:
    """The hostpath driver on a tmpfs of its own under ``tmp_path``, ``rpcs`` recorded;
    stopped and everything under ``tmp_path`` unmounted afterwards. Needs root."""
    (tmp_path / "hp").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(tmp_path / "hp")],
                   check=True)
    driver = RecordedHostPath(tmp_path / "hp", tuple(rpcs))
    try:
        yield driver
    finally:
        driver.stop()
        unmount_all_under(tmp_path)
