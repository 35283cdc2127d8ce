"""``NodeVolumeHost``: the node agent's :class:`~kubevol.host.VolumeHost`, with the kubelet's
directory layout (:mod:`kubevol.layout`) under a root directory, and :func:`node_plugins`,
the plugins a node agent hosts. Every name or id that becomes a path segment is validated
first, so nothing is ever created outside the root.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kubevol import layout
from kubevol.errors import InvalidPathSegmentError, KubevolError
from kubevol.host import CommandRunner, KubeletVolumeHost
from kubevol.k8s.objects import APIObjectSource, ConfigMap, KubeAPIObjects, NoObjects, Secret
from kubevol.k8s.pod import Pod
from kubevol.k8s.tokens import (
    APITokenProvider,
    IssuedToken,
    TokenManager,
    TokenRequest,
)
from kubevol.layout import validate_path_segment
from kubevol.manager import VolumePluginMgr
from kubevol.mount import LinuxMounter
from kubevol.mount.interface import MountInterface
from kubevol.mount.probe import PathProbe
from kubevol.plugin import VolumePlugin
from kubevol.plugins import builtin_plugins
from kubevol.spec import Spec
from kubevol.types import VolumeOptions
from kubevol.util.turns import given_up
from kubevol.volume import Mounter, Unmounter

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, V1CSIDriver

log = logging.getLogger(__name__)


def node_plugins(*, csi: VolumePlugin | None = None) -> list[VolumePlugin]:
    """Fresh instances of every plugin a node agent hosts: the in-tree plugins
    (:func:`kubevol.plugins.builtin_plugins`) and the CSI adapter.

    Pass ``csi`` to use a CSI adapter configured by the caller (its own driver registry,
    unstage-guard policy, attachment backend) instead of a default one. The default is
    imported only when needed: the adapter brings grpc with it, which costs a third of a
    second that an agent without CSI never pays.
    """
    if csi is None:
        from kubevol.plugins.csi import CSIPlugin

        csi = CSIPlugin()
    return [*builtin_plugins(), csi]


#: The kubelet names a wrapped volume ``wrapped_<volume>``: an emptyDir wrapped by a secret
#: volume ``creds`` keeps its ready marker at ``plugins/kubernetes.io~empty-dir/wrapped_creds``.
WRAPPED_VOLUME_PREFIX = "wrapped_"


def _wrapped_spec(volume_name: str, spec: Spec) -> Spec:
    volume = copy.deepcopy(spec.volume)
    if volume is not None:
        volume.name = WRAPPED_VOLUME_PREFIX + volume_name
    return Spec(
        volume=volume, persistent_volume=spec.persistent_volume, read_only=spec.read_only
    )


def _run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


class NodeVolumeHost(KubeletVolumeHost):
    """A node agent's host with the kubelet's layout under ``root_dir``.

    ``mounter`` defaults to :class:`kubevol.mount.LinuxMounter`; ``kube_client`` is an
    optional ``kubernetes.client.ApiClient``; ``csi_drivers`` looks up CSIDriver objects
    by name when there is no API server. ConfigMaps and Secrets come from ``objects``,
    else from the API server through ``kube_client``; service-account tokens from
    ``tokens``, else from the TokenRequest API through ``kube_client``.
    """

    def __init__(
        self,
        *,
        root_dir: str,
        node_name: str,
        mounter: MountInterface | None = None,
        kube_client: ApiClient | None = None,
        csi_drivers: Callable[[str], V1CSIDriver | None] | None = None,
        node_labels: dict[str, str] | None = None,
        objects: APIObjectSource | None = None,
        tokens: TokenManager | None = None,
    ) -> None:
        if not root_dir:
            raise InvalidPathSegmentError("root_dir must not be empty")
        self.root_dir = os.path.abspath(root_dir)
        # "" for the root "/": paths below it are then "/pods/...", not "//pods/...".
        self._root_prefix = self.root_dir.rstrip("/")
        self.node_name = validate_path_segment(node_name, "node name")
        self._mounter = mounter
        self._kube_client = kube_client
        self._csi_drivers = csi_drivers
        self._node_labels = dict(node_labels or {})
        if objects is None:
            objects = KubeAPIObjects(kube_client) if kube_client is not None else NoObjects()
        self.objects = objects
        if tokens is None and kube_client is not None:
            tokens = TokenManager(APITokenProvider(kube_client))
        self.tokens = tokens
        self._plugin_mgr: VolumePluginMgr | None = None
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        #: The one way this host's callers touch paths below network and FUSE mounts (they
        #: can block for ever): with a deadline, a stuck mount costing only its volumes.
        self.probe = PathProbe()

    def get_plugin_dir(self, plugin_name: str) -> str:
        return layout.plugin_dir(self._root_prefix, plugin_name)

    def get_volume_device_plugin_dir(self, plugin_name: str) -> str:
        return layout.volume_device_plugin_dir(self._root_prefix, plugin_name)

    def get_plugins_registry_dir(self) -> str:
        """Where drivers' registration sockets appear (``plugins_registry``)."""
        return layout.plugins_registry_dir(self._root_prefix)

    def get_pods_dir(self) -> str:
        return layout.pods_dir(self._root_prefix)

    @functools.cached_property
    def real_pods_dir(self) -> str:
        """:meth:`get_pods_dir` with links resolved, for comparing with resolved paths.
        The root is the operator's (trusted everywhere): resolved once, not per question
        (a dozen ``lstat`` calls each, on every tear-down and unstage)."""
        return os.path.realpath(self.get_pods_dir())

    @functools.cached_property
    def real_root_dir(self) -> str:
        """The root with links resolved, once (as :attr:`real_pods_dir`)."""
        return os.path.realpath(self.root_dir)

    def real_path(self, path: str) -> str:
        """``path`` with links resolved, never looking below the root
        (:func:`~kubevol.layout.real_below`)."""
        return layout.real_below(
            os.path.abspath(path), os.path.abspath(self.root_dir), self.real_root_dir)

    def get_pod_dir(self, pod_uid: str) -> str:
        """Directory of one pod."""
        return layout.pod_dir(self._root_prefix, pod_uid)

    def make_pod_dirs(self, pod_uid: str) -> None:
        """Create the root, ``pods``, ``pods/<uid>`` and its ``volumes`` and ``plugins``
        where missing, 0750 whatever the umask, as the kubelet does before a pod's volumes
        are set up (``makePodDataDirs``): the pod's payload files and emptyDirs are then
        reachable only by root and the root's group. Existing directories are left as
        they are."""
        pod_dir = layout.make_data_dirs(self.root_dir, layout.PODS_DIR, pod_uid)
        for sub in (layout.POD_VOLUMES_DIR, layout.POD_PLUGINS_DIR):
            layout.make_data_dir(f"{pod_dir}/{sub}")

    def make_plugins_dir(self) -> None:
        """Create the root and ``plugins`` where missing, 0750 (the kubelet's
        ``setupDataDirs``), before a device is staged below them."""
        layout.make_data_dirs(self.root_dir, layout.PLUGINS_DIR)

    def get_pod_volume_dir(self, pod_uid: str, plugin_name: str, volume_name: str) -> str:
        return layout.pod_volume_dir(self._root_prefix, pod_uid, plugin_name, volume_name)

    def get_pod_plugin_dir(self, pod_uid: str, plugin_name: str) -> str:
        return layout.pod_plugin_dir(self._root_prefix, pod_uid, plugin_name)

    def get_pod_volume_device_dir(self, pod_uid: str, plugin_name: str) -> str:
        return layout.pod_volume_device_dir(self._root_prefix, pod_uid, plugin_name)

    def get_kube_client(self) -> ApiClient | None:
        return self._kube_client

    def get_mounter(self) -> MountInterface:
        with self._lock:
            if self._mounter is None:
                self._mounter = LinuxMounter(around_helper=given_up)
            return self._mounter

    def get_node_name(self) -> str:
        return self.node_name

    def get_host_name(self) -> str:
        return socket.gethostname()

    def get_host_ip(self) -> str:
        # A UDP "connect" sends nothing; it only asks the kernel which source address
        # it would use, which is the primary address. Loopback when there is no route.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
                return str(probe.getsockname()[0])
            except OSError:
                return "127.0.0.1"

    def get_node_labels(self) -> dict[str, str]:
        return dict(self._node_labels)

    def get_node_allocatable(self) -> dict[str, str]:
        allocatable = {"cpu": str(os.cpu_count() or 1)}
        try:
            pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return allocatable
        allocatable["memory"] = str(pages * page_size)
        return allocatable

    def get_secret_func(self) -> Callable[[str, str], Secret]:
        return self.objects.get_secret

    def get_config_map_func(self) -> Callable[[str, str], ConfigMap]:
        return self.objects.get_config_map

    def get_service_account_token_func(self) -> Callable[[TokenRequest], IssuedToken]:
        if self.tokens is None:
            return super().get_service_account_token_func()
        return self.tokens.get_token

    def get_exec(self, plugin_name: str) -> CommandRunner:
        return _run_command

    def get_event_recorder(self) -> Callable[[str, str, str], None]:
        def record(event_type: str, reason: str, message: str) -> None:
            log.info("event %s %s: %s", event_type, reason, message)

        return record

    def bind_plugin_mgr(self, mgr: VolumePluginMgr) -> None:
        self._plugin_mgr = mgr

    def _wrapped_plugin(self, spec: Spec) -> VolumePlugin:
        if self._plugin_mgr is None:
            raise KubevolError("the host is not bound to a plugin manager yet")
        return self._plugin_mgr.find_plugin_by_spec(spec)

    def new_wrapper_mounter(
        self, volume_name: str, spec: Spec, pod: Pod, opts: VolumeOptions
    ) -> Mounter:
        wrapped = _wrapped_spec(volume_name, spec)
        mounter: Mounter = self._wrapped_plugin(wrapped).new_mounter(wrapped, pod, opts)
        return mounter

    def new_wrapper_unmounter(self, volume_name: str, spec: Spec, pod_uid: str) -> Unmounter:
        wrapped = _wrapped_spec(volume_name, spec)
        unmounter: Unmounter = self._wrapped_plugin(wrapped).new_unmounter(
            wrapped.name() or WRAPPED_VOLUME_PREFIX + volume_name, pod_uid
        )
        return unmounter

    def set_kubelet_error(self, err: BaseException) -> None:
        with self._lock:
            self._errors.append(err)
        log.error("node error reported by a plugin: %s", err)

    def kubelet_errors(self) -> list[BaseException]:
        """Errors plugins reported with :meth:`set_kubelet_error`."""
        with self._lock:
            return list(self._errors)

    def get_csi_driver(self, name: str) -> V1CSIDriver | None:
        if self._csi_drivers is not None:
            return self._csi_drivers(name)
        return None

    def wait_for_cache_sync(self) -> None:
        """Nothing to wait for: CSIDriver lookups are synchronous here."""
