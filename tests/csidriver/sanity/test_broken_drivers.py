"""Covers kubevol.csidriver.sanity: its tests against broken drivers.

The suite catches each class of bug upstream csi-sanity found in kubevol's drivers (and
the common ones csi-test's issues list): a deliberately broken driver fails the right test.
A driver that follows the spec's error table where csi-sanity's cleanup is lenient passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest

from kubevol.csi._pb import csi_pb2
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.common import RunningDriver, serve_plugin
from kubevol.csidriver.drivers.engine import (
    Engine,
    EngineController,
    EngineNode,
    MemoryStore,
    build_storage_plugin,
)
from kubevol.csidriver.drivers.mock import MockBackend, MockConfig, MockDriver
from kubevol.csidriver.server import StoragePlugin
from tests.csidriver.sanity.suite import SuiteResult, run_suite

Code = grpc.StatusCode


def mock_with(
    *, controller: type[EngineController] = EngineController, node: type[EngineNode] = EngineNode
) -> tuple[StoragePlugin, MockConfig]:
    """A mock driver's plugin with one service replaced by a broken subclass."""
    config = MockConfig(node_id="node-1")
    engine = Engine(config.settings(), MockBackend(config.mock_mount), MemoryStore())
    plugin = build_storage_plugin(engine)
    broken = StoragePlugin(
        identity=plugin.identity,
        controller=controller(engine),
        node=node(engine),
        group_controller=plugin.group_controller,
    )
    return broken, config


def run_against(plugin: StoragePlugin, work: Path, *options: str) -> SuiteResult:
    """Serve ``plugin`` and run the suite (or the tests ``-k`` picks) against it."""
    running: RunningDriver
    with serve_plugin(plugin) as running:
        return run_suite(running.endpoint, work, "--csi-idempotent-count", "2", *options)


class WrongTokenController(EngineController):
    """Answers INVALID_ARGUMENT for a bad ListVolumes token, as many drivers wrongly do."""

    def list_volumes(self, request: Any, context: Any) -> Any:
        if request.starting_token == "invalid-token":
            raise CSIRPCError(Code.INVALID_ARGUMENT, "bad token")
        return super().list_volumes(request, context)


@pytest.mark.slow
def test_invalid_argument_for_a_bad_token_fails(tmp_path: Path) -> None:
    """ListVolumes with an unknown token must be ABORTED (csi-test #222)."""
    plugin, _ = mock_with(controller=WrongTokenController)
    result = run_against(plugin, tmp_path, "-k", "token")
    assert result.failed == {"test_list_volumes_invalid_token_is_aborted"}, result.describe()
    assert "expected ABORTED, got INVALID_ARGUMENT" in result.output


class StrictModifyController(EngineController):
    """kubevol's old ModifyVolume: the empty map is 'missing' (INVALID_ARGUMENT) even for an
    unknown volume, which therefore never gets NOT_FOUND."""

    def controller_modify_volume(self, request: Any, context: Any) -> Any:
        if not request.mutable_parameters:
            raise CSIRPCError(Code.INVALID_ARGUMENT, "mutable_parameters is required")
        return super().controller_modify_volume(request, context)


@pytest.mark.slow
def test_modify_without_not_found_fails(tmp_path: Path) -> None:
    """A ModifyVolume that refuses the empty map before looking the volume up fails the
    modify test on its NOT_FOUND check."""
    plugin, _ = mock_with(controller=StrictModifyController)
    result = run_against(plugin, tmp_path, "-k", "modify")
    assert result.failed == {"test_controller_modify_volume"}, result.describe()
    assert "expected NOT_FOUND, got INVALID_ARGUMENT" in result.output


@pytest.mark.slow
def test_accepting_an_invalid_volume_attributes_class_fails(tmp_path: Path) -> None:
    """A driver that takes any mutable parameter (a mock configured to) fails the
    VolumeAttributesClass tests: XXX_FakeKey must be INVALID_ARGUMENT."""
    config = MockConfig(node_id="node-1", mutable_parameter_keys=None)
    with MockDriver(config).serve() as running:
        result = run_suite(running.endpoint, tmp_path, "-k", "attributes_class or modify")
    assert result.failed == {
        "test_create_volume_with_volume_attributes_class",
        "test_controller_modify_volume",
    }, result.describe()


@pytest.mark.slow
def test_a_driver_that_leaves_targets_missing_fails(tmp_path: Path) -> None:
    """A driver that never creates (or removes) the target path fails the tests that look
    at it (csi-test #196: the target must be removed on NodeUnpublish)."""
    with MockDriver(MockConfig(node_id="node-1", mock_mount=False)).serve() as running:
        result = run_suite(running.endpoint, tmp_path, "--csi-idempotent-count", "2")
    assert result.failed == {
        "test_full_lifecycle",
        "test_full_lifecycle_is_idempotent",
        "test_node_unpublish_removes_the_target",
    }, result.describe()
    assert "must create the target" in result.output


class KeepsTargetNode(EngineNode):
    """NodeUnpublish forgets the publication but leaves the target directory behind."""

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        with self.engine.locks.hold(request.volume_id):
            vol = self.engine.volume(request.volume_id)
            if vol is not None and request.target_path in vol.publications:
                remaining = {k: v for k, v in vol.publications.items() if k != request.target_path}
                self.engine.put_volume(attrs.evolve(vol, publications=remaining))
        return csi_pb2.NodeUnpublishVolumeResponse()


@pytest.mark.slow
def test_a_driver_that_keeps_the_target_fails(tmp_path: Path) -> None:
    """Not removing the target on NodeUnpublish fails the target-removal test."""
    plugin, _ = mock_with(node=KeepsTargetNode)
    result = run_against(plugin, tmp_path, "-k", "removes_the_target")
    assert result.failed == {"test_node_unpublish_removes_the_target"}, result.describe()
    assert "NodeUnpublish must remove the target" in result.output


class UnknownCapabilityController(EngineController):
    """Advertises a controller capability number the spec does not define."""

    def controller_get_capabilities(self, request: Any, context: Any) -> Any:
        resp = super().controller_get_capabilities(request, context)
        resp.capabilities.add().rpc.type = 99
        return resp


@pytest.mark.slow
def test_an_unknown_capability_fails(tmp_path: Path) -> None:
    """A capability number outside the spec fails the capability test (the class of
    csi-sanity's "Unknown capability: 15"; the spec defines 15, so that one passes here)."""
    plugin, _ = mock_with(controller=UnknownCapabilityController)
    result = run_against(plugin, tmp_path, "-k", "capabilities_are_known")
    assert result.failed == {"test_controller_capabilities_are_known"}, result.describe()
    assert "unknown controller capability 99" in result.output


class SpecTableNode(EngineNode):
    """NodeUnpublish/NodeUnstage of a volume that does not exist answer NOT_FOUND, as the
    spec's error table says (the upstream hostpath driver does this too)."""

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        missing = request.volume_id and self.engine.volume(request.volume_id) is None
        if missing and request.target_path:
            raise CSIRPCError(Code.NOT_FOUND, f"volume {request.volume_id} does not exist")
        return super().node_unpublish_volume(request, context)

    def node_unstage_volume(self, request: Any, context: Any) -> Any:
        missing = request.volume_id and self.engine.volume(request.volume_id) is None
        if missing and request.staging_target_path:
            raise CSIRPCError(Code.NOT_FOUND, f"volume {request.volume_id} does not exist")
        return super().node_unstage_volume(request, context)


@pytest.mark.slow
def test_a_driver_written_from_the_spec_error_table_passes(tmp_path: Path) -> None:
    """NOT_FOUND for NodeUnpublish/NodeUnstage of an unknown volume passes every test
    (kubevol's suite used to demand OK there, stricter than the spec)."""
    plugin, _ = mock_with(node=SpecTableNode)
    result = run_against(plugin, tmp_path)
    assert result.exit_code == 0 and not result.failed, result.describe()
    assert "test_node_unpublish_requires_fields_and_accepts_unknown" in result.passed
