"""``kubevol driver new NAME``: write a small CSI driver project on kubevol's framework
(gocsi's bootstrapper, for Python).

The project installs with pip and serves out of the box: identity, controller and node
services with the spec's rules (volumes kept in memory up to the size the driver can hold,
publishing creates and removes the target path; ``TODO`` marks where real storage goes), a
``pyproject.toml`` with a console script that logs where it listens and every failed call,
a test that runs the conformance suite (``kubevol.csidriver.sanity``) against the driver with
volumes of that size and reports a failure by test, rule and reason, a ``Containerfile``
and ``deploy/`` manifests (a CSIDriver object and a DaemonSet with node-driver-registrar),
and a README saying how to test it as root in a private mount namespace and deploy it::

    kubevol driver new acme-csi --max-volume-size 64Mi && cd acme-csi \
        && pip install -e '.[test]' && pytest
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kubevol._version import __version__
from kubevol.errors import KubevolError

_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


class BootstrapError(KubevolError, ValueError):
    """The project cannot be written: a bad name, or the directory is in the way."""


def package_name(name: str) -> str:
    """The Python package for project ``name`` (``acme-csi`` → ``acme_csi``)."""
    return name.replace("-", "_")


def default_driver_name(name: str) -> str:
    """The CSI plugin name GetPluginInfo reports unless told otherwise."""
    return f"{name}.csi.example.com"


#: The largest volume a new project's driver holds unless told otherwise.
DEFAULT_MAX_VOLUME_BYTES = 1 << 30


def render(
    name: str, driver_name: str, *, max_volume_bytes: int = DEFAULT_MAX_VOLUME_BYTES
) -> dict[str, str]:
    """The project's files (relative path → text) for ``name``."""
    pkg = package_name(name)
    values = {
        "name": name,
        "pkg": pkg,
        "driver_name": driver_name,
        "kubevol_version": __version__,
        "env_prefix": pkg.upper(),
        "max_volume_bytes": str(max_volume_bytes),
        "socket_dir": f"/var/lib/kubelet/plugins/{driver_name}",
    }
    return {path.format(**values): text.format(**values) for path, text in _TEMPLATES.items()}


def write_project(
    name: str,
    dest: str,
    *,
    driver_name: str = "",
    max_volume_bytes: int = DEFAULT_MAX_VOLUME_BYTES,
) -> list[str]:
    """Write project ``name`` into the new directory ``dest``; the files written.

    ``max_volume_bytes`` is the largest volume the driver holds (its CreateVolume answers
    OUT_OF_RANGE above it) and the size of the volumes its test asks the suite for.
    Raises :class:`BootstrapError` for a name that is not a lowercase, dash-separated
    project name, a size below 1 MiB, or when ``dest`` exists and is not an empty
    directory."""
    if max_volume_bytes < 1 << 20:
        raise BootstrapError(f"largest volume {max_volume_bytes} bytes: give at least 1Mi")
    if not _NAME.fullmatch(name):
        raise BootstrapError(
            f"project name {name!r}: use lowercase letters, digits and single dashes, "
            "starting with a letter (like acme-csi)"
        )
    driver = driver_name or default_driver_name(name)
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise BootstrapError(f"{dest} exists and is not an empty directory")
    written = []
    for rel, text in render(name, driver, max_volume_bytes=max_volume_bytes).items():
        path = Path(dest, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(str(path))
    return written


# Templates: str.format fields are {name}, {pkg}, {driver_name}, {kubevol_version},
# {env_prefix}, {max_volume_bytes}, {socket_dir}; literal braces are doubled.
_TEMPLATES: dict[str, str] = {
    "pyproject.toml": '''\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{driver_name}: a CSI driver on kubevol"
requires-python = ">=3.11"
dependencies = ["kubevol>={kubevol_version}"]

[project.optional-dependencies]
test = ["pytest>=8"]

[project.scripts]
{name} = "{pkg}.main:main"

[tool.setuptools]
packages = ["{pkg}"]
''',
    "README.md": '''\
# {name}

A CSI driver (`{driver_name}`) written on [kubevol](https://pypi.org/project/kubevol/)'s
driver framework, bootstrapped by `kubevol driver new {name}`.

```
pip install -e '.[test]'
pytest                                  # runs kubevol's CSI conformance suite against it
CSI_ENDPOINT=csi.sock {name}            # serve on ./csi.sock until SIGTERM
```

- `{pkg}/identity.py`, `{pkg}/controller.py`, `{pkg}/node.py`: the three CSI services;
  requests and responses are the typed messages of `kubevol.csi.pb`. Volumes live in
  memory and publishing only creates the target path: replace the `TODO`s with your storage.
- `{pkg}/__init__.py`: the driver's name and `MAX_VOLUME_BYTES`, the largest volume it
  holds ({max_volume_bytes} bytes); CreateVolume answers OUT_OF_RANGE above it.
- `{pkg}/provider.py`: the `StoragePlugin` and the environment defaults (gocsi's
  `X_CSI_*` variables; `{name} --help` lists them all).
- `tests/test_sanity.py`: serves the driver on a temporary socket and runs kubevol's
  conformance suite (`kubevol.csidriver.sanity`) against it with volumes of
  `MAX_VOLUME_BYTES`.

## Logs

The driver logs on stderr where it listens (`serving {driver_name} (controller and node)
on unix://...`) and every failed call (`NodePublishVolume failed: NOT_FOUND: ...`).
`X_CSI_LOG_LEVEL=DEBUG|INFO|WARN|ERROR` sets the level (default INFO), `X_CSI_REQ_LOGGING=true`
and `X_CSI_REP_LOGGING=true` log every request and response with secrets redacted, and
`X_CSI_DEBUG=true` turns all three on.

## Tests

`pytest` runs the whole conformance suite; when it fails, the failure lists each failed
test, the spec rule it checks and why it failed, and names the file with the whole output.
To run a few tests by hand against a driver you started yourself:

```
CSI_ENDPOINT=/tmp/{name}.sock {name} &
python -m kubevol.csidriver.sanity --csi.endpoint unix:///tmp/{name}.sock \\
    --csi.testvolumesize {max_volume_bytes} -k publish -x
python -m kubevol.csidriver.sanity --help  # every option
```

Once the `TODO`s make real mounts, the tests need root. Run them in a private mount
namespace, so that a mount a killed test leaves behind disappears with the namespace
instead of staying on your machine:

```
sudo unshare -m --propagation private "$(command -v pytest)" -p no:cacheprovider
```

## Deploying on Kubernetes

The kubelet finds a CSI driver through its registration directory: the
[node-driver-registrar](https://github.com/kubernetes-csi/node-driver-registrar) sidecar
runs next to the driver on every node, asks it for its name (GetPluginInfo) and registers
its socket under `/var/lib/kubelet/plugins_registry/`. The layout follows
[csi-driver-host-path](https://github.com/kubernetes-csi/csi-driver-host-path)'s `deploy/`:

- `Containerfile`: the driver's image (`podman build -t {name}:0.1.0 .`, or `docker build -f
  Containerfile ...`); push it where your nodes pull from.
- `deploy/kubernetes/csidriver.yaml`: the CSIDriver object (no attach step, since the
  driver has no ControllerPublishVolume).
- `deploy/kubernetes/node.yaml`: a DaemonSet with the driver (`X_CSI_MODE=node`,
  privileged, `/var/lib/kubelet/pods` mounted with Bidirectional propagation so that its
  mounts reach the pods) and node-driver-registrar (`--csi-address=/csi/csi.sock`, the
  socket inside the pod, and `--kubelet-registration-path={socket_dir}/csi.sock`, the
  same socket as the kubelet sees it on the host).

```
kubectl apply -f deploy/kubernetes/csidriver.yaml -f deploy/kubernetes/node.yaml
kubectl -n kube-system logs ds/{name}-node -c driver     # serving {driver_name} ...
kubectl get csinode -o yaml                             # lists {driver_name} per node
```

Dynamic provisioning also needs the controller half: the driver with
`X_CSI_MODE=controller` in a Deployment next to
[external-provisioner](https://github.com/kubernetes-csi/external-provisioner) (and its
RBAC), as csi-driver-host-path's `deploy/` shows. The volumes this project keeps in memory
are the controller's only, so replace `{pkg}/state.py` with your storage first.
''',
    "{pkg}/__init__.py": '''\
"""{driver_name}: a CSI driver on kubevol's framework."""

DRIVER_NAME = "{driver_name}"
VERSION = "0.1.0"

#: The largest volume this driver holds, in bytes (TODO: what your storage holds). The test
#: asks the conformance suite for volumes of this size.
MAX_VOLUME_BYTES = {max_volume_bytes}
''',
    "{pkg}/state.py": '''\
"""What the driver knows about its volumes (in memory: a TODO for real storage)."""

from __future__ import annotations

import threading

import attrs


@attrs.define
class Volume:
    """One volume: its id, name, size, and the target paths it is published at."""

    volume_id: str
    name: str
    capacity_bytes: int
    block: bool
    published: dict[str, bool] = attrs.field(factory=dict)  # target -> read-only


class State:
    """Volumes by id, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.volumes: dict[str, Volume] = {{}}

    def by_name(self, name: str) -> Volume | None:
        """The volume called ``name``, or None (call with the lock held)."""
        return next((v for v in self.volumes.values() if v.name == name), None)
''',
    "{pkg}/identity.py": '''\
"""The Identity service."""

from __future__ import annotations

from typing import Any

from kubevol.csi import pb
from kubevol.csidriver.server import IdentityService

from {pkg} import DRIVER_NAME, VERSION


class Identity(IdentityService):
    """Who the driver is and what it offers."""

    def get_plugin_info(self, request: pb.GetPluginInfoRequest, context: Any) -> Any:
        return pb.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=VERSION)

    def get_plugin_capabilities(
        self, request: pb.GetPluginCapabilitiesRequest, context: Any
    ) -> Any:
        resp = pb.GetPluginCapabilitiesResponse()
        resp.capabilities.add().service.type = pb.PluginCapability.Service.CONTROLLER_SERVICE
        return resp

    def probe(self, request: pb.ProbeRequest, context: Any) -> Any:
        resp = pb.ProbeResponse()
        resp.ready.value = True  # TODO: report False while your storage is not reachable
        return resp
''',
    "{pkg}/controller.py": '''\
"""The Controller service: creating, deleting and validating volumes."""

from __future__ import annotations

import uuid
from typing import Any

from kubevol.csi import pb
from kubevol.csi.errors import CSIRPCError, StatusCode
from kubevol.csidriver.server import ControllerService

from {pkg} import MAX_VOLUME_BYTES
from {pkg}.state import State, Volume

#: The size of a volume asked for without a size.
DEFAULT_VOLUME_BYTES = min(1 << 30, MAX_VOLUME_BYTES)


def _is_block(cap: pb.VolumeCapability) -> bool:
    return cap.WhichOneof("access_type") == "block"


def _size(capacity: pb.CapacityRange) -> int:
    """The size to create: the required bytes, else the default (within the limit);
    OUT_OF_RANGE beyond what the driver holds or the limit allows."""
    limit = capacity.limit_bytes
    size = capacity.required_bytes or min(DEFAULT_VOLUME_BYTES, limit or DEFAULT_VOLUME_BYTES)
    if size > MAX_VOLUME_BYTES or (limit and size > limit):
        raise CSIRPCError(
            StatusCode.OUT_OF_RANGE,
            f"{{size}} bytes asked; a volume holds at most {{MAX_VOLUME_BYTES}} bytes",
        )
    return size


class Controller(ControllerService):
    """Volumes in memory. Required fields are checked by the framework
    (X_CSI_SPEC_REQ_VALIDATION, on in provider.py)."""

    def __init__(self, state: State) -> None:
        self.state = state

    def controller_get_capabilities(
        self, request: pb.ControllerGetCapabilitiesRequest, context: Any
    ) -> Any:
        resp = pb.ControllerGetCapabilitiesResponse()
        rpc = pb.ControllerServiceCapability.RPC
        resp.capabilities.add().rpc.type = rpc.CREATE_DELETE_VOLUME
        return resp

    def create_volume(self, request: pb.CreateVolumeRequest, context: Any) -> Any:
        required = request.capacity_range.required_bytes
        limit = request.capacity_range.limit_bytes
        block = any(_is_block(c) for c in request.volume_capabilities)
        with self.state.lock:
            vol = self.state.by_name(request.name)
            if vol is not None:  # the spec: ALREADY_EXISTS before any size check
                if vol.capacity_bytes < required or (limit and vol.capacity_bytes > limit):
                    raise CSIRPCError(
                        StatusCode.ALREADY_EXISTS,
                        f"volume {{request.name!r}} exists with {{vol.capacity_bytes}} bytes",
                    )
            else:
                size = _size(request.capacity_range)
                # TODO: create the volume in your storage here.
                vol = Volume(uuid.uuid4().hex, request.name, size, block)
                self.state.volumes[vol.volume_id] = vol
        return pb.CreateVolumeResponse(
            volume=pb.Volume(volume_id=vol.volume_id, capacity_bytes=vol.capacity_bytes)
        )

    def delete_volume(self, request: pb.DeleteVolumeRequest, context: Any) -> Any:
        with self.state.lock:
            vol = self.state.volumes.get(request.volume_id)
            if vol is not None and vol.published:
                raise CSIRPCError(StatusCode.FAILED_PRECONDITION, "volume is published")
            # TODO: delete the volume from your storage here.
            self.state.volumes.pop(request.volume_id, None)
        return pb.DeleteVolumeResponse()

    def validate_volume_capabilities(
        self, request: pb.ValidateVolumeCapabilitiesRequest, context: Any
    ) -> Any:
        with self.state.lock:
            vol = self.state.volumes.get(request.volume_id)
        if vol is None:
            raise CSIRPCError(StatusCode.NOT_FOUND, f"no volume {{request.volume_id}}")
        resp = pb.ValidateVolumeCapabilitiesResponse()
        if all(_is_block(c) == vol.block for c in request.volume_capabilities):
            resp.confirmed.volume_capabilities.extend(request.volume_capabilities)
        else:
            resp.message = "the volume's access type differs"
        return resp
''',
    "{pkg}/node.py": '''\
"""The Node service: publishing creates the target path, unpublishing removes it."""

from __future__ import annotations

import os
import socket
from typing import Any

from kubevol.csi import pb
from kubevol.csi.errors import CSIRPCError, StatusCode
from kubevol.csidriver.server import NodeService

from {pkg}.state import State


class Node(NodeService):
    """Publishes volumes by creating their target (a directory, or a file for block)."""

    def __init__(self, state: State) -> None:
        self.state = state

    def node_get_info(self, request: pb.NodeGetInfoRequest, context: Any) -> Any:
        node_id = os.environ.get("KUBE_NODE_NAME") or socket.gethostname() or "localhost"
        return pb.NodeGetInfoResponse(node_id=node_id)

    def node_get_capabilities(self, request: pb.NodeGetCapabilitiesRequest, context: Any) -> Any:
        return pb.NodeGetCapabilitiesResponse()

    def node_publish_volume(self, request: pb.NodePublishVolumeRequest, context: Any) -> Any:
        target = request.target_path
        with self.state.lock:
            vol = self.state.volumes.get(request.volume_id)
            if vol is None:
                raise CSIRPCError(StatusCode.NOT_FOUND, f"no volume {{request.volume_id}}")
            if target in vol.published:
                if vol.published[target] != request.readonly:
                    raise CSIRPCError(StatusCode.ALREADY_EXISTS, "other read-only flag")
                return pb.NodePublishVolumeResponse()
            if os.path.lexists(target):
                raise CSIRPCError(
                    StatusCode.FAILED_PRECONDITION, f"{{target}} exists; the SP creates it"
                )
            if vol.block:
                open(target, "x").close()  # TODO: bind your device node here
            else:
                os.mkdir(target)  # TODO: mount your volume here
            vol.published[target] = request.readonly
        return pb.NodePublishVolumeResponse()

    def node_unpublish_volume(self, request: pb.NodeUnpublishVolumeRequest, context: Any) -> Any:
        target = request.target_path
        with self.state.lock:
            vol = self.state.volumes.get(request.volume_id)
            if vol is not None and vol.published.pop(target, None) is not None:
                # TODO: unmount here first.
                if os.path.isdir(target):
                    os.rmdir(target)
                else:
                    os.unlink(target)
        return pb.NodeUnpublishVolumeResponse()
''',
    "{pkg}/provider.py": '''\
"""The driver as a StoragePlugin, with its environment defaults."""

from __future__ import annotations

from kubevol.csidriver.server import StoragePlugin

from {pkg} import DRIVER_NAME
from {pkg}.controller import Controller
from {pkg}.identity import Identity
from {pkg}.node import Node
from {pkg}.state import State

#: Defaults for gocsi's X_CSI_* variables (the environment overrides them).
ENV_DEFAULTS = {{"X_CSI_SPEC_REQ_VALIDATION": "true"}}


def new_plugin() -> StoragePlugin:
    """A fresh driver: its three services sharing one state."""
    state = State()
    return StoragePlugin(
        identity=Identity(),
        name=DRIVER_NAME,
        controller=Controller(state),
        node=Node(state),
        env_defaults=ENV_DEFAULTS,
    )
''',
    "{pkg}/main.py": '''\
"""``{name}``: serve the driver on $CSI_ENDPOINT until SIGTERM."""

from __future__ import annotations

import os
import sys

from kubevol.csidriver.server import serve
from kubevol.csidriver.server.config import describe_environment

from {pkg} import DRIVER_NAME
from {pkg}.provider import new_plugin


def main() -> int:
    """Serve, or print the usage (with every variable) when there is no endpoint."""
    if len(sys.argv) > 1 or not os.environ.get("CSI_ENDPOINT"):
        print(f"usage: CSI_ENDPOINT=unix:///path/csi.sock {name}\\n\\n{{DRIVER_NAME}}; "
              f"environment:\\n{{describe_environment()}}")
        return 0 if {{"-h", "--help"}} & set(sys.argv[1:]) else 1
    return serve(new_plugin())


if __name__ == "__main__":
    sys.exit(main())
''',
    "tests/test_sanity.py": '''\
"""The driver passes kubevol's CSI conformance suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubevol.csidriver.sanity.runner import run_suite
from kubevol.csidriver.server import serve_in_background

from {pkg} import MAX_VOLUME_BYTES
from {pkg}.provider import new_plugin


def test_passes_the_conformance_suite(tmp_path: Path) -> None:
    """Served on a temporary socket, the driver passes every test it advertises, with test
    volumes of the size it holds. A failure lists each failed test, the spec rule it checks
    and why it failed, then names the file with the suite's whole output."""
    handle = serve_in_background(new_plugin(), f"unix://{{tmp_path}}/csi.sock", env={{}})
    try:
        report = run_suite(handle.address, tmp_path / "sanity", volume_size=MAX_VOLUME_BYTES)
    finally:
        handle.stop(grace=1)
    if not report.ok:
        pytest.fail(report.summary(), pytrace=False)
''',
    "Containerfile": '''\
# The driver's image: `podman build -t {name}:0.1.0 .` (or docker build -f Containerfile).
FROM docker.io/library/python:3.12-slim
COPY . /src
RUN pip install --no-cache-dir /src && rm -rf /src
ENV CSI_ENDPOINT=unix:///csi/csi.sock
ENTRYPOINT ["{name}"]
''',
    "deploy/kubernetes/csidriver.yaml": '''\
# The cluster's record of the driver: no attach step (the driver has no
# ControllerPublishVolume), no pod information on NodePublishVolume.
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: {driver_name}
spec:
  attachRequired: false
  podInfoOnMount: false
  volumeLifecycleModes:
    - Persistent
''',
    "deploy/kubernetes/node.yaml": '''\
# The node half of {driver_name} on every node: the driver (X_CSI_MODE=node) and
# node-driver-registrar, which registers the driver's socket with the kubelet through
# /var/lib/kubelet/plugins_registry. Laid out as csi-driver-host-path's deploy/ does.
kind: DaemonSet
apiVersion: apps/v1
metadata:
  name: {name}-node
  namespace: kube-system
spec:
  selector:
    matchLabels:
      app: {name}-node
  template:
    metadata:
      labels:
        app: {name}-node
    spec:
      priorityClassName: system-node-critical
      containers:
        - name: driver
          image: {name}:0.1.0  # built from the Containerfile
          env:
            - name: CSI_ENDPOINT
              value: unix:///csi/csi.sock
            - name: X_CSI_MODE
              value: node
            - name: KUBE_NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
          securityContext:
            privileged: true  # it mounts volumes for the kubelet
          volumeMounts:
            - name: socket-dir
              mountPath: /csi
            - name: mountpoint-dir
              mountPath: /var/lib/kubelet/pods
              mountPropagation: Bidirectional
            - name: plugins-dir
              mountPath: /var/lib/kubelet/plugins
              mountPropagation: Bidirectional
        - name: node-driver-registrar
          image: registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.10.0
          args:
            - --v=2
            - --csi-address=/csi/csi.sock
            - --kubelet-registration-path={socket_dir}/csi.sock
          env:
            - name: KUBE_NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
          volumeMounts:
            - name: socket-dir
              mountPath: /csi
            - name: registration-dir
              mountPath: /registration
      volumes:
        - name: socket-dir
          hostPath:
            path: {socket_dir}
            type: DirectoryOrCreate
        - name: registration-dir
          hostPath:
            path: /var/lib/kubelet/plugins_registry
            type: Directory
        - name: mountpoint-dir
          hostPath:
            path: /var/lib/kubelet/pods
            type: DirectoryOrCreate
        - name: plugins-dir
          hostPath:
            path: /var/lib/kubelet/plugins
            type: Directory
''',
}
