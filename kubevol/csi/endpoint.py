"""CSI endpoint strings: ``unix:///path.sock``, ``tcp://host:port``, or a bare absolute path."""

from __future__ import annotations

import enum
import os

import attrs

from kubevol.csi.errors import CSIEndpointError


class Scheme(enum.StrEnum):
    """How an endpoint is reached."""

    UNIX = "unix"
    TCP = "tcp"


@attrs.frozen(kw_only=True)
class Endpoint:
    """A parsed endpoint: a unix socket ``path`` or a TCP ``host:port`` in ``address``."""

    scheme: Scheme
    address: str

    @property
    def grpc_target(self) -> str:
        """The target string grpc's channel and server understand."""
        if self.scheme is Scheme.UNIX:
            return f"unix://{self.address}"
        return self.address

    def __str__(self) -> str:
        return f"{self.scheme.value}://{self.address}"


def parse_endpoint(value: str, *, relative_to: str | None = None) -> Endpoint:
    """Parse ``value`` (gocsi's ``ParseProtoAddr`` forms).

    A relative unix path (``csi.sock``, ``unix://run/csi.sock``) is resolved against
    ``relative_to`` when given (a server resolves it against its working directory, as
    gocsi does); without it a relative path is refused. Raises :class:`CSIEndpointError`
    for an empty value, a refused relative path, an unknown scheme or a TCP address
    without a port.
    """
    text = value.strip()
    if not text:
        raise CSIEndpointError("CSI endpoint is empty")
    if text.startswith("unix://"):
        path = text[len("unix://") :]
        return Endpoint(scheme=Scheme.UNIX, address=_absolute(path, value, relative_to))
    if text.startswith("tcp://"):
        address = text[len("tcp://") :]
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise CSIEndpointError(f"CSI endpoint {value!r}: expected tcp://HOST:PORT")
        return Endpoint(scheme=Scheme.TCP, address=address)
    if "://" in text:
        raise CSIEndpointError(f"CSI endpoint {value!r}: scheme must be unix:// or tcp://")
    return Endpoint(scheme=Scheme.UNIX, address=_absolute(text, value, relative_to))


def _absolute(path: str, original: str, relative_to: str | None) -> str:
    if "\0" in path:
        raise CSIEndpointError(f"CSI endpoint {original!r}: socket path contains NUL")
    if not path.startswith("/"):
        if relative_to is None or not path:
            raise CSIEndpointError(f"CSI endpoint {original!r}: socket path must be absolute")
        return os.path.normpath(os.path.join(relative_to, path))
    return path
