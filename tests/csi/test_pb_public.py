"""kubevol.csi.pb: the CSI messages for driver authors, typed so that ``mypy --strict``
checks field access in driver code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.csi import pb
from kubevol.csi._pb import csi_pb2
from kubevol.csi.redact import is_repeated

ROOT = Path(__file__).resolve().parents[2]

DRIVER = '''
from kubevol.csi import pb


def create(request: pb.CreateVolumeRequest) -> pb.CreateVolumeResponse:
    size = request.capacity_range.required_bytes
    return pb.CreateVolumeResponse(volume=pb.Volume(volume_id=request.name, capacity_bytes=size))


def mode(cap: pb.VolumeCapability) -> bool:
    return cap.access_mode.mode == pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
'''

MISTAKES = '''
from kubevol.csi import pb


def typo(request: pb.CreateVolumeRequest) -> str:
    return request.nmae


def wrong_type() -> pb.Volume:
    return pb.Volume(capacity_bytes="ten")
'''


def mypy_strict(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` (with kubevol's configuration) on ``source`` as a driver module."""
    module = tmp_path / "driver_module.py"
    module.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), str(module)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_messages_are_the_generated_ones() -> None:
    """pb's classes are the very messages the server deserialises (not copies)."""
    assert pb.CreateVolumeRequest is csi_pb2.CreateVolumeRequest
    assert pb.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME == 1


@pytest.mark.slow
def test_mypy_strict_accepts_correct_driver_code_and_catches_mistakes(tmp_path: Path) -> None:
    """Correct field access type-checks cleanly; a misspelt field and a wrong value type are
    errors (they would be Any, and pass silently, through the private module)."""
    good = mypy_strict(tmp_path, DRIVER)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = mypy_strict(tmp_path, MISTAKES)
    assert bad.returncode == 1, bad.stdout
    assert '"CreateVolumeRequest" has no attribute "nmae"' in bad.stdout
    assert "capacity_bytes" in bad.stdout and "str" in bad.stdout


class _NewDescriptor:
    """A field descriptor as protobuf 7 has it: ``is_repeated``, no ``label``."""

    def __init__(self, repeated: bool) -> None:
        self.is_repeated = repeated


def test_repeated_fields_are_recognised_on_every_protobuf_release() -> None:
    """``is_repeated`` reads the newer attribute where it exists (protobuf 7 dropped
    ``label``: the generated project's fresh environment gets it) and ``label`` on 5.x."""
    fields = csi_pb2.CreateVolumeRequest.DESCRIPTOR.fields_by_name
    assert is_repeated(fields["volume_capabilities"]) and is_repeated(fields["parameters"])
    assert not is_repeated(fields["name"])
    assert is_repeated(_NewDescriptor(True)) and not is_repeated(_NewDescriptor(False))
