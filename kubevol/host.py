"""``VolumeHost``: what a plugin may ask of the agent hosting it (the kubelet's
``VolumeHost``), and the extra methods of a kubelet-like host and of an attach/detach
controller's host. The node agent's concrete host is
:class:`kubevol.node.host.NodeVolumeHost`.
"""

from __future__ import annotations

import abc
import subprocess
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kubevol.k8s.objects import ConfigMap, Secret
from kubevol.k8s.pod import Pod
from kubevol.k8s.tokens import (
    IssuedToken,
    TokenProviderMissingError,
    TokenRequest,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, V1CSIDriver, V1CSINode, V1VolumeAttachment

    from kubevol.manager import VolumePluginMgr
    from kubevol.mount.interface import MountInterface
    from kubevol.spec import Spec
    from kubevol.types import VolumeOptions
    from kubevol.volume import Mounter, Unmounter

#: Runs a command (argv) and returns the completed process, output captured as text.
CommandRunner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class VolumeHost(abc.ABC):
    """What a plugin may ask of the agent that hosts it (the kubelet's ``VolumeHost``)."""

    @abc.abstractmethod
    def get_plugin_dir(self, plugin_name: str) -> str:
        """Directory for a plugin's node-wide data (may not exist yet)."""

    @abc.abstractmethod
    def get_volume_device_plugin_dir(self, plugin_name: str) -> str:
        """Directory for a plugin's node-wide block volume data."""

    @abc.abstractmethod
    def get_pods_dir(self) -> str:
        """Directory holding every pod's data."""

    @abc.abstractmethod
    def get_pod_volume_dir(self, pod_uid: str, plugin_name: str, volume_name: str) -> str:
        """Directory of one volume of one pod."""

    @abc.abstractmethod
    def get_pod_plugin_dir(self, pod_uid: str, plugin_name: str) -> str:
        """Directory for a plugin's data about one pod."""

    @abc.abstractmethod
    def get_pod_volume_device_dir(self, pod_uid: str, plugin_name: str) -> str:
        """Directory of a pod's block volume links for one plugin."""

    @abc.abstractmethod
    def get_kube_client(self) -> ApiClient | None:
        """A ``kubernetes.client.ApiClient``, or None when there is no API server."""

    @abc.abstractmethod
    def get_mounter(self) -> MountInterface:
        """The mount interface plugins must use."""

    @abc.abstractmethod
    def get_node_name(self) -> str:
        """This node's name."""

    @abc.abstractmethod
    def get_host_name(self) -> str:
        """This machine's host name."""

    @abc.abstractmethod
    def get_host_ip(self) -> str:
        """This machine's primary IP address."""

    @abc.abstractmethod
    def get_node_labels(self) -> dict[str, str]:
        """Labels of this node."""

    @abc.abstractmethod
    def get_node_allocatable(self) -> dict[str, str]:
        """Allocatable resources of this node (resource name → quantity)."""

    @abc.abstractmethod
    def get_secret_func(self) -> Callable[[str, str], Secret]:
        """A function ``(namespace, name) → kubevol.k8s.objects.Secret`` (``.data`` base64 as
        in the API); raises :class:`~kubevol.k8s.objects.ObjectNotFoundError` when missing."""

    @abc.abstractmethod
    def get_config_map_func(self) -> Callable[[str, str], ConfigMap]:
        """A function ``(namespace, name) → kubevol.k8s.objects.ConfigMap``; raises
        :class:`~kubevol.k8s.objects.ObjectNotFoundError` when missing."""

    def get_service_account_token_func(self) -> Callable[[TokenRequest], IssuedToken]:
        """A function that returns a (cached, refreshed when due) token for a request.

        The default has no provider: it raises
        :class:`~kubevol.k8s.tokens.TokenProviderMissingError`.
        """

        def missing(request: TokenRequest) -> IssuedToken:
            raise TokenProviderMissingError(
                f"no token provider is configured to issue a token for {request.describe()}"
            )

        return missing

    @abc.abstractmethod
    def get_exec(self, plugin_name: str) -> CommandRunner:
        """A function that runs a command for a plugin and returns its completed process."""

    @abc.abstractmethod
    def get_event_recorder(self) -> Callable[[str, str, str], None]:
        """A function ``(event type, reason, message)`` that records an event."""

    @abc.abstractmethod
    def new_wrapper_mounter(
        self, volume_name: str, spec: Spec, pod: Pod, opts: VolumeOptions
    ) -> Mounter:
        """A mounter from whichever plugin handles ``spec``, for plugins that wrap others."""

    @abc.abstractmethod
    def new_wrapper_unmounter(self, volume_name: str, spec: Spec, pod_uid: str) -> Unmounter:
        """The unmounter matching :meth:`new_wrapper_mounter`."""

    def bind_plugin_mgr(self, mgr: VolumePluginMgr) -> None:  # noqa: B027 - optional hook
        """Called by ``VolumePluginMgr.init_plugins`` so the host can find wrapped plugins."""


class KubeletVolumeHost(VolumeHost):
    """A host that is a node agent (the kubelet's extra methods)."""

    @abc.abstractmethod
    def set_kubelet_error(self, err: BaseException) -> None:
        """Report an error that makes the node not ready."""

    @abc.abstractmethod
    def get_csi_driver(self, name: str) -> V1CSIDriver | None:
        """The ``V1CSIDriver`` object named ``name``, or None if there is none."""

    @abc.abstractmethod
    def wait_for_cache_sync(self) -> None:
        """Block until CSIDriver information is loaded."""


class AttachDetachVolumeHost(VolumeHost):
    """A host that is an attach/detach controller."""

    @abc.abstractmethod
    def get_csi_node(self, name: str) -> V1CSINode | None:
        """The ``V1CSINode`` object for node ``name``, or None."""

    @abc.abstractmethod
    def get_csi_driver(self, name: str) -> V1CSIDriver | None:
        """The ``V1CSIDriver`` object named ``name``, or None."""

    @abc.abstractmethod
    def list_volume_attachments(self) -> list[V1VolumeAttachment]:
        """Every ``V1VolumeAttachment`` object."""

    def is_attach_detach_controller(self) -> bool:
        """Always True: marks a host as the attach/detach controller."""
        return True
