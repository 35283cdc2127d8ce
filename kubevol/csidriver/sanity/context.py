"""What the conformance tests share: the configuration from the command line, the driver's
advertised capabilities, and the resources each test creates and must clean up.

Cleanup follows csi-sanity: for everything a test created, in reverse order, NodeUnpublish,
NodeUnstage, ControllerUnpublish, DeleteVolume, DeleteSnapshot. Those calls must answer OK
even for things that were never published or staged (the spec's idempotency), so a failure
there fails the test; NodeUnpublish and NodeUnstage may also answer NOT_FOUND (the spec's
code for a volume that does not exist), as csi-sanity's cleanup accepts.
"""

from __future__ import annotations

import enum
import os
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import attrs
import grpc

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.sanity.inputs import Secrets
from kubevol.mount.mountinfo import parse_mountinfo

T = TypeVar("T")
GiB = 1 << 30


class PathKind(enum.StrEnum):
    """What is at a path, in csi-sanity's check-command words."""

    FILE = "file"
    DIRECTORY = "directory"
    NOT_FOUND = "not_found"
    OTHER = "other"


@attrs.frozen(kw_only=True)
class PathCommands:
    """csi-sanity's path hooks, for drivers whose paths live elsewhere (in a container).

    A create command is called with the suggested path and prints the path to use; a remove
    command is called with that path; the check command prints one of :class:`PathKind`'s
    words. Empty: the suite works on the paths itself.
    """

    create_mount: str = ""
    create_staging: str = ""
    remove_mount: str = ""
    remove_staging: str = ""
    check: str = ""
    create_timeout: float = 10.0
    remove_timeout: float = 10.0
    check_timeout: float = 10.0

    def run(self, command: str, path: str, timeout: float) -> str:
        """``command path``; its stripped standard output. AssertionError when it fails."""
        try:
            proc = subprocess.run(
                [command, path], capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AssertionError(f"path command {command} {path} failed: {exc}") from exc
        if proc.returncode != 0:
            raise AssertionError(
                f"path command {command} {path} exited {proc.returncode}: {proc.stderr.strip()}"
            )
        return proc.stdout.strip()

    def create(self, command: str, suggested: str) -> str:
        """Make a directory: with ``command`` (the path it prints), else ``mkdir -p``."""
        if command:
            made = self.run(command, suggested, self.create_timeout)
            assert made, f"path command {command} printed no path"
            return made
        os.makedirs(suggested, exist_ok=True)
        return suggested

    def remove(self, command: str, path: str) -> None:
        """Remove a directory the suite made: with ``command``, else only if it holds
        nothing but empty directories and no mount (a leftover stays for the user to see)."""
        if command:
            self.run(command, path, self.remove_timeout)
        elif _only_empty_dirs(path):
            shutil.rmtree(path, ignore_errors=True)

    @property
    def can_check(self) -> bool:
        """Whether the suite can tell what is at a target: on its own paths, or with a
        check command (csi-sanity skips such checks when paths are made by a command and no
        check command is given)."""
        return bool(self.check) or not self.create_mount

    def kind(self, path: str) -> PathKind:
        """What is at ``path`` (through the check command when there is one)."""
        if self.check:
            word = self.run(self.check, path, self.check_timeout)
            try:
                return PathKind(word)
            except ValueError:
                raise AssertionError(
                    f"path command {self.check} printed {word!r}; expected one of "
                    f"{', '.join(k.value for k in PathKind)}"
                ) from None
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return PathKind.NOT_FOUND
        if stat.S_ISDIR(mode):
            return PathKind.DIRECTORY
        if stat.S_ISREG(mode) or stat.S_ISBLK(mode):
            return PathKind.FILE
        return PathKind.OTHER


@attrs.frozen(kw_only=True)
class SanityConfig:
    """The suite's settings (see :mod:`kubevol.csidriver.sanity.plugin` for the options)."""

    endpoint: str
    controller_endpoint: str = ""
    staging_dir: str = ""
    mount_dir: str = ""
    volume_size: int = 10 * GiB
    expand_size: int = 0
    access_type: str = "mount"
    secrets: Secrets = attrs.field(factory=Secrets)
    parameters: Mapping[str, str] = attrs.field(factory=dict)
    snapshot_parameters: Mapping[str, str] = attrs.field(factory=dict)
    mutable_parameters: Mapping[str, str] = attrs.field(factory=dict)
    idempotent_count: int = 10
    timeout: float = 60.0
    test_node_volume_attach_limit: bool = False
    path_commands: PathCommands = attrs.field(factory=PathCommands)

    @property
    def expanded_size(self) -> int:
        """The size expansion tests ask for (csi-sanity's default: one GiB more)."""
        return self.expand_size or self.volume_size + GiB


class SanityContext:
    """Clients of the driver under test and its (cached) capabilities, for one session."""

    def __init__(self, config: SanityConfig) -> None:
        self.config = config
        self.client = CSIClient(config.endpoint, timeout=config.timeout)
        self.controller = (
            CSIClient(config.controller_endpoint, timeout=config.timeout)
            if config.controller_endpoint
            else self.client
        )
        self._made_dirs: list[str] = []
        self.staging_root = config.staging_dir or self._temp_dir("staging")
        self.mount_root = config.mount_dir or self._temp_dir("mount")
        for root in (self.staging_root, self.mount_root):
            os.makedirs(root, exist_ok=True)
        self.plugin_caps = self.client.get_plugin_capabilities()
        self.has_controller_service = (
            t.PluginServiceType.CONTROLLER_SERVICE in self.plugin_caps.services
        )
        self.controller_caps = (
            self.controller.controller_get_capabilities()
            if self.has_controller_service
            else frozenset()
        )
        self.node_caps = self.client.node_get_capabilities()
        self.node_info = self.client.node_get_info()
        self.node_id = self.node_info.node_id

    def _temp_dir(self, kind: str) -> str:
        path = tempfile.mkdtemp(prefix=f"csi-sanity-{kind}-")
        self._made_dirs.append(path)
        return path

    def close(self) -> None:
        """Close the clients and remove the directories the suite made (if now empty of
        anything but empty directories)."""
        self.client.close()
        self.controller.close()
        for path in self._made_dirs:
            shutil.rmtree(path, ignore_errors=True)

    # --- requests ---------------------------------------------------------------------

    def capability(
        self, mode: t.AccessMode = t.AccessMode.SINGLE_NODE_WRITER
    ) -> t.VolumeCapability:
        """The capability under test (``--csi-access-type``) with ``mode``."""
        if self.config.access_type == "block":
            return t.VolumeCapability.block(mode)
        return t.VolumeCapability.mount(mode)

    def secrets(self, rpc: str) -> dict[str, str]:
        """The secrets to send with ``rpc``."""
        return self.config.secrets.for_rpc(rpc)

    @property
    def stages(self) -> bool:
        """Whether the node advertises STAGE_UNSTAGE_VOLUME."""
        return t.NodeCapability.STAGE_UNSTAGE_VOLUME in self.node_caps

    @property
    def attaches(self) -> bool:
        """Whether the controller advertises PUBLISH_UNPUBLISH_VOLUME."""
        return t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME in self.controller_caps

    def topology_requirement(self) -> t.TopologyRequirement | None:
        """A requirement for this node's topology when NodeGetInfo reports one (csi-sanity
        asks for it when creating lifecycle volumes), else None."""
        topology = self.node_info.accessible_topology
        if topology is None:
            return None
        return t.TopologyRequirement(requisite=(topology,))

    def path_kind(self, path: str) -> PathKind:
        """What is at ``path``, through the check command when one is configured."""
        return self.config.path_commands.kind(path)


def unique_name(prefix: str) -> str:
    """A name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def repeat(count: int, call: Callable[[], T]) -> T:
    """Call ``call`` ``count`` times (at least once) and require every answer to be equal:
    the idempotency the spec demands of mutating RPCs."""
    first = call()
    for i in range(1, count):
        again = call()
        assert again == first, f"call {i + 1} answered {again!r}, the first {first!r}"
    return first


@attrs.define
class Publication:
    """A NodePublishVolume the cleanup must undo (also one that may have half happened)."""

    volume_id: str
    target: str


class Resources:
    """What one test created, torn down in reverse order by :meth:`cleanup`."""

    def __init__(self, ctx: SanityContext, test_id: str) -> None:
        self.ctx = ctx
        self.volumes: list[str] = []
        self.snapshots: list[str] = []
        self.groups: list[tuple[str, tuple[str, ...]]] = []
        self.attachments: list[tuple[str, str]] = []
        self.stagings: list[tuple[str, str]] = []
        self.publications: list[Publication] = []
        safe = "".join(c if c.isalnum() else "-" for c in test_id)[-80:]
        commands = ctx.config.path_commands
        self.staging_path = commands.create(
            commands.create_staging, os.path.join(ctx.staging_root, safe)
        )
        self.target_parent = commands.create(
            commands.create_mount, os.path.join(ctx.mount_root, safe)
        )

    @property
    def target_path(self) -> str:
        """``<mount dir>/<test>/target``: the driver creates it and must remove it."""
        return os.path.join(self.target_parent, "target")

    # --- creating, with cleanup registered ---------------------------------------------

    def create_volume(
        self, name: str | None = None, *, size: int | None = None, **kwargs: Any
    ) -> t.Volume:
        """CreateVolume with the test capability, size and parameters (overridable)."""
        ctx = self.ctx
        kwargs.setdefault("parameters", ctx.config.parameters)
        kwargs.setdefault("secrets", ctx.secrets("CreateVolume"))
        caps = kwargs.pop("capabilities", [ctx.capability()])
        kwargs.setdefault("accessibility_requirements", ctx.topology_requirement())
        rng = t.CapacityRange(required_bytes=ctx.config.volume_size if size is None else size)
        kwargs.setdefault("capacity_range", rng)
        vol = ctx.controller.create_volume(name or unique_name("sanity"), caps, **kwargs)
        if vol.volume_id not in self.volumes:
            self.volumes.append(vol.volume_id)
        return vol

    def create_snapshot(self, volume_id: str, name: str | None = None) -> t.Snapshot:
        """CreateSnapshot of ``volume_id`` with the snapshot parameters."""
        snap = self.ctx.controller.create_snapshot(
            volume_id,
            name or unique_name("snap"),
            secrets=self.ctx.secrets("CreateSnapshot"),
            parameters=self.ctx.config.snapshot_parameters,
        )
        if snap.snapshot_id not in self.snapshots:
            self.snapshots.append(snap.snapshot_id)
        return snap

    def attach(self, volume_id: str, cap: t.VolumeCapability | None = None) -> dict[str, str]:
        """ControllerPublishVolume to the driver's node when it attaches; else ``{}``."""
        if not self.ctx.attaches:
            return {}
        ctx = self.ctx
        self.attachments.append((volume_id, ctx.node_id))
        return ctx.controller.controller_publish_volume(
            volume_id,
            ctx.node_id,
            cap or ctx.capability(),
            secrets=ctx.secrets("ControllerPublishVolume"),
        )

    def stage(
        self,
        volume_id: str,
        publish_context: Mapping[str, str],
        cap: t.VolumeCapability | None = None,
    ) -> None:
        """NodeStageVolume at this test's staging path when the node stages."""
        if not self.ctx.stages:
            return
        self.stagings.append((volume_id, self.staging_path))
        self.ctx.client.node_stage_volume(
            volume_id,
            self.staging_path,
            cap or self.ctx.capability(),
            publish_context=publish_context,
            secrets=self.ctx.secrets("NodeStageVolume"),
        )

    def publish(
        self,
        volume_id: str,
        publish_context: Mapping[str, str],
        target: str | None = None,
        cap: t.VolumeCapability | None = None,
    ) -> str:
        """NodePublishVolume at ``target`` (default: this test's target path)."""
        where = target or self.target_path
        self.publications.append(Publication(volume_id, where))
        self.ctx.client.node_publish_volume(
            volume_id,
            where,
            cap or self.ctx.capability(),
            staging_target_path=self.staging_path if self.ctx.stages else "",
            publish_context=publish_context,
            secrets=self.ctx.secrets("NodePublishVolume"),
        )
        return where

    def make_available(self, volume_id: str, cap: t.VolumeCapability | None = None) -> str:
        """Attach, stage and publish (with ``cap``, default the test capability); returns
        the target path."""
        context = self.attach(volume_id, cap)
        self.stage(volume_id, context, cap)
        return self.publish(volume_id, context, cap=cap)

    # --- teardown --------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Tear everything down (csi-sanity's order); returns the calls that failed."""
        ctx = self.ctx
        problems: list[str] = []
        cc = ctx.controller
        calls: list[tuple[str, Callable[[], object]]] = []
        calls += [
            (f"NodeUnpublishVolume({p.volume_id}, {p.target})",
             partial(ctx.client.node_unpublish_volume, p.volume_id, p.target))
            for p in reversed(self.publications)
        ]  # fmt: skip
        calls += [
            (f"NodeUnstageVolume({vid}, {path})",
             partial(ctx.client.node_unstage_volume, vid, path))
            for vid, path in reversed(self.stagings)
        ]  # fmt: skip
        calls += [
            (f"ControllerUnpublishVolume({vid}, {node})",
             partial(cc.controller_unpublish_volume, vid, node,
                     secrets=ctx.secrets("ControllerUnpublishVolume")))
            for vid, node in reversed(self.attachments)
        ]  # fmt: skip
        calls += [
            (f"DeleteVolumeGroupSnapshot({gid})",
             partial(cc.delete_volume_group_snapshot, gid, members,
                     secrets=ctx.secrets("DeleteVolumeGroupSnapshot")))
            for gid, members in reversed(self.groups)
        ]  # fmt: skip
        calls += [
            (f"DeleteSnapshot({sid})",
             partial(cc.delete_snapshot, sid, secrets=ctx.secrets("DeleteSnapshot")))
            for sid in reversed(self.snapshots)
        ]  # fmt: skip
        calls += [
            (f"DeleteVolume({vid})",
             partial(cc.delete_volume, vid, secrets=ctx.secrets("DeleteVolume")))
            for vid in reversed(self.volumes)
        ]  # fmt: skip
        for what, call in calls:
            try:
                call()
            except CSIRPCError as exc:
                if exc.code is grpc.StatusCode.NOT_FOUND and what.startswith("NodeUn"):
                    continue
                problems.append(f"{what}: {exc.code.name}: {exc.message}")
        commands = ctx.config.path_commands
        for command, path in (
            (commands.remove_mount, self.target_parent),
            (commands.remove_staging, self.staging_path),
        ):
            try:
                commands.remove(command, path)
            except AssertionError as exc:
                problems.append(str(exc))
        return problems


def _only_empty_dirs(path: str) -> bool:
    """True when ``path`` holds nothing but directories and nothing is mounted inside it:
    safe to remove. A leftover file or mount stays for the user to see."""
    for _, _, files in os.walk(path):
        if files:
            return False
    prefix = os.path.realpath(path).rstrip("/") + "/"
    return not any(e.mount_point.startswith(prefix) for e in parse_mountinfo())
