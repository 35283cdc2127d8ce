"""Staging and publishing volumes through one node plugin (Nomad's ``volumeManager``).

Paths, under the plugin's mount root (the host path; the plugin is sent the same layout
under the root as it sees it)::

    <root>/staging/<namespace>/<volume>/<usage>      NodeStageVolume's staging_target_path
    <root>/per-alloc/<alloc>/<volume>/<usage>        NodePublishVolume's target_path

where ``<usage>`` is :meth:`UsageOptions.to_fs`. NodeStage/NodeUnstage run only when the
plugin advertised STAGE_UNSTAGE_VOLUME. Each call is skipped when its host path is already
a (healthy) mount point, so a mount after an agent restart is idempotent. One operation
runs at a time per volume. RPCs failing with a retryable status are retried with
exponential backoff until :data:`DEFAULT_MOUNT_ACTION_TIMEOUT` is spent, and never after
the plugin's instance was shut down.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import attrs

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import RETRYABLE_CODES, CSIRPCError, StatusCode
from kubevol.errors import MountError, UncertainProgressError
from kubevol.layout import validate_path_segment
from kubevol.mount.helpers import is_corrupted_mount
from kubevol.mount.interface import MountInterface
from kubevol.nomad.claims import (
    ALLOC_DIR_NAME,
    DEFAULT_NAMESPACE,
    STAGING_DIR_NAME,
    UsageTracker,
    VolumeKey,
)
from kubevol.nomad.errors import (
    ExpansionNotSupportedError,
    ManagerShutdownError,
    VolumeNotPublishedError,
)
from kubevol.nomad.interface import NodeController
from kubevol.nomad.registry import RegisteredPlugin
from kubevol.nomad.types import (
    AttachmentMode,
    CSIVolume,
    MountInfo,
    NodeEvent,
    TriggerNodeEvent,
    UsageOptions,
)
from kubevol.util.backoff import Backoff
from kubevol.util.keyedlocks import KeyedLocks

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Time budget of one stage, publish, unpublish or unstage, retries included (seconds).
DEFAULT_MOUNT_ACTION_TIMEOUT = 120.0



@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How long and how often volume RPCs are retried."""

    timeout: float = DEFAULT_MOUNT_ACTION_TIMEOUT
    backoff: Backoff = attrs.field(factory=lambda: Backoff(initial=0.1, maximum=5.0))
    retryable: frozenset[StatusCode] = RETRYABLE_CODES


@attrs.frozen(kw_only=True)
class PluginVolumeState:
    """What outlives one plugin instance: the usage claims and the per-volume lock of a
    plugin name, shared by every :class:`VolumeManager` of that plugin."""

    tracker: UsageTracker
    #: One operation at a time per ``(namespace, volume id)`` (Nomad's ``serializedOp``).
    serializer: KeyedLocks[tuple[str, str]] = attrs.field(factory=KeyedLocks)


def volume_key(namespace: str, volume_id: str, usage: UsageOptions) -> VolumeKey:
    """The tracker key of a volume in one usage (segments validated)."""
    return VolumeKey(
        namespace=validate_path_segment(namespace, "volume namespace"),
        volume_id=validate_path_segment(volume_id, "volume id"),
        usage=usage.to_fs(),
    )


class VolumeManager(NodeController):
    """Mounts, unmounts and expands volumes of one node plugin instance. Thread-safe.

    Obtain it from :meth:`kubevol.nomad.CSIManager.mounter_for_plugin`. Failures
    raise :class:`~kubevol.csi.errors.CSIRPCError` (or its uncertain variant) for a call
    the plugin refused, :class:`~kubevol.errors.MountError` for a host path that cannot be
    prepared or cleaned, :class:`~kubevol.nomad.errors.ManagerStateError` when a
    claim cannot be persisted and :class:`~kubevol.nomad.errors.ManagerShutdownError`
    once the instance is shut down. Logs go to ``logger`` (default: this module's).
    """

    def __init__(
        self,
        plugin: RegisteredPlugin,
        client: CSIClient,
        *,
        requires_staging: bool,
        state: PluginVolumeState,
        mounter: MountInterface,
        cancel: threading.Event | None = None,
        trigger_node_event: TriggerNodeEvent | None = None,
        retry: RetryPolicy | None = None,
        node_id: str = "",
        logger: logging.Logger | None = None,
    ) -> None:
        self.plugin = plugin
        self._requires_staging = requires_staging
        self._node_id = node_id
        self._log = logger if logger is not None else log
        self.state = state
        self._client = client
        self._mounter = mounter
        self._cancel = cancel or threading.Event()
        self._trigger_node_event = trigger_node_event
        self.retry = retry or RetryPolicy()

    @property
    def requires_staging(self) -> bool:
        """Whether the plugin advertised STAGE_UNSTAGE_VOLUME (volumes are staged)."""
        return self._requires_staging

    @property
    def node_id(self) -> str:
        """The plugin's id of this node, from NodeGetInfo (empty when unknown)."""
        return self._node_id

    @property
    def client(self) -> CSIClient:
        """The client this mounter talks to the plugin with (closed on instance shutdown)."""
        return self._client

    @property
    def cancelled(self) -> threading.Event:
        """Set once the plugin instance is shut down."""
        return self._cancel

    # --- paths ----------------------------------------------------------------------

    def staging_path(self, key: VolumeKey, *, plugin_side: bool = False) -> str:
        """``<root>/staging/<namespace>/<volume>/<usage>`` (host side unless ``plugin_side``)."""
        root = self.plugin.plugin_root if plugin_side else self.plugin.mount_root
        return os.path.join(root, STAGING_DIR_NAME, key.namespace, key.volume_id, key.usage)

    def target_path(self, key: VolumeKey, alloc_id: str, *, plugin_side: bool = False) -> str:
        """``<root>/per-alloc/<alloc>/<volume>/<usage>`` (host side unless ``plugin_side``)."""
        validate_path_segment(alloc_id, "allocation id")
        root = self.plugin.plugin_root if plugin_side else self.plugin.mount_root
        return os.path.join(root, ALLOC_DIR_NAME, alloc_id, key.volume_id, key.usage)

    # --- mount ----------------------------------------------------------------------

    def mount_volume(
        self,
        volume: CSIVolume,
        alloc_id: str,
        usage_options: UsageOptions,
        publish_context: Mapping[str, str] | None = None,
    ) -> MountInfo:
        """Stage (when the plugin needs it) and publish ``volume`` for ``alloc_id``.

        The allocation's claim is recorded first, so a concurrent unmount of another
        allocation cannot unstage the volume under it. A final failure drops a claim this
        call added; an uncertain one (or a shutdown) keeps it until
        :meth:`unmount_volume`. Idempotent: steps whose path is already mounted are skipped.
        """
        key = volume_key(volume.namespace, volume.id, usage_options)
        validate_path_segment(alloc_id, "allocation id")
        try:
            with self._alone(key):
                new_claim = self.state.tracker.claim(alloc_id, key, volume.external_id)
                try:
                    if self.requires_staging:
                        self._stage(volume, key, usage_options, publish_context)
                    info = self._publish(volume, key, alloc_id, usage_options, publish_context)
                except BaseException as exc:
                    # A call that may have taken effect keeps the claim: the volume may be
                    # published for this allocation, and must not be unstaged under it
                    # until the allocation's unmount says so.
                    if new_claim and not _may_have_progressed(exc):
                        self.state.tracker.free(alloc_id, key)
                    raise
        except Exception as exc:
            self._event("Mount volume", volume.id, alloc_id, exc)
            raise
        self._event("Mount volume", volume.id, alloc_id, None)
        return info

    def _stage(
        self,
        volume: CSIVolume,
        key: VolumeKey,
        usage: UsageOptions,
        publish_context: Mapping[str, str] | None,
    ) -> None:
        host_path = self.staging_path(key)
        _make_dirs(host_path)
        if self._mounted(host_path):
            self._log.debug("re-using staged volume at %s", host_path)
            return
        capability = usage.capability(volume.mount_options)
        plugin_path = self.staging_path(key, plugin_side=True)
        self._call(
            "NodeStageVolume",
            lambda timeout: self._client.node_stage_volume(
                volume.external_id,
                plugin_path,
                capability,
                publish_context=publish_context,
                secrets=volume.secrets,
                volume_context=volume.context,
                timeout=timeout,
            ),
        )

    def _publish(
        self,
        volume: CSIVolume,
        key: VolumeKey,
        alloc_id: str,
        usage: UsageOptions,
        publish_context: Mapping[str, str] | None,
    ) -> MountInfo:
        host_target = self.target_path(key, alloc_id)
        info = MountInfo(
            source=host_target, is_device=usage.attachment_mode is AttachmentMode.BLOCK_DEVICE
        )
        # The plugin creates the target itself (file or directory); its parent is ours.
        _make_dirs(os.path.dirname(host_target))
        if self._mounted(host_target):
            self._log.debug("re-using published volume at %s", host_target)
            return info
        capability = usage.capability(volume.mount_options)
        staging = self.staging_path(key, plugin_side=True) if self.requires_staging else ""
        plugin_target = self.target_path(key, alloc_id, plugin_side=True)
        self._call(
            "NodePublishVolume",
            lambda timeout: self._client.node_publish_volume(
                volume.external_id,
                plugin_target,
                capability,
                staging_target_path=staging,
                readonly=usage.read_only,
                publish_context=publish_context,
                secrets=volume.secrets,
                volume_context=volume.context,
                timeout=timeout,
            ),
        )
        return info

    # --- unmount --------------------------------------------------------------------

    def unmount_volume(
        self,
        volume_id: str,
        remote_id: str,
        alloc_id: str,
        usage_options: UsageOptions,
        *,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        """Unpublish ``volume_id`` for ``alloc_id``; unstage it when no allocation is left.

        The claim is freed only after the unpublish succeeded (the target is no longer
        mounted). Idempotent: a volume already unpublished or unstaged is success.
        ``remote_id`` is the plugin's id of the volume (``volume_id`` when empty).
        """
        key = volume_key(namespace, volume_id, usage_options)
        validate_path_segment(alloc_id, "allocation id")
        external = remote_id or volume_id
        try:
            with self._alone(key):
                self._unpublish(external, key, alloc_id)
                last = self.state.tracker.free(alloc_id, key)
                if last and self.requires_staging:
                    self._unstage(external, key)
        except Exception as exc:
            self._event("Unmount volume", volume_id, alloc_id, exc)
            raise
        self._event("Unmount volume", volume_id, alloc_id, None)

    def _unpublish(self, external_id: str, key: VolumeKey, alloc_id: str) -> None:
        host_target = self.target_path(key, alloc_id)
        plugin_target = self.target_path(key, alloc_id, plugin_side=True)
        rpc_error = self._call_ignoring_not_found(
            "NodeUnpublishVolume",
            lambda timeout: self._client.node_unpublish_volume(
                external_id, plugin_target, timeout=timeout
            ),
        )
        # The host path is the truth: once nothing is mounted there, the allocation no
        # longer uses the volume, whatever the plugin answered.
        if self._mounted(host_target):
            if rpc_error is not None:
                raise rpc_error
            raise MountError(f"{host_target!r} is still mounted after NodeUnpublishVolume")
        _remove_empty(host_target)
        _remove_empty_parents(host_target, self.plugin.mount_root)
        if rpc_error is not None:
            self._log.warning(
                "NodeUnpublishVolume failed but %s is unmounted: %s", host_target, rpc_error
            )

    def _unstage(self, external_id: str, key: VolumeKey) -> None:
        host_path = self.staging_path(key)
        plugin_path = self.staging_path(key, plugin_side=True)
        rpc_error = self._call_ignoring_not_found(
            "NodeUnstageVolume",
            lambda timeout: self._client.node_unstage_volume(
                external_id, plugin_path, timeout=timeout
            ),
        )
        if rpc_error is not None:
            raise rpc_error
        if self._mounted(host_path):
            raise MountError(f"{host_path!r} is still mounted after NodeUnstageVolume")
        _remove_empty(host_path)
        _remove_empty_parents(host_path, self.plugin.mount_root)

    # --- expand ---------------------------------------------------------------------

    def expand_volume(
        self,
        volume_id: str,
        remote_id: str,
        alloc_id: str,
        usage_options: UsageOptions,
        capacity: t.CapacityRange,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        secrets: Mapping[str, str] | None = None,
    ) -> int:
        """NodeExpandVolume on the volume as ``alloc_id`` has it published, for online
        expansion after the controller grew it (Nomad's ``VolumeManager.ExpandVolume``).

        Sends the plugin-side target path, the staging path when the plugin stages, the
        usage's capability and ``capacity``; returns the capacity the plugin reports (0:
        not said). Raises :class:`~kubevol.nomad.errors.ExpansionNotSupportedError` when
        the plugin does not advertise EXPAND_VOLUME,
        :class:`~kubevol.nomad.errors.VolumeNotPublishedError` when the volume is not
        mounted for ``alloc_id``, ``CSIRPCError`` when the plugin refuses (OUT_OF_RANGE: the
        controller has not grown it that far). Retried like the mount calls; serialised
        with them per volume.
        """
        key = volume_key(namespace, volume_id, usage_options)
        validate_path_segment(alloc_id, "allocation id")
        external = remote_id or volume_id
        try:
            caps = self._client.node_get_capabilities(timeout=self.retry.timeout)
            if t.NodeCapability.EXPAND_VOLUME not in caps:
                raise ExpansionNotSupportedError(
                    f"plugin {self.plugin.name!r} does not offer NodeExpandVolume "
                    "(no EXPAND_VOLUME node capability)"
                )
            with self._alone(key):
                host_target = self.target_path(key, alloc_id)
                if not self.has_mount_at(host_target):
                    raise VolumeNotPublishedError(
                        f"volume {volume_id!r} is not mounted for allocation {alloc_id!r} "
                        f"at {host_target}"
                    )
                staging = self.staging_path(key, plugin_side=True) if self.requires_staging else ""
                plugin_target = self.target_path(key, alloc_id, plugin_side=True)
                size = self._call(
                    "NodeExpandVolume",
                    lambda timeout: self._client.node_expand_volume(
                        external,
                        plugin_target,
                        capacity_range=capacity,
                        staging_target_path=staging,
                        capability=usage_options.capability(),
                        secrets=secrets,
                        timeout=timeout,
                    ),
                )
        except Exception as exc:
            self._event("Expand volume", volume_id, alloc_id, exc)
            raise
        self._event("Expand volume", volume_id, alloc_id, None)
        return size

    # --- helpers --------------------------------------------------------------------

    def has_mount(self, info: MountInfo) -> bool:
        """Whether ``info.source`` is (still) a healthy mount point (Nomad's ``HasMount``)."""
        return self.has_mount_at(info.source)

    def has_mount_at(self, path: str) -> bool:
        """Whether ``path`` is a mount point whose filesystem answers."""
        return self._mounter.is_mount_point(path) and not is_corrupted_mount(path)

    def _mounted(self, path: str) -> bool:
        """Whether ``path`` is a healthy mount point. A corrupted mount (its filesystem no
        longer answers) is unmounted first and counts as not mounted, so the call that
        made it runs again instead of handing out a dead mount."""
        # Corruption first: lstat of a dead FUSE mount point fails too, so an existence
        # check would call it missing and the plugin would trip over it.
        if is_corrupted_mount(path):
            self._log.warning("unmounting corrupted mount at %s before mounting again", path)
            self._mounter.unmount(path)
        if not os.path.lexists(path):
            return False
        return self._mounter.is_mount_point(path)

    def _call(self, name: str, call: Callable[[float], T]) -> T:
        """Run ``call(timeout)`` with retries within the policy's time budget."""
        deadline = time.monotonic() + self.retry.timeout
        attempt = 0
        while True:
            if self._cancel.is_set():
                raise ManagerShutdownError(f"{name} not started: plugin instance shut down")
            try:
                return call(max(0.001, deadline - time.monotonic()))
            except CSIRPCError as exc:
                if self._cancel.is_set():
                    raise ManagerShutdownError(
                        f"{name} interrupted by shutdown (it may have taken effect): {exc}"
                    ) from exc
                delay = self.retry.backoff.delay(attempt)
                if exc.code not in self.retry.retryable or time.monotonic() + delay >= deadline:
                    raise
                self._log.info("%s failed (%s); retrying in %.2fs", name, exc.code.name, delay)
                attempt += 1
                if self._cancel.wait(delay):
                    raise ManagerShutdownError(
                        f"{name} abandoned: plugin instance shut down while retrying"
                    ) from exc

    @contextlib.contextmanager
    def _alone(self, key: VolumeKey) -> Iterator[None]:
        """Run the ``with`` body as the only operation on the volume of ``key``; raises
        :class:`ManagerShutdownError`, without running it, when the instance shuts down
        before the volume is free."""
        volume = (key.namespace, key.volume_id)
        if not self.state.serializer.acquire(volume, cancel=self._cancel):
            raise ManagerShutdownError(f"operation on volume {volume!r} cancelled")
        try:
            yield
        finally:
            self.state.serializer.release(volume)

    def _call_ignoring_not_found(
        self, name: str, call: Callable[[float], None]
    ) -> CSIRPCError | None:
        """Run an undo call: NOT_FOUND is success, another refusal is returned (the caller
        decides from the host path), shutdown still raises."""
        try:
            self._call(name, call)
        except CSIRPCError as exc:
            if exc.code is StatusCode.NOT_FOUND:
                return None
            return exc
        return None

    def _event(
        self, message: str, volume_id: str, alloc_id: str, err: BaseException | None
    ) -> None:
        if self._trigger_node_event is None:
            return
        details = {
            "plugin": self.plugin.name,
            "volume_id": volume_id,
            "alloc_id": alloc_id,
            "success": "true" if err is None else "false",
        }
        if err is not None:
            details["error"] = str(err)
        try:
            self._trigger_node_event(
                NodeEvent(subsystem="Storage", message=message, details=details)
            )
        except Exception:
            self._log.exception("node event callback failed")


def _may_have_progressed(exc: BaseException) -> bool:
    """Whether a failed mount may still have staged or published something."""
    return isinstance(exc, UncertainProgressError | ManagerShutdownError)


def _make_dirs(path: str) -> None:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise MountError(exc.errno, f"cannot create directory {path!r}: {exc.strerror}") from exc


def _remove_empty(path: str) -> None:
    """Remove a directory (or a block target file) that is no longer mounted; never
    recursive, so data under a mount that did not go away stays."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise MountError(
            exc.errno, f"cannot remove {path!r}: {exc.strerror}; left in place"
        ) from exc


def _remove_empty_parents(path: str, root: str) -> None:
    """Remove the now-empty ``<volume>`` and ``<alloc>``/``<namespace>`` directories above
    ``path``; stops at the first one still in use and never touches ``root`` or its
    ``staging``/``per-alloc`` directories."""
    keep = os.path.normpath(root)
    parent = os.path.dirname(path)
    for _ in range(2):
        if os.path.dirname(parent) == keep or parent == keep:
            return
        try:
            os.rmdir(parent)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                return
            raise MountError(exc.errno, f"cannot remove {parent!r}: {exc.strerror}") from exc
        parent = os.path.dirname(parent)
