"""The parts of a pod kubevol reads, as a structural type.

A pod is a ``kubernetes.client.V1Pod`` (an API server's, or one built from a manifest) or a
:class:`kubevol.spec.DeferredApiObject` of one; both fit :class:`Pod`. The kubernetes
client's models make every field optional, so the fields here are too. Only what kubevol
reads is named, read-only; what it only hands on (the pod's status, a container's
resources or environment) is ``object``, and is read with ``getattr`` where it is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class PodMetadata(Protocol):
    """A pod's ``metadata`` (``V1ObjectMeta``): who the pod is, and its downward-API maps."""

    @property
    def uid(self) -> str | None: ...

    @property
    def name(self) -> str | None: ...

    @property
    def namespace(self) -> str | None: ...

    @property
    def labels(self) -> Mapping[str, str] | None: ...

    @property
    def annotations(self) -> Mapping[str, str] | None: ...


class Container(Protocol):
    """A pod's container or init container (``V1Container``)."""

    @property
    def name(self) -> str | None: ...

    @property
    def env(self) -> Sequence[object] | None: ...

    @property
    def resources(self) -> object: ...


class PodSpec(Protocol):
    """A pod's ``spec`` (``V1PodSpec``): the fields volumes, tokens and the downward API
    read."""

    @property
    def node_name(self) -> str | None: ...

    @property
    def service_account_name(self) -> str | None: ...

    @property
    def security_context(self) -> object: ...

    @property
    def volumes(self) -> Sequence[object] | None: ...

    @property
    def containers(self) -> Sequence[Container] | None: ...

    @property
    def init_containers(self) -> Sequence[Container] | None: ...


class Pod(Protocol):
    """A pod as kubevol reads it (``V1Pod``): its metadata and spec; its status (host and
    pod IPs for the downward API) is read with ``getattr``."""

    @property
    def metadata(self) -> PodMetadata | None: ...

    @property
    def spec(self) -> PodSpec | None: ...

    @property
    def status(self) -> object: ...


def pod_containers(pod: Pod) -> list[Container]:
    """The pod's init containers and containers, in that order."""
    spec = pod.spec
    if spec is None:
        return []
    return [*(spec.init_containers or []), *(spec.containers or [])]
