"""What the bundled drivers share: version information (as YAML, like the Azure Lustre
driver's ``GetVersionYAML``), the user agent they send, the default node id, and serving a
driver in the background on a temporary socket."""

from __future__ import annotations

import contextlib
import platform
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import attrs
import yaml

from kubevol._version import __version__
from kubevol.csidriver.server import DEFAULT_GRACE, ServerHandle, StoragePlugin, serve_in_background
from kubevol.util.buildinfo import build_date, git_commit


def default_node_id() -> str:
    """This machine's host name, the node id drivers report unless told otherwise."""
    return socket.gethostname() or "localhost"


#: The host name at import time, the default ``--node-id``.
DEFAULT_NODE_ID = default_node_id()


def kubevol_version() -> str:
    """The running kubevol's version."""
    return __version__


def version_info(driver_name: str, driver_version: str | None = None) -> dict[str, str]:
    """Driver name and version, git commit, build date, Python version and platform."""
    return {
        "driverName": driver_name,
        "driverVersion": driver_version or kubevol_version(),
        "gitCommit": git_commit(),
        "buildDate": build_date(),
        "pythonVersion": platform.python_version(),
        "compiler": sys.implementation.name,
        "platform": f"{sys.platform}/{platform.machine()}",
    }


def version_yaml(driver_name: str, driver_version: str | None = None) -> str:
    """:func:`version_info` as a YAML document (keys in the order above)."""
    return yaml.safe_dump(version_info(driver_name, driver_version), sort_keys=False)


def user_agent(
    driver_name: str, *, driver_version: str | None = None, custom: str = "", suffix: str = ""
) -> str:
    """``NAME/VERSION kubevol/VERSION python/VERSION (PLATFORM)``, or ``custom`` when given,
    with `` suffix`` appended when given."""
    info = version_info(driver_name, driver_version)
    agent = custom or (
        f"{driver_name}/{info['driverVersion']} kubevol/{kubevol_version()} "
        f"python/{info['pythonVersion']} ({info['platform']})"
    )
    return f"{agent} {suffix}" if suffix else agent


# --- serving in the background ------------------------------------------------------


@attrs.define
class RunningDriver:
    """A driver served on worker threads; :meth:`stop` stops serving, then runs the
    driver's cleanup and removes the temporary socket directory, if one was made."""

    handle: ServerHandle
    cleanup: Callable[[], None] | None = None
    temp_dir: str | None = None

    @property
    def endpoint(self) -> str:
        """``unix:///.../csi.sock``, for :class:`~kubevol.csi.client.CSIClient`."""
        return self.handle.address

    def stop(self, grace: float | None = DEFAULT_GRACE) -> None:
        """Drain calls, stop, clean up. Idempotent."""
        self.handle.stop(grace)
        if self.cleanup is not None:
            cleanup, self.cleanup = self.cleanup, None
            cleanup()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None

    def __enter__(self) -> RunningDriver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(grace=5.0)


def serve_plugin(
    plugin: StoragePlugin,
    endpoint: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cleanup: Callable[[], None] | None = None,
    **serve_kwargs: Any,
) -> RunningDriver:
    """Serve ``plugin`` in the background; on a fresh ``csi.sock`` in a private temporary
    directory (mode 0700) when ``endpoint`` is None.

    ``env`` are the framework's ``X_CSI_*`` settings (default: none, so the calling
    process's environment does not change how an embedded driver behaves). ``cleanup`` runs
    after the server stopped. Raises like :func:`~kubevol.csidriver.server.serve_in_background`.
    """
    temp_dir = None
    if endpoint is None:
        temp_dir = tempfile.mkdtemp(prefix="kubevol-csi-")
        endpoint = f"unix://{temp_dir}/csi.sock"
    try:
        handle = serve_in_background(
            plugin, endpoint, env={} if env is None else env, **serve_kwargs
        )
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        if cleanup is not None:
            with contextlib.suppress(Exception):
                cleanup()
        raise
    return RunningDriver(handle=handle, cleanup=cleanup, temp_dir=temp_dir)
