"""``kubevol csi snapshot-metadata ...`` commands: the SnapshotMetadata RPCs (alpha), whose
answers stream: the allocated blocks of a snapshot, and the blocks that changed between two.

Each response message is printed as it arrives: ``-o json`` one object per message and line
(``block_metadata_type``, ``volume_capacity_bytes``, ``block_metadata``), a table one row
per byte range. An error mid-stream exits with its gRPC code after the ranges before it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from kubevol.cli.csi.common import Command, Stream
from kubevol.cli.output import Column, Table
from kubevol.csi import types as t
from kubevol.csidriver.sanity.inputs import Secrets

if TYPE_CHECKING:
    from kubevol.csi.client import CSIClient

#: One row per range; the metadata type and the volume's size, the same in every message of
#: a stream (the spec says so), are shown in ``-o wide``.
RANGES = Table(
    columns=(
        Column("block_metadata.byte_offset", header="OFFSET"),
        Column("block_metadata.size_bytes", header="SIZE", size=True),
        Column("block_metadata_type", header="TYPE", wide=True),
        Column("volume_capacity_bytes", header="VOLUME SIZE", size=True, wide=True),
    ),
    explode="block_metadata",
)

#: A human size is at most this wide (``1024.0 KiB``).
_WIDEST_HUMAN_SIZE = 1048575


def _message(chunk: t.BlockMetadataChunk) -> dict[str, object]:
    """A streamed message as printed (the metadata type by name)."""
    return {
        "block_metadata_type": chunk.block_metadata_type.name,
        "volume_capacity_bytes": chunk.volume_capacity_bytes,
        "block_metadata": [
            {"byte_offset": b.byte_offset, "size_bytes": b.size_bytes}
            for b in chunk.block_metadata
        ],
    }


def _widest(message: object) -> dict[str, object]:
    """Every offset is below the volume's size, the same in every message of a stream."""
    capacity = message.get("volume_capacity_bytes") if isinstance(message, Mapping) else None
    return {
        "block_metadata": {
            "byte_offset": capacity,
            "size_bytes": _WIDEST_HUMAN_SIZE,
        },
        "block_metadata_type": max((k.name for k in t.BlockMetadataType), key=len),
        "volume_capacity_bytes": _WIDEST_HUMAN_SIZE,
    }


def _stream(chunks: Iterator[t.BlockMetadataChunk]) -> Stream:
    return Stream(messages=(_message(c) for c in chunks), table=RANGES, widest=_widest)


def allocated(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Stream:
    return _stream(
        client.get_metadata_allocated(
            args.snapshot_id,
            starting_offset=args.starting_offset,
            max_results=args.max_results,
            secrets=secrets.for_rpc("GetMetadataAllocated"),
        )
    )


def delta(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Stream:
    return _stream(
        client.get_metadata_delta(
            args.base_snapshot_id,
            args.target_snapshot_id,
            starting_offset=args.starting_offset,
            max_results=args.max_results,
            secrets=secrets.for_rpc("GetMetadataDelta"),
        )
    )


def _paging_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--starting-offset",
        type=int,
        default=0,
        metavar="BYTES",
        help="start at the block holding this byte offset (to resume a broken stream)",
    )
    p.add_argument(
        "--max-results",
        type=int,
        default=0,
        metavar="N",
        help="at most N ranges per streamed message (default: the driver's choice)",
    )


def _allocated_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot_id", metavar="SNAPSHOT_ID")
    _paging_args(p)


def _delta_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("base_snapshot_id", metavar="BASE_SNAPSHOT_ID")
    p.add_argument("target_snapshot_id", metavar="TARGET_SNAPSHOT_ID")
    _paging_args(p)


SNAPSHOT_METADATA = (
    Command(
        name="allocated",
        help="GetMetadataAllocated: the allocated byte ranges of a snapshot, streamed",
        handler=allocated,
        add_args=_allocated_args,
    ),
    Command(
        name="delta",
        help="GetMetadataDelta: the byte ranges that changed between two snapshots of one "
        "volume, streamed",
        handler=delta,
        add_args=_delta_args,
    ),
)
