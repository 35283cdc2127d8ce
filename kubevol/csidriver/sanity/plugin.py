"""The conformance suite's pytest plugin (a ``pytest11`` entry point, so it is loaded before
the command line is parsed and ``pytest --pyargs kubevol.csidriver.sanity --csi-endpoint ...``
works).

In any other test run it only adds the ``--csi-*`` options and fixtures named ``csi_*``:
it collects nothing, and it fails nothing unless the suite's own tests were collected
without ``--csi-endpoint``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported lazily: loading the plugin must stay cheap for every test run
    from kubevol.csidriver.sanity.context import Resources, SanityConfig, SanityContext

SUITE_PACKAGE = "kubevol.csidriver.sanity"
_SUITE_DIR = os.path.dirname(os.path.abspath(__file__))


#: The suite's options in the order ``--help`` shows them: flag and ``addoption`` keywords.
OPTIONS: tuple[tuple[str, Mapping[str, object]], ...] = (
    ("--csi-endpoint", {"default": None, "help": "the driver's endpoint (required)"}),
    ("--csi-controller-endpoint",
     {"default": "", "help": "the controller's endpoint, if separate"}),
    ("--csi-volume-size",
     {"default": "10Gi", "help": "size of test volumes, bytes or a quantity like 64Mi "
      "(default: 10Gi, csi-sanity's): give one the driver can hold"}),
    ("--csi-volume-expand-size",
     {"default": "", "help": "size to expand to (default: size + 1Gi)"}),
    ("--csi-staging-dir", {"default": "", "help": "where staging directories go (default: temp)"}),
    ("--csi-mount-dir", {"default": "", "help": "where target parents go (default: temp)"}),
    ("--csi-access-type",
     {"default": "mount", "choices": ("mount", "block"), "help": "access type of test volumes"}),
    ("--csi-secrets-file", {"default": "", "help": "secrets (flat or csi-sanity YAML)"}),
    ("--csi-params-file", {"default": "", "help": "CreateVolume parameters (YAML)"}),
    ("--csi-snapshot-params-file", {"default": "", "help": "CreateSnapshot parameters (YAML)"}),
    ("--csi-mutable-params-file",
     {"default": "", "help": "ControllerModifyVolume parameters (YAML); the positive modify "
      "test needs them"}),
    ("--csi-idempotent-count",
     {"default": 10, "type": int,
      "help": "how often each mutating call is repeated (default: 10, as csi-sanity)"}),
    ("--csi-timeout", {"default": "60s", "help": "per-call timeout"}),
    ("--csi-test-node-volume-attach-limit",
     {"action": "store_true", "help": "publish NodeGetInfo's max_volumes_per_node volumes, "
      "then expect one more to fail"}),
    *(
        option
        for what in ("mount", "staging")
        for option in (
            (f"--csi-create-{what}-path-cmd",
             {"default": "", "help": f"command that creates the {what} directory: called with "
              "the suggested path, prints the path to use (for drivers whose paths live in a "
              "container)"}),
            (f"--csi-remove-{what}-path-cmd",
             {"default": "", "help": f"command that removes the {what} directory, called with "
              "its path"}),
        )
    ),
    ("--csi-check-path-cmd",
     {"default": "", "help": "command that prints file, directory, not_found or other for a "
      "path"}),
    ("--csi-create-path-cmd-timeout", {"default": "10s", "help": "timeout of the create commands"}),
    ("--csi-remove-path-cmd-timeout", {"default": "10s", "help": "timeout of the remove commands"}),
    ("--csi-check-path-cmd-timeout", {"default": "10s", "help": "timeout of the check command"}),
    ("--csi-report",
     {"default": "", "metavar": "FILE", "help": "write each test's outcome as a JSON line to "
      "FILE (test, outcome, rule: the spec rule it checks, reason: why it failed)"}),
    ("--csi-version", {"action": "store_true", "help": "print the suite's version and exit"}),
)  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--csi-*`` options (csi-sanity's ``--csi.*`` flags, by another name)."""
    group = parser.getgroup("csi-sanity", "CSI conformance suite (kubevol.csidriver.sanity)")
    for flag, kwargs in OPTIONS:
        group.addoption(flag, **kwargs)


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


def rule_of(item: pytest.Item) -> str:
    """What a suite test checks: the first sentence of its docstring, on one line."""
    doc = " ".join((getattr(item, "obj", None).__doc__ or "").split())
    end = doc.find(". ")
    return doc if end < 0 else doc[: end + 1]


def failure_reason(excinfo: pytest.ExceptionInfo[BaseException] | None) -> str:
    """Why a test failed, in one line: the exception's message (an assertion's own message,
    not pytest's rewritten comparison below it)."""
    if excinfo is None:
        return ""
    exc = excinfo.value
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    plain = isinstance(exc, AssertionError) or type(exc).__name__ == "Failed"
    return text if plain and text else f"{type(exc).__name__}: {text}".rstrip(": ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """``--csi-report FILE``: one JSON line per suite test phase that decides an outcome (a
    call, a set-up or clean-up that failed, a skip)."""
    report = yield
    path = item.config.getoption("--csi-report", default="")
    if not path or not _is_suite_item(item):
        return report
    if report.when != "call" and not (report.failed or report.skipped):
        return report
    outcome = report.outcome if report.when == "call" or report.skipped else "error"
    entry = {
        "test": f"{item.path.name}::{item.nodeid.partition('::')[2]}",
        "phase": report.when,
        "outcome": outcome,
        "rule": rule_of(item),
        "reason": failure_reason(call.excinfo) if report.failed else "",
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")
    return report


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


def _params(path: str, load: Callable[[str], Mapping[str, str]]) -> dict[str, str]:
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
