"""The generated protobuf modules as ``Any``, for kubevol's own code.

kubevol's services, client and conversions build messages generically (by field name,
through descriptors), which typed stubs would not help with. Driver authors use the typed
:mod:`kubevol.csi.pb` instead.
"""

from __future__ import annotations

import importlib
from typing import Any

csi_pb2: Any = importlib.import_module("kubevol.csi._generated.csi_pb2")
registration_pb2: Any = importlib.import_module("kubevol.csi._generated.pluginregistration_pb2")
