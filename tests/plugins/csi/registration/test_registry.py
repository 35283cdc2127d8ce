"""Covers kubevol.plugins.csi.registration.registry.

The driver registry's version rules, NodeGetInfo at registration and deregistration.
"""

from __future__ import annotations

import grpc
import pytest

from kubevol.plugins.csi.registration import (
    DriverNotRegisteredError,
    DriverRegistrationError,
    highest_supported_version,
)
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME, NODE_ID
from tests.plugins.csi.registration.conftest import Node


@pytest.mark.parametrize(
    ("versions", "highest"),
    [
        (["0.3", "1.2", "2.0"], "1.2"),
        (["1.0.0"], "1.0.0"),
        (["v1.10.0", "1.9"], "1.10.0"),
        (["1.2", "junk", "1.0"], "1.2"),
    ],
)
def test_highest_supported_version(versions: list[str], highest: str) -> None:
    """The highest version with major 1 wins; majors above 1 and unparsable ones are ignored."""
    assert str(highest_supported_version(versions)) == highest


@pytest.mark.parametrize(
    ("versions", "why"),
    [
        ([], "empty array"),
        (["2.0", "3.1"], "could not find a highest supported version"),
        (["0.3"], "must be v1.x"),
        (["1"], "could not parse"),
    ],
)
def test_versions_refused(versions: list[str], why: str) -> None:
    """No 1.x version means no registration, with the reason."""
    with pytest.raises(ValueError, match=why):
        highest_supported_version(versions)


def test_register_asks_node_info_and_deregister_forgets(node: Node) -> None:
    """Registration stores endpoint, version and the NodeGetInfo answer (node id, limit,
    topology); deregistration closes it; lookups of unknown drivers raise LookupError."""
    driver = node.registry.register_driver(DRIVER_NAME, node.handle.address, ["1.0.0"])
    assert driver.node_info.node_id == NODE_ID
    assert driver.node_info.max_volumes_per_node == 3
    assert driver.node_info.accessible_topology is not None
    assert dict(driver.node_info.accessible_topology.segments) == {"topology.kubevol.io/node": "n1"}
    assert node.registry.get(DRIVER_NAME) == driver
    assert node.registry.client(DRIVER_NAME).probe() is True
    node.registry.deregister_driver(DRIVER_NAME)
    node.registry.deregister_driver(DRIVER_NAME)  # idempotent
    with pytest.raises(DriverNotRegisteredError):
        node.registry.get(DRIVER_NAME)
    with pytest.raises(LookupError):
        node.registry.client(DRIVER_NAME)
    assert node.events == [("registered", DRIVER_NAME), ("deregistered", DRIVER_NAME)]


def test_reregistration_needs_a_strictly_higher_version(node: Node) -> None:
    """A driver of the same name can only be replaced by one with a higher 1.x version."""
    node.registry.register_driver(DRIVER_NAME, node.handle.address, ["1.2.0"])
    for versions in (["1.2.0"], ["1.1"]):
        with pytest.raises(DriverRegistrationError, match="already registered with a higher"):
            node.registry.register_driver(DRIVER_NAME, node.handle.address, versions)
    assert str(node.registry.get(DRIVER_NAME).version) == "1.2.0"
    upgraded = node.registry.register_driver(DRIVER_NAME, node.handle.address, ["1.3"])
    assert str(upgraded.version) == "1.3"


def test_node_get_info_failure_unregisters(node: Node) -> None:
    """When NodeGetInfo fails the registration fails and the driver is not registered."""
    node.driver.fail["NodeGetInfo"] = (grpc.StatusCode.INTERNAL, "no node")
    with pytest.raises(DriverRegistrationError, match="NodeGetInfo"):
        node.registry.register_driver(DRIVER_NAME, node.handle.address, ["1.0.0"])
    assert not node.registry.is_registered(DRIVER_NAME)
    assert node.events == []
