"""More ``subpath`` cases: a subPathExpr, a subPath of a read-only claim, a subPath that is
a symlink out of the volume (refused), a subPath removed while the pod uses it, and the
subPath binds across a restart of the node side (the "container" started again).

The subPath binds are the node side's (kubevol's ``mount.subpath``), over the volume the
driver published: a driver that does not publish the volume, or publishes it read-write
when asked read-only, fails here; the other cases guard the node side itself.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from kubevol.testing.e2e.box import Manifest
from kubevol.testing.e2e.checks.core import (
    Check,
    check,
    expect_mounted,
    expect_read_only,
    payload,
    read_back,
    write_file,
)
from kubevol.testing.e2e.report import CheckFailed
from kubevol.testing.e2e.session import Session, Volume, is_mount_point

#: The index of the first extra volumeMount of container ``c`` (after the claim's own).
FIRST_EXTRA = 1


def _prepare(s: Session, vol: Volume, make: dict[str, bytes], links: Mapping[str, str] = (
        {})) -> None:
    """A first pod makes files (``make``: path -> data) and symlinks in the volume."""
    uid = s.run_pod([vol], "starting a pod that prepares the volume")
    root = s.box.volume_path(uid, vol.name)
    expect_mounted(root, "NodePublishVolume")
    for rel, data in make.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        write_file(os.path.join(root, rel), data, "the preparing pod")
    for rel, target in links.items():
        os.symlink(target, os.path.join(root, rel))
    s.delete_pod(uid, "deleting the preparing pod")


def _with_env(pod: Manifest, env: list[Mapping[str, object]]) -> Manifest:
    spec = pod["spec"]
    assert isinstance(spec, Mapping)
    containers = spec["containers"]
    assert isinstance(containers, list)
    return {**pod, "spec": {**spec, "containers": [{**containers[0], "env": env},
                                                   *containers[1:]]}}


def subpath_expr(s: Session) -> None:
    vol = s.create_volume()
    uid, pod = s.pod([vol], mounts=[{"name": "v0", "mountPath": "/logs",
                                     "subPathExpr": "$(POD_NAME)"}])
    pod = _with_env(pod, [{"name": "POD_NAME",
                           "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
    metadata = pod["metadata"]
    name = str(metadata["name"]) if isinstance(metadata, Mapping) else ""
    s.box.run_pods([*s.claim_objects(vol)[-2:], pod], "starting a pod with a subPathExpr")
    why = ("common/node/expansion.go 'Variable Expansion should allow substituting values in "
           "a volume subpath': subPathExpr $(POD_NAME) binds the volume's directory named "
           "after the pod")
    expect_mounted(s.box.volume_path(uid, vol.name), "NodePublishVolume")
    bound = s.box.subpath(uid, vol.name, "c", FIRST_EXTRA)
    data = payload(2048, name)
    write_file(os.path.join(bound, "log"), data, "the pod, through its subPathExpr")
    read_back(os.path.join(s.box.volume_path(uid, vol.name), name, "log"), data,
              "the pod, through the volume root", why)


def subpath_read_only_volume(s: Session) -> None:
    vol = s.create_volume()
    data = payload(1024, "ro")
    _prepare(s, vol, {"sub/dir/file": data})
    uid = s.run_pod([vol], "starting a pod whose readOnly claim has a subPath", read_only=True,
                    mounts=[{"name": "v0", "mountPath": "/sub", "subPath": "sub/dir"}])
    why = ("subpath.go 'should support existing directories when readOnly specified in the "
           "volumeSource' and 'should verify container cannot write to subpath readonly "
           "volumes': the kubelet publishes a readOnly claim read-only (readonly=true), so "
           "its subPath binds are read-only too")
    bound = s.box.subpath(uid, vol.name, "c", FIRST_EXTRA)
    read_back(os.path.join(bound, "file"), data, "the pod, through its subPath", why)
    expect_read_only(bound, what="the read-only subPath",
                     writer="through a subPath of its readOnly claim, a pod", why=why)


def subpath_symlink_outside(s: Session) -> None:
    vol = s.create_volume()
    _prepare(s, vol, {}, links={"escape": "/etc", "backstep": "../../../../../../etc"})
    why = ("subpath.go 'should fail if subpath directory is outside the volume' and 'should "
           "fail if subpath with backstepping is outside the volume': a subPath that resolves "
           "out of the volume is refused, nothing of the host is bound into the container")
    links = {"escape": "/etc", "backstep": "../../../../../../etc"}
    for index, (link, target) in enumerate(links.items()):
        uid, pod = s.pod([vol], mounts=[{"name": "v0", "mountPath": "/x", "subPath": link}])
        s.box.try_pods([*s.claim_objects(vol)[-2:], pod],
                       f"starting a pod whose subPath {link!r} is a symlink out of the volume",
                       timeout=min(2.0, s.config.timeout))
        bound = s.box.subpath(uid, vol.name, "c", FIRST_EXTRA)
        if is_mount_point(bound) or os.path.exists(os.path.join(bound, "passwd")):
            raise CheckFailed(
                f"the subPath {link!r} (a symlink to {target!r}) was bound at {bound}",
                expected="the pod refused (subPath outside the volume)", why=why)
        s.delete_pod(uid, f"deleting the refused pod {index + 1}")


def subpath_removed_in_use(s: Session) -> None:
    vol = s.create_volume()
    data = payload(1024, "gone")
    _prepare(s, vol, {"sub/dir/file": data})
    uid = s.run_pod([vol], "starting a pod with a directory subPath",
                    mounts=[{"name": "v0", "mountPath": "/sub", "subPath": "sub/dir"}])
    bound = s.box.subpath(uid, vol.name, "c", FIRST_EXTRA)
    read_back(os.path.join(bound, "file"), data, "the pod, through its subPath",
              "subpath.go 'should support existing directory'")
    shutil.rmtree(os.path.join(s.box.volume_path(uid, vol.name), "sub"))
    # Tearing down must unbind the removed directory and unpublish the volume; Session.close
    # then finds no mount left under the root.
    s.delete_pod(uid, "deleting the pod whose subPath directory was removed")
    if os.path.lexists(os.path.join(s.box.root, "pods", uid)):
        raise CheckFailed("the pod's directory is left after its subPath directory was removed"
                          " and the pod deleted", expected="the pod torn down",
                          why="subpath.go 'should be able to unmount after the subpath "
                              "directory is deleted': the kubelet unmounts the subPath bind "
                              "whatever happened below it")


def subpath_restart(s: Session) -> None:
    vol = s.create_volume()
    data = payload(1024, "restart")
    _prepare(s, vol, {"sub/dir/file": data})
    uid = s.run_pod([vol], "starting a pod with a directory subPath",
                    mounts=[{"name": "v0", "mountPath": "/sub", "subPath": "sub/dir"}])
    bound = s.box.subpath(uid, vol.name, "c", FIRST_EXTRA)
    why = ("subpath.go 'should support restarting containers using directory as subpath': "
           "the subPath bind is made again (or kept) when the container starts again, "
           "showing the same directory of the volume")
    s.box.kill()
    s.box.start()
    s.box.sync("syncing after the node side restarted")
    if not is_mount_point(bound):
        raise CheckFailed(f"the subPath bind {bound} is gone after the restart",
                          expected="the bind kept or made again", why=why)
    read_back(os.path.join(bound, "file"), data, "the pod after the restart", why)
    write_file(os.path.join(bound, "after"), data, "the pod after the restart")
    read_back(os.path.join(s.box.volume_path(uid, vol.name), "sub", "dir", "after"), data,
              "the volume root after the restart", why)


SUBPATH_CHECKS: tuple[Check, ...] = (
    check("subpath/subpathexpr", "../common/node/expansion.go: Variable Expansion should allow "
          "substituting values in a volume subpath", subpath_expr),
    check("subpath/read-only-volume", "subpath.go: should support existing directories when "
          "readOnly specified in the volumeSource", subpath_read_only_volume),
    check("subpath/symlink-outside-refused", "subpath.go: should fail if subpath directory is "
          "outside the volume", subpath_symlink_outside),
    check("subpath/removed-while-in-use", "subpath.go: should be able to unmount after the "
          "subpath directory is deleted", subpath_removed_in_use),
    check("subpath/restart", "subpath.go: should support restarting containers using "
          "directory as subpath", subpath_restart),
)
