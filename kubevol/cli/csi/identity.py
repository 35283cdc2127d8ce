"""``kubevol csi identity ...`` commands: GetPluginInfo, GetPluginCapabilities, Probe."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kubevol.cli.csi.common import Command, Output, done, plain_data, table
from kubevol.csidriver.sanity.inputs import Secrets

if TYPE_CHECKING:
    from kubevol.csi.client import CSIClient


def plugin_info(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    info = plain_data(client.get_plugin_info())
    return Output(data=info, tables=table("name", "vendor_version", "manifest"))


def plugin_capabilities(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    caps = client.get_plugin_capabilities()
    data = {
        "services": [c.name for c in sorted(caps.services)],
        "volume_expansion": [c.name for c in sorted(caps.volume_expansion)],
    }
    return Output(data=data, tables=table("services", "volume_expansion"))


def probe(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    return done(ready=client.probe())


IDENTITY = (
    Command(name="plugin-info", help="GetPluginInfo: name, version, manifest", handler=plugin_info),
    Command(
        name="plugin-capabilities",
        help="GetPluginCapabilities: services and expansion modes",
        handler=plugin_capabilities,
    ),
    Command(name="probe", help="Probe: is the driver ready", handler=probe),
)
