"""The generated protobuf modules, imported dynamically so that type checkers see ``Any``.

The generated code is not type-checked (its stubs do not pass ``mypy --strict``), so
handwritten modules import it only through here.
"""

from __future__ import annotations

import importlib
from typing import Any

csi_pb2: Any = importlib.import_module("kubevol.csi._generated.csi_pb2")
registration_pb2: Any = importlib.import_module("kubevol.csi._generated.pluginregistration_pb2")
