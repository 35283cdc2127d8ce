"""Covers kubevol.csidriver.drivers.mock.

The mock serves the SnapshotMetadata service, when asked to, over a real unix socket: a
fixed synthetic layout of its snapshots, streamed, with the spec's errors."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.mock import MockConfig
from tests.csidriver.drivers.conftest import Served

MiB = 1 << 20
BLOCK = t.VolumeCapability.block()
SERVICES = MockConfig().plugin_services | {t.PluginServiceType.SNAPSHOT_METADATA_SERVICE}

MockFactory = Callable[..., Served]


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``call`` fails with."""
    with pytest.raises(CSIRPCError) as info:
        call()
    return info.value.code


def ranges(chunks: list[t.BlockMetadataChunk]) -> list[tuple[int, int]]:
    """(offset in MiB, size in MiB) of every range of a stream, in order."""
    return [(b.byte_offset // MiB, b.size_bytes // MiB) for c in chunks for b in c.block_metadata]


@pytest.fixture
def client(mock_factory: MockFactory) -> CSIClient:
    """A mock advertising the SnapshotMetadata service."""
    return mock_factory(plugin_services=SERVICES).client


def snapshot_of(client: CSIClient, volume: str, name: str, size: int = 8 * MiB) -> str:
    """Create block volume ``volume`` (if new) of ``size`` and a snapshot ``name`` of it."""
    vol = client.create_volume(volume, [BLOCK], capacity_range=t.CapacityRange(required_bytes=size))
    return client.create_snapshot(vol.volume_id, name).snapshot_id


def test_service_is_opt_in(mock_factory: MockFactory) -> None:
    """By default the mock neither advertises nor serves SnapshotMetadata (upstream
    csi-sanity rejects the service's number); asked for, it does both."""
    plain = mock_factory().client
    assert t.PluginServiceType.SNAPSHOT_METADATA_SERVICE not in (
        plain.get_plugin_capabilities().services
    )
    sid = snapshot_of(plain, "v", "s")
    assert code_of(lambda: list(plain.get_metadata_allocated(sid))) == (
        grpc.StatusCode.UNIMPLEMENTED
    )
    served = mock_factory(plugin_services=SERVICES).client
    assert t.PluginServiceType.SNAPSHOT_METADATA_SERVICE in (
        served.get_plugin_capabilities().services
    )


def test_allocated_is_every_other_block(client: CSIClient) -> None:
    """An 8 MiB snapshot's allocated ranges are its blocks 0, 2, 4 and 6 (1 MiB each, fixed
    length), with the volume's size in every message."""
    sid = snapshot_of(client, "v", "s")
    chunks = list(client.get_metadata_allocated(sid))
    assert ranges(chunks) == [(0, 1), (2, 1), (4, 1), (6, 1)]
    assert {c.block_metadata_type for c in chunks} == {t.BlockMetadataType.FIXED_LENGTH}
    assert {c.volume_capacity_bytes for c in chunks} == {8 * MiB}


def test_max_results_and_starting_offset_split_and_resume_the_stream(client: CSIClient) -> None:
    """``max_results`` bounds the ranges per message; ``starting_offset`` resumes at the block
    holding it (rounded down)."""
    sid = snapshot_of(client, "v", "s")
    chunks = list(client.get_metadata_allocated(sid, max_results=3))
    assert [len(c.block_metadata) for c in chunks] == [3, 1]
    resumed = list(client.get_metadata_allocated(sid, starting_offset=4 * MiB + 5))
    assert ranges(resumed) == [(4, 1), (6, 1)]


def test_delta_between_two_snapshots(client: CSIClient) -> None:
    """Between two snapshots of one volume the blocks at multiples of 4 changed; between a
    snapshot and itself nothing did (one message, no ranges)."""
    base = snapshot_of(client, "v", "s1")
    target = snapshot_of(client, "v", "s2")
    assert ranges(list(client.get_metadata_delta(base, target))) == [(0, 1), (4, 1)]
    same = list(client.get_metadata_delta(base, base))
    assert ranges(same) == [] and [c.volume_capacity_bytes for c in same] == [8 * MiB]


def test_errors_are_the_specs(client: CSIClient) -> None:
    """NOT_FOUND for an unknown snapshot, OUT_OF_RANGE for an offset at the volume's end,
    INVALID_ARGUMENT for a missing id, a negative offset, or snapshots of two volumes."""
    sid = snapshot_of(client, "v", "s")
    other = snapshot_of(client, "w", "t")
    nf, oor, inv = (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert code_of(lambda: list(client.get_metadata_allocated("nope"))) == nf
    assert code_of(lambda: list(client.get_metadata_delta(sid, "nope"))) == nf
    assert code_of(lambda: list(client.get_metadata_allocated(sid, starting_offset=8 * MiB))) == oor
    assert code_of(lambda: list(client.get_metadata_allocated(""))) == inv
    assert code_of(lambda: list(client.get_metadata_allocated(sid, starting_offset=-1))) == inv
    assert code_of(lambda: list(client.get_metadata_delta(sid, other))) == inv
