"""Write and serve CSI drivers in Python (gocsi's role).

Subclass the service bases, put them in a :class:`StoragePlugin`, and :func:`serve` it;
requests and responses are the typed messages of :mod:`kubevol.csi.pb`::

    class Identity(IdentityService):
        def get_plugin_info(self, request: pb.GetPluginInfoRequest, context: Any) -> Any:
            return pb.GetPluginInfoResponse(name="x.example.com", vendor_version="1.0")

    serve(StoragePlugin(identity=Identity(), node=MyNode()))   # reads CSI_ENDPOINT, X_CSI_*

``kubevol driver new NAME`` writes a project laid out this way, with a test that runs the
conformance suite against it.
"""

from kubevol.csidriver.server.config import (
    Mode,
    PluginInfoOverride,
    ServerConfig,
    ServerConfigError,
    parse_plugin_info,
)
from kubevol.csidriver.server.middleware import (
    CallInfo,
    Middleware,
    current_request_id,
)
from kubevol.csidriver.server.serve import (
    DEFAULT_GRACE,
    ServerHandle,
    StoragePlugin,
    serve,
    serve_in_background,
)
from kubevol.csidriver.server.services import (
    ControllerService,
    CSIService,
    GroupControllerService,
    IdentityService,
    NodeService,
    SnapshotMetadataService,
)

__all__ = [
    "DEFAULT_GRACE",
    "CSIService",
    "CallInfo",
    "ControllerService",
    "GroupControllerService",
    "IdentityService",
    "Middleware",
    "Mode",
    "NodeService",
    "PluginInfoOverride",
    "ServerConfig",
    "ServerConfigError",
    "ServerHandle",
    "SnapshotMetadataService",
    "StoragePlugin",
    "current_request_id",
    "parse_plugin_info",
    "serve",
    "serve_in_background",
]
