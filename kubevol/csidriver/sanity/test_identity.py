"""Identity service: plugin info, capabilities, probe (on the node endpoint and, when it is
separate, the controller endpoint too); NodeGetInfo."""

from __future__ import annotations

import re
from collections.abc import Iterator

from kubevol.csi import pb
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.client import CSIClient
from kubevol.csidriver.sanity.context import SanityContext

#: The spec: at most 63 characters, domain-name notation, alphanumeric at both ends.
PLUGIN_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]{0,61}[A-Za-z0-9])?$")

SERVICES = frozenset(int(v) for v in t.PluginServiceType if v)
EXPANSIONS = frozenset(int(v) for v in t.VolumeExpansionType if v)


def _identities(ctx: SanityContext) -> Iterator[tuple[str, CSIClient]]:
    yield "node endpoint", ctx.client
    if ctx.controller is not ctx.client:
        yield "controller endpoint", ctx.controller


def test_plugin_info_is_valid(csi_sanity: SanityContext) -> None:
    """GetPluginInfo names the plugin in DNS notation (<= 63 chars) with a version.

    The spec wants alphanumeric characters at both ends; csi-sanity wants letters there.
    This suite follows the spec (``csi.1example.com9`` passes here)."""
    for where, client in _identities(csi_sanity):
        info = client.get_plugin_info()
        assert PLUGIN_NAME.match(info.name), f"{where}: plugin name {info.name!r} breaks the spec"
        assert info.vendor_version, f"{where}: vendor_version is required"


def test_plugin_capabilities_are_known(csi_sanity: SanityContext) -> None:
    """GetPluginCapabilities answers only services and expansion types the spec defines.

    csi-sanity v5.3 also fails SNAPSHOT_METADATA_SERVICE (4, alpha), which it does not
    know; the spec defines it, so this suite accepts it."""
    for where, client in _identities(csi_sanity):
        raw = client.call("GetPluginCapabilities", csi_pb2.GetPluginCapabilitiesRequest())
        assert isinstance(raw, pb.GetPluginCapabilitiesResponse), type(raw)
        for cap in raw.capabilities:
            kind = cap.WhichOneof("type")
            assert kind in ("service", "volume_expansion"), f"{where}: unknown capability {cap}"
            if kind == "service":
                assert cap.service.type in SERVICES, f"{where}: unknown service {cap.service.type}"
            else:
                value = cap.volume_expansion.type
                assert value in EXPANSIONS, f"{where}: unknown expansion type {value}"


def test_probe_answers(csi_sanity: SanityContext) -> None:
    """Probe succeeds on every endpoint; ``ready`` may say either (the spec lets a plugin
    report that it is still starting)."""
    for _, client in _identities(csi_sanity):
        assert client.probe() in (True, False)


def test_node_get_info(csi_sanity: SanityContext) -> None:
    """NodeGetInfo names the node (1-256 bytes) and a non-negative volume limit; a driver
    with VOLUME_ACCESSIBILITY_CONSTRAINTS reports the node's topology."""
    info = csi_sanity.client.node_get_info()
    assert 0 < len(info.node_id.encode()) <= 256
    assert info.max_volumes_per_node >= 0
    if t.PluginServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS in csi_sanity.plugin_caps.services:
        assert info.accessible_topology is not None


def test_node_capabilities_are_known(csi_sanity: SanityContext) -> None:
    """NodeGetCapabilities answers only capabilities the spec defines (UNKNOWN, 0, is
    tolerated, as csi-sanity does)."""
    raw = csi_sanity.client.call("NodeGetCapabilities", csi_pb2.NodeGetCapabilitiesRequest())
    assert isinstance(raw, pb.NodeGetCapabilitiesResponse), type(raw)
    known = frozenset(int(v) for v in t.NodeCapability)
    for cap in raw.capabilities:
        assert cap.WhichOneof("type") == "rpc", f"unknown node capability {cap}"
        assert cap.rpc.type in known, f"unknown node capability {cap.rpc.type}"
