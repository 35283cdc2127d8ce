"""Assertions and skips the conformance tests share."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.sanity.context import SanityContext

Code = grpc.StatusCode


def expect_code(code: grpc.StatusCode, call: Callable[[], object]) -> CSIRPCError:
    """Require ``call`` to fail with ``code``; returns the error."""
    try:
        result = call()
    except CSIRPCError as exc:
        assert exc.code is code, f"expected {code.name}, got {exc.code.name}: {exc.message}"
        return exc
    raise AssertionError(f"expected {code.name}, but the call succeeded with {result!r}")


def expect_code_in(codes: tuple[grpc.StatusCode, ...], call: Callable[[], object]) -> None:
    """Require ``call`` to succeed (when ``OK`` is in ``codes``) or fail with one of
    ``codes``."""
    try:
        call()
    except CSIRPCError as exc:
        names = ", ".join(c.name for c in codes)
        assert exc.code in codes, f"expected one of {names}, got {exc.code.name}: {exc.message}"
        return
    assert grpc.StatusCode.OK in codes, f"expected one of {codes}, but the call succeeded"


def need_controller(ctx: SanityContext, *caps: t.ControllerCapability) -> None:
    """Skip unless the controller service and every capability in ``caps`` are advertised."""
    if not ctx.has_controller_service:
        pytest.skip("the driver offers no controller service")
    missing = [c.name for c in caps if c not in ctx.controller_caps]
    if missing:
        pytest.skip(f"controller capability {', '.join(missing)} is not advertised")


def need_node(ctx: SanityContext, *caps: t.NodeCapability) -> None:
    """Skip unless every node capability in ``caps`` is advertised."""
    missing = [c.name for c in caps if c not in ctx.node_caps]
    if missing:
        pytest.skip(f"node capability {', '.join(missing)} is not advertised")


def need_group(ctx: SanityContext) -> None:
    """Skip unless the group controller service and its capability are advertised."""
    if t.PluginServiceType.GROUP_CONTROLLER_SERVICE not in ctx.plugin_caps.services:
        pytest.skip("the driver offers no group controller service")
    caps = ctx.controller.group_controller_get_capabilities()
    if t.GroupControllerCapability.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT not in caps:
        pytest.skip("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT is not advertised")
