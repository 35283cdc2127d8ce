"""Is each mounted volume healthy? (Nomad's ``VolumeChecker``, a TODO there.)

A published target must be a mount point whose filesystem answers. Beyond that, when the
plugin offers GET_VOLUME_STATS with VOLUME_CONDITION, its NodeGetVolumeStats condition is
asked too; otherwise (or when the plugin cannot answer) the corrupted-mount check decides.
"""

from __future__ import annotations

import enum
import logging

import attrs

from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError
from kubevol.mount.helpers import path_exists
from kubevol.nomad.claims import DEFAULT_NAMESPACE, VolumeKey
from kubevol.nomad.volumes import VolumeManager

log = logging.getLogger(__name__)


class CheckMethod(enum.StrEnum):
    """What decided a verdict."""

    VOLUME_CONDITION = "volume-condition"
    MOUNT_CHECK = "mount-check"


@attrs.frozen(kw_only=True)
class VolumeHealth:
    """The verdict on one allocation's use of a volume."""

    key: VolumeKey
    alloc_id: str
    path: str
    healthy: bool
    message: str
    method: CheckMethod


class VolumeChecker:
    """Checks the volumes a :class:`VolumeManager` mounted. Thread-safe; never raises for
    an unhealthy volume (that is the verdict), only for invalid names."""

    def __init__(self, volumes: VolumeManager) -> None:
        self.volumes = volumes

    def check(
        self,
        volume_id: str,
        alloc_id: str,
        usage: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        remote_id: str = "",
    ) -> VolumeHealth:
        """Check ``alloc_id``'s target of a volume; ``usage`` is ``UsageOptions.to_fs()``."""
        key = VolumeKey(namespace=namespace, volume_id=volume_id, usage=usage)
        path = self.volumes.target_path(key, alloc_id)

        def verdict(healthy: bool, message: str, method: CheckMethod) -> VolumeHealth:
            return VolumeHealth(
                key=key,
                alloc_id=alloc_id,
                path=path,
                healthy=healthy,
                message=message,
                method=method,
            )

        try:
            if not path_exists(path):
                return verdict(False, "target path does not exist", CheckMethod.MOUNT_CHECK)
        except OSError as exc:
            # path_exists raises CorruptedMountError (an OSError) for a dead filesystem.
            return verdict(False, str(exc), CheckMethod.MOUNT_CHECK)
        if not self.volumes.has_mount_at(path):
            return verdict(False, "target path is not mounted", CheckMethod.MOUNT_CHECK)
        fallback = "mounted and answering"
        if self._supports_condition():
            try:
                stats = self.volumes.client.node_get_volume_stats(
                    remote_id or self.volumes.state.tracker.remote_id(key),
                    self.volumes.target_path(key, alloc_id, plugin_side=True),
                    staging_target_path=(
                        self.volumes.staging_path(key, plugin_side=True)
                        if self.volumes.requires_staging
                        else ""
                    ),
                    timeout=self.volumes.retry.timeout,
                )
            except CSIRPCError as exc:
                fallback = f"mounted and answering (volume condition unavailable: {exc})"
            else:
                cond = stats.volume_condition
                if cond is not None:
                    message = cond.message or ("abnormal" if cond.abnormal else "normal")
                    return verdict(not cond.abnormal, message, CheckMethod.VOLUME_CONDITION)
        return verdict(True, fallback, CheckMethod.MOUNT_CHECK)

    def check_all(self) -> list[VolumeHealth]:
        """Check every claimed (volume, allocation), sorted by key then allocation."""
        results = []
        tracker = self.volumes.state.tracker
        for key, allocs in sorted(tracker.claims().items()):
            for alloc_id in sorted(allocs):
                results.append(
                    self.check(
                        key.volume_id,
                        alloc_id,
                        key.usage,
                        namespace=key.namespace,
                        remote_id=tracker.remote_id(key),
                    )
                )
        return results

    def _supports_condition(self) -> bool:
        try:
            caps = self.volumes.client.node_get_capabilities()
        except CSIRPCError as exc:
            log.info("cannot read node capabilities of %s: %s", self.volumes.plugin.name, exc)
            return False
        return {t.NodeCapability.GET_VOLUME_STATS, t.NodeCapability.VOLUME_CONDITION} <= caps
