"""The conformance suite's pytest plugin (a ``pytest11`` entry point, so it is loaded before
the command line is parsed and ``pytest --pyargs kubevol.csidriver.sanity --csi-endpoint ...``
works).

In any other test run it only adds the ``--csi-*`` options and fixtures named ``csi_*``:
it collects nothing, and it fails nothing unless the suite's own tests were collected
without ``--csi-endpoint``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported lazily: loading the plugin must stay cheap for every test run
    from kubevol.csidriver.sanity.context import Resources, SanityConfig, SanityContext

SUITE_PACKAGE = "kubevol.csidriver.sanity"
_SUITE_DIR = os.path.dirname(os.path.abspath(__file__))


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--csi-*`` options (csi-sanity's ``--csi.*`` flags, by another name)."""
    group = parser.getgroup("csi-sanity", "CSI conformance suite (kubevol.csidriver.sanity)")
    add = group.addoption
    add("--csi-endpoint", default=None, help="the driver's endpoint (required)")
    add("--csi-controller-endpoint", default="", help="the controller's endpoint, if separate")
    add("--csi-staging-dir", default="", help="where staging directories go (default: temp)")
    add("--csi-mount-dir", default="", help="where target parents go (default: temp)")
    add("--csi-volume-size", default="10Gi", help="size of test volumes (default: 10Gi)")
    add("--csi-volume-expand-size", default="", help="size to expand to (default: size + 1Gi)")
    add(
        "--csi-access-type",
        default="mount",
        choices=("mount", "block"),
        help="access type of test volumes",
    )
    add("--csi-secrets-file", default="", help="secrets (flat or csi-sanity YAML)")
    add("--csi-params-file", default="", help="CreateVolume parameters (YAML)")
    add("--csi-snapshot-params-file", default="", help="CreateSnapshot parameters (YAML)")
    add(
        "--csi-mutable-params-file",
        default="",
        help="ControllerModifyVolume parameters (YAML); the positive modify test needs them",
    )
    add(
        "--csi-idempotent-count",
        default=10,
        type=int,
        help="how often each mutating call is repeated (default: 10, as csi-sanity)",
    )
    add("--csi-timeout", default="60s", help="per-call timeout")
    add(
        "--csi-test-node-volume-attach-limit",
        action="store_true",
        help="publish NodeGetInfo's max_volumes_per_node volumes, then expect one more to fail",
    )
    for what, flag in (("mount", "mount"), ("staging", "staging")):
        add(
            f"--csi-create-{flag}-path-cmd",
            default="",
            help=f"command that creates the {what} directory: called with the suggested path, "
            "prints the path to use (for drivers whose paths live in a container)",
        )
        add(
            f"--csi-remove-{flag}-path-cmd",
            default="",
            help=f"command that removes the {what} directory, called with its path",
        )
    add(
        "--csi-check-path-cmd",
        default="",
        help="command that prints file, directory, not_found or other for a path",
    )
    add("--csi-create-path-cmd-timeout", default="10s", help="timeout of the create commands")
    add("--csi-remove-path-cmd-timeout", default="10s", help="timeout of the remove commands")
    add("--csi-check-path-cmd-timeout", default="10s", help="timeout of the check command")
    add("--csi-version", action="store_true", help="print the suite's version and exit")


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--csi-version``: print the suite's version (kubevol's) and stop."""
    if config.getoption("--csi-version", default=False):
        print(version_line())
        return 0
    return None


def version_line() -> str:
    """What ``--csi-version`` (and ``python -m kubevol.csidriver.sanity --version``) prints."""
    from kubevol._version import __version__

    return (
        f"kubevol.csidriver.sanity {__version__} "
        "(csi-sanity v5.3's checks; CSI spec 1.12 and later)"
    )


def _is_suite_item(item: pytest.Item) -> bool:
    return str(item.path).startswith(_SUITE_DIR + os.sep)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Refuse to run the suite's tests without an endpoint."""
    if config.getoption("--csi-endpoint") is None and any(_is_suite_item(i) for i in items):
        raise pytest.UsageError(f"{SUITE_PACKAGE} needs --csi-endpoint unix:///path/to/csi.sock")


def build_config(config: pytest.Config) -> SanityConfig:
    """The suite's settings from the command line; UsageError for a bad value or file."""
    from kubevol.csidriver.sanity.context import PathCommands, SanityConfig
    from kubevol.csidriver.sanity.inputs import Secrets, load_parameters, load_secrets
    from kubevol.util.units import duration_seconds, quantity_bytes

    opt = config.getoption
    try:
        expand = opt("--csi-volume-expand-size")
        commands = PathCommands(
            create_mount=opt("--csi-create-mount-path-cmd"),
            create_staging=opt("--csi-create-staging-path-cmd"),
            remove_mount=opt("--csi-remove-mount-path-cmd"),
            remove_staging=opt("--csi-remove-staging-path-cmd"),
            check=opt("--csi-check-path-cmd"),
            create_timeout=duration_seconds(opt("--csi-create-path-cmd-timeout")),
            remove_timeout=duration_seconds(opt("--csi-remove-path-cmd-timeout")),
            check_timeout=duration_seconds(opt("--csi-check-path-cmd-timeout")),
        )
        return SanityConfig(
            endpoint=opt("--csi-endpoint"),
            controller_endpoint=opt("--csi-controller-endpoint"),
            staging_dir=opt("--csi-staging-dir"),
            mount_dir=opt("--csi-mount-dir"),
            volume_size=quantity_bytes(opt("--csi-volume-size")),
            expand_size=quantity_bytes(expand) if expand else 0,
            access_type=opt("--csi-access-type"),
            secrets=load_secrets(opt("--csi-secrets-file"))
            if opt("--csi-secrets-file")
            else Secrets(),
            parameters=_params(opt("--csi-params-file"), load_parameters),
            snapshot_parameters=_params(opt("--csi-snapshot-params-file"), load_parameters),
            mutable_parameters=_params(opt("--csi-mutable-params-file"), load_parameters),
            idempotent_count=max(1, opt("--csi-idempotent-count")),
            timeout=duration_seconds(opt("--csi-timeout")),
            test_node_volume_attach_limit=opt("--csi-test-node-volume-attach-limit"),
            path_commands=commands,
        )
    except ValueError as exc:
        raise pytest.UsageError(f"csi-sanity: {exc}") from exc


def _params(path: str, load: Any) -> dict[str, str]:
    return dict(load(path)) if path else {}


@pytest.fixture(scope="session")
def csi_sanity(request: pytest.FixtureRequest) -> Iterator[SanityContext]:
    """The driver under test: clients and advertised capabilities (one per session)."""
    from kubevol.csidriver.sanity.context import SanityContext

    ctx = SanityContext(build_config(request.config))
    yield ctx
    ctx.close()


@pytest.fixture
def csi_resources(csi_sanity: SanityContext, request: pytest.FixtureRequest) -> Iterator[Resources]:
    """What the test creates; cleaned up afterwards, and the cleanup calls must succeed."""
    from kubevol.csidriver.sanity.context import Resources

    res = Resources(csi_sanity, request.node.name)
    yield res
    problems = res.cleanup()
    if problems:
        pytest.fail("cleanup calls failed (they must answer OK): " + "; ".join(problems))
