"""The subPath mounts of a pod's containers, as the kubelet makes them before a container
starts (``makeMounts``) and removes them before a volume is torn down.

For each container (init containers first) and each ``volumeMounts[i]`` naming the volume
with a ``subPath`` (or a ``subPathExpr``, expanded from the container's environment), the
path inside the volume is created if missing (safely, with the volume root's mode) and bound
at ``pods/<uid>/volume-subpaths/<volume>/<container>/<i>`` by
:func:`kubevol.mount.subpath.prepare_safe_subpath`. ``<volume>`` is the volume's inner spec
name (the PersistentVolume's name for a claim), as the kubelet names it.
"""

from __future__ import annotations

import logging
import os
import stat

from kubevol.errors import SpecError
from kubevol.k8s.pod import Pod, pod_containers
from kubevol.k8s.podenv import container_env, expand_sub_path_expr
from kubevol.mount.subpath import (
    Subpath,
    SubPathError,
    clean_subpaths,
    prepare_safe_subpath,
    safe_make_dir,
    validate_sub_path,
)
from kubevol.node.host import NodeVolumeHost

log = logging.getLogger(__name__)


def wanted_subpaths(
    host: NodeVolumeHost, pod: Pod, *, pod_uid: str, outer_name: str, spec_name: str,
    volume_path: str,
) -> list[Subpath]:
    """The subPaths of volume ``outer_name`` (the pod's name for it) in ``pod``'s containers.

    Raises :class:`~kubevol.errors.SpecError` naming the container and mount when a subPath
    is invalid or a subPathExpr cannot be expanded.
    """
    out: list[Subpath] = []
    pod_dir = host.get_pod_dir(pod_uid)
    for container in pod_containers(pod):
        env: dict[str, str] | None = None
        for index, mount in enumerate(getattr(container, "volume_mounts", None) or []):
            if mount.name != outer_name or not (mount.sub_path or mount.sub_path_expr):
                continue
            where = f"volumeMount {mount.name!r} of container {container.name!r}"
            sub = str(mount.sub_path or "")
            if mount.sub_path_expr:
                if env is None:
                    env = container_env(
                        pod, container, node_name=host.get_node_name(),
                        host_ip=_host_ip(host), node_allocatable=host.get_node_allocatable(),
                        get_config_map=host.get_config_map_func(),
                    )
                try:
                    sub = expand_sub_path_expr(str(mount.sub_path_expr), env)
                except SpecError as exc:
                    raise SpecError(f"{where}: subPathExpr: {exc}") from exc
            try:
                validate_sub_path(sub)
            except SubPathError as exc:
                raise SubPathError(f"{where}: {exc}") from exc
            out.append(Subpath(
                volume_mount_index=index, path=os.path.join(volume_path, sub),
                volume_name=spec_name, volume_path=volume_path, pod_dir=pod_dir,
                container_name=str(container.name),
            ))
    return out


def _host_ip(host: NodeVolumeHost) -> str:
    try:
        return host.get_host_ip()
    except OSError:
        return ""


def set_up_subpaths(host: NodeVolumeHost, subpaths: list[Subpath]) -> list[str]:
    """Create (if missing) and bind each subPath; returns the bind targets. Idempotent.

    A subPath that escapes its volume raises SubPathError naming the container and mount.
    """
    mounter = host.get_mounter()
    targets = []
    for sp in subpaths:
        where = f"volumeMount {sp.volume_mount_index} of container {sp.container_name!r}"
        try:
            if not os.path.lexists(sp.path):
                # Made now so it has the volume root's mode (as the kubelet does), not the
                # mode a container runtime would give it.
                mode = stat.S_IMODE(os.stat(sp.volume_path).st_mode)
                safe_make_dir(os.path.relpath(sp.path, sp.volume_path), sp.volume_path, mode)
            targets.append(prepare_safe_subpath(mounter, sp))
        except (SubPathError, OSError) as exc:
            raise SubPathError(
                f"failed to prepare subPath for {where} (volume {sp.volume_name!r}): {exc}"
            ) from exc
    return targets


def tear_down_subpaths(host: NodeVolumeHost, pod_uid: str, spec_name: str) -> None:
    """Unmount and remove every subPath bind of the volume (before the volume itself)."""
    clean_subpaths(host.get_mounter(), host.get_pod_dir(pod_uid), spec_name)


