"""The kubelet-in-a-box suite as a pytest plugin (a ``pytest11`` entry point, beside
:mod:`kubevol.csidriver.sanity.plugin`)::

    pytest --pyargs kubevol.testing.e2e --e2e-endpoint unix:///run/csi.sock -k 'not block'

One pytest test per check (``test_check[volumes/store-data]``...); a failure's message is the
check's report (what the kubelet sent, what the driver answered, what was expected and why).
In any other test run it only adds the ``--e2e-*`` options and the ``kubelet_e2e`` fixture.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported lazily: loading the plugin must stay cheap for every test run
    from kubevol.testing.e2e.runner import E2ESuite

_SUITE_DIR = os.path.dirname(os.path.abspath(__file__))

#: The options, as ``kubevol driver e2e`` has them (csi-sanity's where they mean the same).
OPTIONS: tuple[tuple[str, Mapping[str, object]], ...] = (
    ("--e2e-endpoint", {"default": None, "help": "the driver's endpoint (required)"}),
    ("--e2e-volume-size", {"default": "64Mi", "help": "size of the test volumes "
                           "(csi-sanity's --csi.testvolumesize; default: 64Mi)"}),
    ("--e2e-params-file", {"default": "", "help": "CreateVolume parameters (YAML)"}),
    ("--e2e-secrets-file", {"default": "", "help": "secrets (csi-sanity's YAML)"}),
    ("--e2e-driver-command", {"default": "", "help": "shell command serving the driver at "
                              "the endpoint: started by the suite, restarted by the checks "
                              "that need it"}),
    ("--e2e-mount-options", {"default": "nodev,noexec",
                             "help": "mountOptions of the mount options check"}),
    ("--e2e-timeout", {"default": "60s", "help": "how long the node side may take per step"}),
    ("--e2e-mock", {"action": "store_true", "help": "the driver is a mock: mounts nothing"}),
    ("--e2e-csidriver", {"default": "", "help": "the driver's CSIDriver object (YAML)"}),
    ("--e2e-ephemeral-attributes", {"default": "", "help": "volumeAttributes of inline "
                                    "ephemeral volumes (YAML)"}),
)  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--e2e-*`` options."""
    group = parser.getgroup("kubevol-e2e", "kubelet-in-a-box e2e suite (kubevol.testing.e2e)")
    for flag, kwargs in OPTIONS:
        group.addoption(flag, **kwargs)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Refuse to run the suite's tests without an endpoint."""
    suite_items = any(str(i.path).startswith(_SUITE_DIR + os.sep) for i in items)
    if suite_items and config.getoption("--e2e-endpoint") is None:
        raise pytest.UsageError("kubevol.testing.e2e needs --e2e-endpoint unix:///path/csi.sock")


@pytest.fixture(scope="session")
def kubelet_e2e(request: pytest.FixtureRequest) -> Iterator[E2ESuite]:
    """The suite against the driver the options name (one relay and work directory per
    session; the driver started and stopped here with ``--e2e-driver-command``)."""
    from kubevol.csidriver.sanity.inputs import Secrets, load_parameters, load_secrets
    from kubevol.testing.e2e.runner import DriverProcess, E2ESuite
    from kubevol.testing.e2e.session import E2EConfig, load_csidriver
    from kubevol.util.units import duration_seconds, quantity_bytes

    opt = request.config.getoption
    try:
        config = E2EConfig(
            endpoint=opt("--e2e-endpoint"), volume_size=quantity_bytes(opt("--e2e-volume-size")),
            parameters=load_parameters(opt("--e2e-params-file"))
            if opt("--e2e-params-file") else {},
            secrets=load_secrets(opt("--e2e-secrets-file"))
            if opt("--e2e-secrets-file") else Secrets(),
            mount_options=tuple(o for o in opt("--e2e-mount-options").split(",") if o),
            timeout=duration_seconds(opt("--e2e-timeout")),
            csidriver=load_csidriver(opt("--e2e-csidriver")) if opt("--e2e-csidriver")
            else None,
            ephemeral_attributes=load_parameters(opt("--e2e-ephemeral-attributes"))
            if opt("--e2e-ephemeral-attributes") else {}, mock=opt("--e2e-mock"),
        )
    except ValueError as exc:
        raise pytest.UsageError(f"kubevol.testing.e2e: {exc}") from exc
    driver = None
    if opt("--e2e-driver-command"):
        driver = DriverProcess(opt("--e2e-driver-command"), config.endpoint)
        driver.start()
    try:
        with E2ESuite(config, driver.restart if driver is not None else None) as suite:
            yield suite
    finally:
        if driver is not None:
            driver.stop()
