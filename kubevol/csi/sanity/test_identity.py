"""Identity service: plugin info, capabilities, probe."""

from __future__ import annotations

import re

from kubevol.csi import types as t
from kubevol.csi.sanity.context import SanityContext

#: The spec: at most 63 characters, domain-name notation, alphanumeric at both ends.
PLUGIN_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]{0,61}[A-Za-z0-9])?$")


def test_plugin_info_is_valid(csi_sanity: SanityContext) -> None:
    """GetPluginInfo names the plugin in DNS notation (<= 63 chars) with a version."""
    info = csi_sanity.client.get_plugin_info()
    assert PLUGIN_NAME.match(info.name), f"plugin name {info.name!r} breaks the spec's rules"
    assert info.vendor_version, "vendor_version is required"


def test_plugin_capabilities_are_known(csi_sanity: SanityContext) -> None:
    """GetPluginCapabilities answers only values the spec defines."""
    caps = csi_sanity.client.get_plugin_capabilities()
    assert t.PluginServiceType.UNKNOWN not in caps.services
    assert t.VolumeExpansionType.UNKNOWN not in caps.volume_expansion


def test_probe_answers(csi_sanity: SanityContext) -> None:
    """Probe succeeds (an unset readiness counts as ready) and says ready."""
    assert csi_sanity.client.probe() is True


def test_node_get_info(csi_sanity: SanityContext) -> None:
    """NodeGetInfo names the node (1-256 bytes) and a non-negative volume limit."""
    info = csi_sanity.client.node_get_info()
    assert 0 < len(info.node_id.encode()) <= 256
    assert info.max_volumes_per_node >= 0
    caps = csi_sanity.plugin_caps.services
    if t.PluginServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS in caps:
        assert info.accessible_topology is not None


def test_node_capabilities_are_known(csi_sanity: SanityContext) -> None:
    """NodeGetCapabilities answers only values the spec defines."""
    assert t.NodeCapability.UNKNOWN not in csi_sanity.client.node_get_capabilities()
