"""``kubevol nomad``: drive the Nomad-style CSI plugin manager (:mod:`kubevol.nomad`) from
a shell, on the state a node agent would keep under ``--state-dir``.

- ``register --socket SOCK``: register a running CSI plugin (its name and version asked
  from GetPluginInfo unless given); its volumes go under ``--mount-root`` (default
  ``<state-dir>/csi/<node|controller>/<name>``: ``staging/`` and ``per-alloc/``).
- ``status``: every registered plugin with a fresh fingerprint (health, node id,
  capabilities) and its claimed volumes, as ``nomad plugin status`` shows them.
- ``mount PLUGIN VOLUME ALLOC`` / ``unmount PLUGIN VOLUME ALLOC``: what the Nomad client
  does for an allocation's volume: stage once, publish at
  ``<mount-root>/per-alloc/<alloc>/<volume>/<usage>``; unpublish, and unstage after the
  last allocation. Claims persist under ``--state-dir``, so volumes are never unstaged under
  an allocation that still uses them.
- ``expand PLUGIN VOLUME ALLOC --size SIZE``: NodeExpandVolume on a published volume, once
  its controller grew it.
- ``attach VOLUME NODE`` / ``detach VOLUME NODE``: record (or forget) a controller publish
  done elsewhere, with its publish context, under ``<state-dir>/attachments``; ``mount
  --wait-attachment NODE`` waits for it (up to ``--timeout``) and mounts with that context.
- ``deregister NAME``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from kubevol.cli import exits
from kubevol.cli.output import Column, Table, add_output_flags, columns, emit
from kubevol.cli.parser import DURATION, SIZE
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.nomad import (
    AccessMode,
    AttachmentDirectory,
    AttachmentMode,
    CSIInfo,
    CSIManager,
    CSIVolume,
    MountInfo,
    MountOptions,
    MountPropagation,
    PluginRegistry,
    PluginSupervisor,
    PluginTaskConfig,
    PluginType,
    RegisteredPlugin,
    RetryPolicy,
    UsageOptions,
    UsageTracker,
)

T = TypeVar("T")

STATE_ENV = "KUBEVOL_NOMAD_STATE"
DEFAULT_STATE_DIR = "/var/lib/kubevol/nomad"
#: ``--type`` values and the plugin types they name.
TYPES = {"node": PluginType.CSI_NODE, "controller": PluginType.CSI_CONTROLLER}

STATUS_TABLE = Table(
    columns=columns(
        "name",
        "type",
        "health",
        "node_id",
        "provider",
        "version",
        "requires_staging",
        "volumes",
        Column("alloc_id", header="ALLOC", wide=True),
        Column("capabilities", wide=True),
        Column("socket", wide=True),
        Column("mount_root", wide=True),
        Column("description", wide=True),
    ),
    at="plugins",
)
PLUGIN_TABLE = Table(columns=columns("name", "type", "alloc_id", "socket_path", "mount_root"))
MOUNT_TABLE = Table(columns=columns("plugin", "volume", "alloc_id", "path", "is_device"))
EXPAND_TABLE = Table(columns=columns("plugin", "volume", "alloc_id", "capacity_bytes"))


# --- state -----------------------------------------------------------------------------


def _state_dir(args: argparse.Namespace) -> str:
    return os.path.abspath(args.state_dir or os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR)


def _registry(args: argparse.Namespace) -> PluginRegistry:
    return PluginRegistry(os.path.join(_state_dir(args), "registry.json"))


def _with_manager(args: argparse.Namespace, work: Callable[[CSIManager], T]) -> T:
    """Run ``work`` with a manager on the state dir; it shuts down (volumes stay) after."""
    registry = _registry(args)
    manager = CSIManager(
        registry,
        state_dir=_state_dir(args),
        fingerprint_interval=3600,
        resync_period=3600,
        rpc_timeout=args.timeout,
        retry=RetryPolicy(timeout=args.timeout),
    )
    try:
        manager.run()
        return work(manager)
    finally:
        manager.shutdown()
        registry.close()


# --- register / deregister -------------------------------------------------------------


def register(args: argparse.Namespace) -> int:
    socket_path = os.path.abspath(args.socket)
    if args.wait and not _wait_answers(socket_path, args.wait):
        print(f"kubevol nomad register: nothing answers on {socket_path}", file=sys.stderr)
        return exits.FAILED
    with CSIClient(socket_path, timeout=args.timeout) as client:
        info = client.get_plugin_info(timeout=args.timeout)
    name = args.name or info.name
    ptype = TYPES[args.type]
    mount_root = args.mount_root or os.path.join(_state_dir(args), "csi", args.type, name)
    propagation = args.propagation or (
        MountPropagation.BIDIRECTIONAL if args.plugin_mount_root else MountPropagation.PRIVATE
    )
    config = PluginTaskConfig(
        plugin_id=name,
        plugin_type=ptype,
        alloc_id=args.alloc_id,
        mount_root=os.path.abspath(mount_root),
        plugin_mount_root=args.plugin_mount_root,
        socket_path=socket_path,
        version=info.vendor_version,
        options={"provider": info.name},
        mount_propagation=propagation,
    )
    registry = _registry(args)
    try:
        supervisor = PluginSupervisor(config, registry)
        supervisor.prepare()  # the directories; rshared unless the propagation is private
        plugin = supervisor.plugin
        registry.register(plugin)
    finally:
        registry.close()
    for task_mount in supervisor.task_mounts():
        if task_mount.task_path != task_mount.host_path:
            print(
                f"mount {task_mount.host_path} at {task_mount.task_path} in the plugin's task "
                f"with propagation {task_mount.propagation.runtime_name}",
                file=sys.stderr,
            )
        if ptype is PluginType.CSI_NODE and propagation is MountPropagation.HOST_TO_TASK:
            print(
                "warning: with host-to-task propagation a node plugin's mounts stay in its task",
                file=sys.stderr,
            )
    emit(plugin.to_json(), PLUGIN_TABLE, args, sys.stdout)
    return exits.OK


def _wait_answers(socket_path: str, timeout: float) -> bool:
    """Whether a plugin answers a Probe on ``socket_path`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if os.path.exists(socket_path):
            with CSIClient(socket_path, timeout=1) as client:
                try:
                    client.probe(timeout=1)
                    return True
                except CSIRPCError:
                    pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def deregister(args: argparse.Namespace) -> int:
    registry = _registry(args)
    try:
        ptype = TYPES[args.type]
        owners = [args.alloc_id] if args.alloc_id else [
            p.alloc_id for p in registry.instances(ptype, args.name)
        ]
        removed = [registry.deregister(ptype, args.name, owner) for owner in owners]
    finally:
        registry.close()
    if not any(removed):
        print(f"kubevol nomad deregister: no {ptype.value} plugin {args.name!r}", file=sys.stderr)
        return exits.FAILED
    return exits.OK


# --- status ----------------------------------------------------------------------------


def status(args: argparse.Namespace) -> int:
    registry = _registry(args)
    manager = CSIManager(
        registry, fingerprint_interval=3600, resync_period=3600, rpc_timeout=args.timeout
    )
    try:
        manager.run()  # an instance per registered plugin, each fingerprinting at once
        manager.plugin_manager().wait_for_first_fingerprint(args.timeout)
        plugins = [
            plugin
            for ptype in PluginType
            for plugin in registry.list_plugins(ptype).values()
            if not args.names or plugin.name in args.names
        ]
        rows = [
            _status_row(args, plugin, manager.plugin_info(plugin.type, plugin.name))
            for plugin in sorted(plugins, key=_order)
        ]
    finally:
        manager.shutdown()
        registry.close()
    missing = sorted(set(args.names) - {p.name for p in plugins})
    emit({"plugins": rows}, STATUS_TABLE, args, sys.stdout)
    if missing:
        print(f"kubevol nomad status: not registered: {', '.join(missing)}", file=sys.stderr)
        return exits.FAILED
    return exits.OK


def _order(plugin: RegisteredPlugin) -> tuple[str, str]:
    return (plugin.name, plugin.type.value)


def _status_row(
    args: argparse.Namespace, plugin: RegisteredPlugin, info: CSIInfo | None
) -> dict[str, object]:
    if info is None:
        info = CSIInfo(
            plugin_id=plugin.name,
            plugin_type=plugin.type.value,
            alloc_id=plugin.alloc_id,
            health_description=f"no fingerprint within {args.timeout:g}s",
        )
    claims = 0
    if plugin.type is PluginType.CSI_NODE:
        tracker = UsageTracker(os.path.join(_state_dir(args), "usage", f"{plugin.name}.json"))
        claims = sum(len(allocs) for allocs in tracker.claims().values())
    return {
        "name": plugin.name,
        "type": plugin.type.value,
        "alloc_id": plugin.alloc_id,
        "socket": plugin.socket_path,
        "mount_root": plugin.mount_root,
        "provider": info.provider,
        "version": info.provider_version,
        "health": info.health.value,
        "description": info.health_description,
        "node_id": info.node_info.node_id if info.node_info else "",
        "requires_staging": _requires_staging(info),
        "requires_controller": info.requires_controller_plugin,
        "capabilities": _capabilities(info),
        "volumes": claims,
    }


def _requires_staging(info: CSIInfo) -> bool | None:
    return None if info.node_info is None else info.node_info.requires_node_stage_volume


def _capabilities(info: CSIInfo) -> list[str]:
    if info.node_info is not None:
        return sorted(c.name.lower() for c in info.node_info.capabilities)
    if info.controller_info is not None:
        return sorted(c.name.lower() for c in info.controller_info.capabilities)
    return []


# --- mount / unmount / expand ------------------------------------------------------------


def _usage(args: argparse.Namespace) -> UsageOptions:
    options = None
    if args.fs_type or args.mount_flags:
        options = MountOptions(fs_type=args.fs_type, mount_flags=tuple(args.mount_flags))
    return UsageOptions(
        read_only=args.read_only,
        attachment_mode=args.attachment_mode,
        access_mode=args.access_mode,
        mount_options=options,
    )


def mount(args: argparse.Namespace) -> int:
    volume = CSIVolume(
        id=args.volume,
        namespace=args.namespace,
        remote_id=args.remote_id,
        plugin_id=args.plugin,
        context=dict(args.context),
        secrets=dict(args.secrets),
    )
    usage = _usage(args)

    def work(manager: CSIManager) -> MountInfo:
        context = dict(args.publish_context)
        if args.wait_attachment:
            waiter = manager.attachment_waiter(_attachments(args))
            context = {**waiter.wait_for_attachment(volume, args.wait_attachment), **context}
        mounter = manager.mounter_for_plugin(args.plugin, timeout=args.timeout)
        return mounter.mount_volume(volume, args.alloc_id, usage, publish_context=context)

    info = _with_manager(args, work)
    row = {
        "plugin": args.plugin,
        "volume": args.volume,
        "alloc_id": args.alloc_id,
        "path": info.source,
        "is_device": info.is_device,
    }
    emit(row, MOUNT_TABLE, args, sys.stdout)
    return exits.OK


def unmount(args: argparse.Namespace) -> int:
    usage = _usage(args)
    _with_manager(
        args,
        lambda manager: manager.mounter_for_plugin(
            args.plugin, timeout=args.timeout
        ).unmount_volume(
            args.volume, args.remote_id, args.alloc_id, usage, namespace=args.namespace
        ),
    )
    return exits.OK


def expand(args: argparse.Namespace) -> int:
    usage = _usage(args)
    capacity = t.CapacityRange(required_bytes=args.size, limit_bytes=args.limit)
    size = _with_manager(
        args,
        lambda manager: manager.mounter_for_plugin(
            args.plugin, timeout=args.timeout
        ).expand_volume(
            args.volume,
            args.remote_id,
            args.alloc_id,
            usage,
            capacity,
            namespace=args.namespace,
            secrets=dict(args.secrets),
        ),
    )
    row = {
        "plugin": args.plugin,
        "volume": args.volume,
        "alloc_id": args.alloc_id,
        "capacity_bytes": size,
    }
    emit(row, EXPAND_TABLE, args, sys.stdout)
    return exits.OK


def _attachments(args: argparse.Namespace) -> AttachmentDirectory:
    return AttachmentDirectory(os.path.join(_state_dir(args), "attachments"))


def attach(args: argparse.Namespace) -> int:
    volume = CSIVolume(id=args.volume, namespace=args.namespace)
    _attachments(args).record(volume, args.node_id, dict(args.publish_context))
    return exits.OK


def detach(args: argparse.Namespace) -> int:
    _attachments(args).forget(CSIVolume(id=args.volume, namespace=args.namespace), args.node_id)
    return exits.OK


# --- the parser --------------------------------------------------------------------------


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


_pair.__name__ = "KEY=VALUE"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"the agent's state: registry, usage claims, default mount roots "
        f"(default: ${STATE_ENV} or {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "-t", "--timeout", type=DURATION, default=60.0,
        help="how long each step may take: a plugin's answer, a mount (default: 60s)",
    )  # fmt: skip


def _volume_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plugin", help="the node plugin's registered name")
    parser.add_argument("volume", help="the volume's id (a path segment)")
    parser.add_argument("alloc_id", metavar="alloc", help="the allocation's id")
    parser.add_argument(
        "--remote-id", default="", help="the plugin's id of the volume (default: VOLUME)"
    )
    parser.add_argument("--namespace", default="default", help="the volume's namespace")
    parser.add_argument("--read-only", action="store_true", help="a read-only usage")
    parser.add_argument(
        "--access-mode", default=AccessMode.SINGLE_NODE_WRITER.value,
        choices=[m.value for m in AccessMode], help="(default: single-node-writer)",
    )  # fmt: skip
    parser.add_argument(
        "--attachment-mode", default=AttachmentMode.FILE_SYSTEM.value,
        choices=[m.value for m in AttachmentMode], help="(default: file-system)",
    )  # fmt: skip
    parser.add_argument("--fs-type", default="", help="filesystem type for a file-system volume")
    parser.add_argument(
        "--mount-flag", dest="mount_flags", action="append", default=[], metavar="FLAG",
        help="a mount flag (repeat for more)",
    )  # fmt: skip
    parser.add_argument(
        "--secret", dest="secrets", type=_pair, action="append", default=[], metavar="K=V",
        help="a secret sent to the plugin (never printed)",
    )  # fmt: skip
    _common(parser)
    add_output_flags(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    """Configure ``kubevol nomad register|deregister|status|mount|unmount|expand|attach|
    detach``."""
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    verbs = parser.add_subparsers(dest="nomad_command", metavar="COMMAND", required=True)

    reg = verbs.add_parser("register", help="register a running CSI plugin by its socket")
    reg.add_argument("--socket", required=True, help="the plugin's unix socket")
    reg.add_argument("--name", default="", help="the plugin id (default: GetPluginInfo's name)")
    reg.add_argument("--type", choices=sorted(TYPES), default="node", help="(default: node)")
    reg.add_argument(
        "--alloc-id", default="kubevol-cli", help="the id of what runs the plugin "
        "(default: kubevol-cli)",
    )  # fmt: skip
    reg.add_argument(
        "--mount-root", default="",
        help="host directory of its volumes (default: <state-dir>/csi/<type>/<name>)",
    )  # fmt: skip
    reg.add_argument(
        "--plugin-mount-root", default="",
        help="where the plugin sees --mount-root, if elsewhere (a container path)",
    )  # fmt: skip
    reg.add_argument(
        "--propagation", type=MountPropagation, default=None,
        choices=list(MountPropagation), metavar="|".join(MountPropagation),
        help="how the plugin's task mounts --mount-root (default: bidirectional with "
        "--plugin-mount-root, else private); other than private, --mount-root is made an "
        "rshared mount",
    )  # fmt: skip
    reg.add_argument(
        "--wait", type=DURATION, default=0.0,
        help="wait up to this long for the plugin to answer (default: do not wait)",
    )  # fmt: skip
    _common(reg)
    add_output_flags(reg)
    reg.set_defaults(func=register)

    dereg = verbs.add_parser("deregister", help="deregister a plugin")
    dereg.add_argument("name", help="the plugin id")
    dereg.add_argument("--type", choices=sorted(TYPES), default="node", help="(default: node)")
    dereg.add_argument("--alloc-id", default="", help="only this instance (default: all)")
    _common(dereg)
    dereg.set_defaults(func=deregister)

    stat = verbs.add_parser(
        "status", help="registered plugins with their fingerprint and health (nomad plugin status)"
    )
    stat.add_argument("names", nargs="*", metavar="NAME", help="only these plugins")
    _common(stat)
    add_output_flags(stat)
    stat.set_defaults(func=status)

    mnt = verbs.add_parser("mount", help="stage and publish a volume for an allocation")
    _volume_args(mnt)
    mnt.add_argument(
        "--context", type=_pair, action="append", default=[], metavar="K=V",
        help="volume context (repeat for more)",
    )  # fmt: skip
    mnt.add_argument(
        "--publish-context", type=_pair, action="append", default=[], metavar="K=V",
        help="the controller's publish context (repeat for more)",
    )  # fmt: skip
    mnt.add_argument(
        "--wait-attachment", default="", metavar="NODE",
        help="wait (up to --timeout) for the volume's attachment to NODE recorded by "
        "`kubevol nomad attach`, and mount with its publish context",
    )  # fmt: skip
    mnt.set_defaults(func=mount)

    for verb, func, what in (
        ("attach", attach, "record a controller publish done elsewhere (an attacher's result)"),
        ("detach", detach, "forget a recorded attachment"),
    ):
        sub = verbs.add_parser(verb, help=what)
        sub.add_argument("volume", help="the volume's id")
        sub.add_argument("node_id", metavar="node", help="the node's id (the plugin's)")
        sub.add_argument("--namespace", default="default", help="the volume's namespace")
        if verb == "attach":
            sub.add_argument(
                "--publish-context", type=_pair, action="append", default=[], metavar="K=V",
                help="the publish context ControllerPublishVolume returned (repeat for more)",
            )  # fmt: skip
        _common(sub)
        sub.set_defaults(func=func)

    umnt = verbs.add_parser(
        "unmount", help="unpublish a volume for an allocation; unstage it after the last"
    )
    _volume_args(umnt)
    umnt.set_defaults(func=unmount)

    exp = verbs.add_parser("expand", help="NodeExpandVolume on an allocation's volume")
    _volume_args(exp)
    exp.add_argument("--size", type=SIZE, required=True, help="the required size (e.g. 2Gi)")
    exp.add_argument("--limit", type=SIZE, default=0, help="the size limit (default: none)")
    exp.set_defaults(func=expand)
