"""``kubevol driver``: serve a bundled CSI driver, bootstrap a new driver project, or print
version information.

``kubevol driver serve mock|hostpath`` serves until SIGTERM/SIGINT, on ``--endpoint`` (or
``$CSI_ENDPOINT``); the framework's ``X_CSI_*`` variables apply (``-v`` turns request and
response logging on, secrets redacted). ``kubevol driver version`` prints the driver name
and version, git commit, build date, Python version and platform as YAML. ``kubevol driver
e2e`` plays the kubelet against a driver (:mod:`kubevol.testing.e2e`).
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from kubevol.cli import exits
from kubevol.cli.logs import verbosity_level
from kubevol.cli.output import Table, add_output_flags, columns, emit
from kubevol.cli.parser import DURATION, SIZE, plain_text
from kubevol.csi import types as t
from kubevol.csidriver.drivers import mock
from kubevol.csidriver.drivers.common import DEFAULT_NODE_ID, version_info, version_yaml
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME as HOSTPATH_NAME
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.csidriver.drivers.sharedfs import DRIVER_NAME as SHAREDFS_NAME
from kubevol.csidriver.drivers.sharedfs import OnDelete, SharedFSConfig, SharedFSDriver
from kubevol.csidriver.sanity.inputs import Secrets, load_parameters, load_secrets
from kubevol.csidriver.server import StoragePlugin, serve
from kubevol.csidriver.server.bootstrap import (
    DEFAULT_MAX_VOLUME_BYTES,
    BootstrapError,
    write_project,
)
from kubevol.csidriver.server.bootstrap import __doc__ as bootstrap_doc
from kubevol.csidriver.server.config import describe_environment

DEFAULT_STATE_DIR = "/var/lib/kubevol/csi-hostpath"
E2E_HELP = """Play the kubelet against the CSI driver at --endpoint: kubevol's node volume
manager and kubernetes.io/csi plugin, on a private kubelet-style root, run the node-side
patterns of Kubernetes' storage e2e suites (volumes, volume_io, multivolume, volumemode,
volume_expand, subpath, ephemeral, fsgroupchangepolicy, selinuxmount, readwriteoncepod,
volumelimits, topology, disruptive) that apply to what the driver advertises. Each check
names the upstream test it mirrors (--list shows them); a failure shows what the kubelet
sent, what the driver answered, what was expected and why.

Give the driver's CSIDriver object (--csidriver FILE, as its deployment installs it): it
says whether the driver makes inline ephemeral volumes (volumeLifecycleModes), how fsGroup
applies (fsGroupPolicy) and whether volumes are mounted with the pod's SELinux label
(seLinuxMount). Without it the checks that need such an object use fsGroupPolicy File,
and the inline ephemeral and SELinux checks are skipped, saying so.

Needs root, and the driver's mount namespace: with --driver-command the suite starts the
driver itself, both in a private mount namespace (it re-executes itself under
unshare -m --propagation private); otherwise run both in one namespace.

Exit status: 0 every applicable check passed, 1 one failed, 64 usage error."""
DEFAULT_SHAREDFS_STATE_DIR = "/var/lib/kubevol/csi-sharedfs"
DRIVERS = {"mock": mock.DRIVER_NAME, "hostpath": HOSTPATH_NAME, "sharedfs": SHAREDFS_NAME}


#: A CSI capability enum (:mod:`kubevol.csi.types`).
_Cap = TypeVar("_Cap", bound=enum.IntEnum)


def _caps(kind: type[_Cap]) -> Callable[[str], frozenset[_Cap]]:
    def convert(text: str) -> frozenset[_Cap]:
        try:
            return mock.parse_capabilities(kind, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _serve(plugin: StoragePlugin, args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.debug:
        env.setdefault("X_CSI_DEBUG", "true")
    endpoint = args.endpoint or env.get("CSI_ENDPOINT", "")
    if not endpoint:
        print(
            "kubevol driver serve: no endpoint: use --endpoint or set CSI_ENDPOINT", file=sys.stderr
        )
        return exits.USAGE
    return serve(plugin, endpoint, env=env)


def _logging(args: argparse.Namespace) -> None:
    # The main command set up logging (-v, --log-format: its handler and level stay while
    # serving). An explicit -v N is the operator's choice for kubevol's loggers and wins over
    # X_CSI_LOG_LEVEL (kubevol.csidriver.server.logs leaves a level set on "kubevol" alone);
    # without one, X_CSI_LOG_LEVEL applies when set. --debug raises everything to debug.
    verbosity = getattr(args, "verbosity", None)
    if verbosity is not None:
        logging.getLogger("kubevol").setLevel(verbosity_level(verbosity))
    if args.debug:
        logging.getLogger().setLevel(logging.DEBUG)
        logging.getLogger("kubevol").setLevel(logging.DEBUG)


def serve_hostpath(args: argparse.Namespace) -> int:
    _logging(args)
    config = HostPathConfig(
        state_dir=os.path.abspath(args.state_dir or DEFAULT_STATE_DIR),
        node_id=args.node_id,
        driver_name=args.driver_name or HOSTPATH_NAME,
        capacity_bytes=args.capacity,
        max_volume_size=args.max_volume_size,
        enable_attach=args.enable_attach,
        attach_limit=args.attach_limit,
        shared_filesystem=os.path.abspath(args.shared_filesystem) if args.shared_filesystem else "",
        shared_filesystem_size=args.shared_filesystem_size,
        get_snapshot=args.enable_get_snapshot,
    )
    with HostPathDriver(config) as driver:
        return _serve(driver.plugin, args)


def serve_sharedfs(args: argparse.Namespace) -> int:
    _logging(args)
    try:
        config = SharedFSConfig(
            state_dir=os.path.abspath(args.state_dir or DEFAULT_SHAREDFS_STATE_DIR),
            node_id=args.node_id,
            driver_name=args.driver_name or SHAREDFS_NAME,
            source=args.source,
            fstype=args.fstype,
            mount_options=tuple(o for o in args.mount_options.split(",") if o),
            on_delete=args.on_delete,
            timeout=args.timeout,
            share_client=args.share_client,
        )
    except ValueError as exc:
        print(f"kubevol driver serve sharedfs: {exc}", file=sys.stderr)
        return exits.USAGE
    with SharedFSDriver(config) as driver:
        return _serve(driver.plugin, args)


def serve_mock(args: argparse.Namespace) -> int:
    _logging(args)
    defaults = mock.MockConfig()
    config = mock.MockConfig(
        node_id=args.node_id,
        driver_name=args.driver_name or mock.DRIVER_NAME,
        mock_mount=args.mock_mount,
        attach_limit=args.attach_limit,
        capacity_bytes=args.capacity,
        plugin_services=defaults.plugin_services if args.plugin_caps is None else args.plugin_caps,
        controller_caps=(
            defaults.controller_caps if args.controller_caps is None else args.controller_caps
        )
        | ({t.ControllerCapability.GET_SNAPSHOT} if args.enable_get_snapshot else set()),
        node_caps=defaults.node_caps if args.node_caps is None else args.node_caps,
        group_caps=defaults.group_caps if args.group_caps is None else args.group_caps,
    )
    if args.state_dir:
        logging.getLogger(__name__).info("the mock keeps its state in memory; --state-dir unused")
    return _serve(mock.MockDriver(config).plugin, args)


def new_project(args: argparse.Namespace) -> int:
    """``kubevol driver new NAME``: write a driver project (see the bootstrap module)."""
    dest = args.output or args.name
    try:
        written = write_project(
            args.name, dest, driver_name=args.driver_name or "",
            max_volume_bytes=args.max_volume_size,
        )  # fmt: skip
    except BootstrapError as exc:
        print(f"kubevol driver new: {exc}", file=sys.stderr)
        return exits.USAGE
    for path in written:
        print(path)
    print(f"next: cd {dest} && pip install -e '.[test]' && pytest", file=sys.stderr)
    return exits.OK


#: Set in the environment of ``kubevol driver e2e`` re-executed in a mount namespace of its
#: own, so that it does not do it again.
E2E_NAMESPACE_ENV = "KUBEVOL_E2E_OWN_NAMESPACE"


def e2e(args: argparse.Namespace) -> int:
    """``kubevol driver e2e``: the kubelet-in-a-box suite against the driver at --endpoint."""
    from kubevol.testing.e2e import (
        CHECKS,
        DriverProcess,
        E2EConfig,
        E2EError,
        Status,
        run_checks,
        selected,
    )
    from kubevol.testing.e2e.runner import mount_namespace, private_mounts, server_pid
    from kubevol.testing.e2e.session import load_csidriver

    def usage(message: str) -> int:
        print(f"kubevol driver e2e: {message}", file=sys.stderr)
        return exits.USAGE

    try:
        chosen = selected(CHECKS, args.select)
    except ValueError as exc:
        return usage(str(exc))
    if args.list:
        for check in chosen:
            print(f"{check.name}\t{check.mirrors}")
        return exits.OK
    endpoint = args.endpoint or os.environ.get("CSI_ENDPOINT", "")
    if not endpoint:
        return usage("no endpoint: use --endpoint unix:///path/to/csi.sock")
    if os.geteuid() != 0:
        return usage("needs root: it mounts volumes as the kubelet does")
    try:
        config = E2EConfig(
            endpoint=endpoint, volume_size=args.volume_size,
            parameters=load_parameters(args.parameters) if args.parameters else {},
            secrets=load_secrets(args.secrets) if args.secrets else Secrets(),
            mount_options=tuple(o for o in args.mount_options.split(",") if o),
            timeout=args.timeout, work_dir=os.path.abspath(args.work_dir) if args.work_dir
            else "", select=args.select,
            csidriver=load_csidriver(args.csidriver) if args.csidriver else None,
            ephemeral_attributes=load_parameters(args.ephemeral_attributes)
            if args.ephemeral_attributes else {}, mock=args.mock,
        )
    except ValueError as exc:
        return usage(str(exc))
    driver = None
    if args.restart_command:
        own = os.environ.get(E2E_NAMESPACE_ENV) == "1"
        if not own and not private_mounts():
            # The driver is ours to start: both run in a private mount namespace, so that
            # nothing either mounts is seen (or left) outside.
            os.environ[E2E_NAMESPACE_ENV] = "1"
            argv = ["unshare", "-m", "--propagation", "private", sys.executable, "-m",
                    "kubevol.cli.main", *sys.argv[1:]]
            os.execvp(argv[0], argv)
        driver = DriverProcess(args.restart_command, endpoint)
    else:
        pid = server_pid(endpoint)
        try:
            theirs = mount_namespace(pid) if pid else ""
        except OSError:
            theirs = ""  # another PID namespace: nothing to compare
        if theirs and theirs != mount_namespace():
            return usage(
                f"the driver (pid {pid}) runs in another mount namespace: its mounts are not "
                "visible here. Run both in one, e.g. unshare -m --propagation private sh -c "
                "'kubevol driver serve hostpath --endpoint ... & kubevol driver e2e ...', or "
                "give --driver-command")
    try:
        if driver is not None:
            driver.start()
        outcomes = run_checks(config, out=sys.stdout,
                              restart=driver.restart if driver is not None else None)
    except E2EError as exc:
        print(f"kubevol driver e2e: {exc}", file=sys.stderr)
        return exits.FAILED
    finally:
        if driver is not None:
            driver.stop()
    return exits.FAILED if any(o.status is Status.FAILED for o in outcomes) else exits.OK


def version(args: argparse.Namespace) -> int:
    name = DRIVERS.get(args.driver, args.driver)
    if args.output.kind == "yaml":
        sys.stdout.write(version_yaml(name))  # the drivers' own --version text, byte for byte
    else:
        info = version_info(name)
        emit(info, Table(columns=columns(*info)), args, sys.stdout)
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", default=None, help="where to listen (default: $CSI_ENDPOINT)")
    parser.add_argument(
        "--node-id", default=DEFAULT_NODE_ID, help="this node's id (default: host name)"
    )
    parser.add_argument("--driver-name", default=None, help="the name GetPluginInfo reports")
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"where state lives (hostpath default: {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--capacity", type=SIZE, default=100 << 30, help="total capacity (default: 100Gi)"
    )
    parser.add_argument("--attach-limit", type=int, default=0, help="volumes per node, 0: no limit")
    parser.add_argument(
        "--enable-get-snapshot",
        action="store_true",
        help="advertise GET_SNAPSHOT (alpha; upstream csi-sanity rejects it; default: off)",
    )
    parser.add_argument(
        "-v", "--debug", action="store_true", help="debug logging of every request and response"
    )


def _configure_e2e(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``kubevol driver e2e``'s options (csi-sanity's names where they mean the same)."""
    e2e_parser = verbs.add_parser(
        "e2e",
        help="play the kubelet against a driver: the node side of Kubernetes' storage e2e "
        "suites, without a cluster",
        description=plain_text(E2E_HELP),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e2e_parser.add_argument("--endpoint", default=None,
                            help="the driver's endpoint (default: $CSI_ENDPOINT)")
    e2e_parser.add_argument(
        "--csi.testvolumesize", dest="volume_size", type=SIZE, default=64 << 20, metavar="SIZE",
        help="size of the test volumes, bytes or a quantity like 16Mi (default: 64Mi)")
    e2e_parser.add_argument("--csi.testvolumeparameters", dest="parameters", default="",
                            metavar="FILE", help="CreateVolume parameters (YAML)")
    e2e_parser.add_argument(
        "--csi.secrets", dest="secrets", default="", metavar="FILE",
        help="secrets (csi-sanity's YAML: CreateVolumeSecret, NodeStageVolumeSecret, ...; "
        "the node ones reach the driver through the PV's secret references)")
    e2e_parser.add_argument(
        "--csidriver", default="", metavar="FILE",
        help="the driver's CSIDriver object (YAML): volumeLifecycleModes, fsGroupPolicy, "
        "seLinuxMount, podInfoOnMount, attachRequired as the kubelet reads them")
    e2e_parser.add_argument(
        "--ephemeral-attributes", default="", metavar="FILE",
        help="volumeAttributes of the inline ephemeral volumes (YAML mapping)")
    e2e_parser.add_argument(
        "--mock", action="store_true",
        help="the driver mounts nothing and keeps no data (a mock, e.g. 'kubevol driver serve "
        "mock'): run only the checks of what the kubelet sends and the driver answers")
    e2e_parser.add_argument("-k", dest="select", default="", metavar="EXPRESSION",
                            help="run the checks whose names match, e.g. 'subpath or "
                            "disruptive and not block'")
    e2e_parser.add_argument(
        "--driver-command", dest="restart_command", default="", metavar="COMMAND",
        help="a shell command that serves the driver at --endpoint: the suite starts it (in "
        "its own mount namespace) and restarts it for the checks that need it; without it "
        "those are skipped")
    e2e_parser.add_argument(
        "--mount-options", default="nodev,noexec", metavar="OPT[,OPT]",
        help="mountOptions of the PV in the mount options check (default: nodev,noexec; "
        "empty: skipped)")
    e2e_parser.add_argument("--timeout", type=DURATION, default=60.0,
                            help="how long the node side may take to converge per step "
                            "(default: 60s)")
    e2e_parser.add_argument("--work-dir", default="", metavar="DIR",
                            help="where the kubelet roots go (default: a temporary directory, "
                            "removed afterwards)")
    e2e_parser.add_argument("--list", action="store_true",
                            help="list the checks (and the upstream tests they mirror)")
    e2e_parser.set_defaults(func=e2e)


def configure(parser: argparse.ArgumentParser) -> None:
    """Configure ``kubevol driver serve mock|hostpath|sharedfs`` and ``kubevol driver
    version``."""
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    verbs = parser.add_subparsers(dest="driver_command", metavar="COMMAND", required=True)
    env_help = "environment (gocsi's; the defaults apply when unset):\n" + describe_environment()
    serve_parser = verbs.add_parser(
        "serve",
        help="serve a driver until SIGTERM",
        epilog=env_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    drivers = serve_parser.add_subparsers(dest="driver", metavar="DRIVER", required=True)

    hostpath = drivers.add_parser(
        "hostpath",
        help="real volumes under --state-dir, real mounts",
        epilog=env_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(hostpath)
    hostpath.add_argument(
        "--max-volume-size", type=SIZE, default=0, help="largest volume (default: --capacity)"
    )
    hostpath.add_argument(
        "--enable-attach", action="store_true", help="offer ControllerPublish/Unpublish"
    )
    hostpath.add_argument(
        "--shared-filesystem",
        metavar="IMAGE",
        default="",
        help="every volume is a sub-directory of the ext4 filesystem in IMAGE (created if missing)",
    )
    hostpath.add_argument(
        "--shared-filesystem-size",
        type=SIZE,
        default=1 << 30,
        help="size of a new IMAGE (default: 1Gi)",
    )
    hostpath.set_defaults(func=serve_hostpath, daemon=True)

    sharedfs = drivers.add_parser(
        "sharedfs",
        help="sub-directories of a network filesystem (NFS, CephFS, Lustre, GlusterFS)",
        description=(
            "Volumes are sub-directories of a network filesystem mount(8) knows.\n"
            "StorageClass parameters (or a PersistentVolume's volumeAttributes) name it:\n"
            "  source, fstype, mountOptions   (or csi-driver-nfs's server, share; or Azure\n"
            "                                  Lustre's mgs-ip-address, fs-name, sub-dir)\n"
            "  subDir    the volume's sub-directory; ${pvc.metadata.name},\n"
            "            ${pvc.metadata.namespace} and ${pv.metadata.name} are filled in\n"
            "  onDelete  delete, retain or archive\n"
            "NodeStage mounts the filesystem at the staging path; NodePublish binds the\n"
            "sub-directory at the target."
        ),
        epilog=env_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sharedfs.add_argument("--endpoint", default=None,
                          help="where to listen (default: $CSI_ENDPOINT)")
    sharedfs.add_argument(
        "--node-id", default=DEFAULT_NODE_ID, help="this node's id (default: host name)"
    )
    sharedfs.add_argument("--driver-name", default=None, help="the name GetPluginInfo reports")
    sharedfs.add_argument(
        "--state-dir", default=None,
        help=f"where the driver's records and work mounts live "
             f"(default: {DEFAULT_SHAREDFS_STATE_DIR})",
    )
    sharedfs.add_argument(
        "--source", default="",
        help="the filesystem of volumes whose parameters name none, e.g. nfs1:/export, "
             "10.0.0.4@tcp:/lustrefs, gluster1:/vol (with --fstype)",
    )
    sharedfs.add_argument("--fstype", default="",
                          help="its type: nfs, nfs4, ceph, lustre, glusterfs, ...")
    sharedfs.add_argument("--mount-options", default="",
                          help="its mount options, comma-separated")
    sharedfs.add_argument(
        "--on-delete", choices=[o.value for o in OnDelete], default=OnDelete.DELETE.value,
        help="what DeleteVolume does with a sub-directory unless its onDelete says "
             "(default: delete)",
    )
    sharedfs.add_argument(
        "--timeout", type=float, default=10.0,
        help="seconds a call below a mount may take before the volume is reported "
             "abnormal (default: 10)",
    )
    sharedfs.add_argument(
        "--share-client", action=argparse.BooleanOptionalAction, default=True,
        help="stage further volumes of a filesystem by binding an existing staging mount "
             "of it: one client, one device for all (default: on)",
    )
    sharedfs.add_argument(
        "-v", "--debug", action="store_true", help="debug logging of every request and response"
    )
    sharedfs.set_defaults(func=serve_sharedfs, daemon=True)

    mock_parser = drivers.add_parser(
        "mock",
        help="every RPC, in memory",
        epilog=env_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(mock_parser)
    mock_parser.add_argument(
        "--mock-mount",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="create and remove real target paths, no mounts (default: on)",
    )
    for flag, kind in (
        ("--plugin-caps", t.PluginServiceType),
        ("--controller-caps", t.ControllerCapability),
        ("--node-caps", t.NodeCapability),
        ("--group-caps", t.GroupControllerCapability),
    ):
        mock_parser.add_argument(
            flag,
            type=_caps(kind),
            default=None,
            metavar="CAP[,CAP]|none|all",
            help=f"advertised {kind.__name__} values (default: all csi-sanity knows)",
        )
    mock_parser.set_defaults(func=serve_mock, daemon=True)

    new_parser = verbs.add_parser(
        "new",
        help="write a new CSI driver project on kubevol's framework (gocsi's bootstrapper)",
        description=plain_text(bootstrap_doc or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    new_parser.add_argument("name", help="the project's name, like acme-csi")
    new_parser.add_argument("--output", default="", help="where to write it (default: ./NAME)")
    new_parser.add_argument(
        "--driver-name", default="", help="the CSI plugin name (default: NAME.csi.example.com)"
    )
    new_parser.add_argument(
        "--max-volume-size", type=SIZE, default=DEFAULT_MAX_VOLUME_BYTES, metavar="SIZE",
        help="the largest volume the driver holds, and the size its test asks the conformance "
        "suite for (default: 1Gi)",
    )  # fmt: skip
    new_parser.set_defaults(func=new_project)

    _configure_e2e(verbs)

    version_parser = verbs.add_parser("version", help="print version information as YAML")
    version_parser.add_argument(
        "--driver", default="hostpath",
        help="mock, hostpath, sharedfs or a driver name (default: hostpath)",
    )
    add_output_flags(version_parser, default="yaml")
    version_parser.set_defaults(func=version)
