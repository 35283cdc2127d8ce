"""``ephemeral``: CSI inline volumes (a ``csi:`` volume in the pod spec, published with the
driver's volume attributes and ``csi.storage.k8s.io/ephemeral: "true"``, never staged; the
driver makes the volume at NodePublishVolume and removes it at NodeUnpublishVolume), and
generic ephemeral volumes (a claim ``<pod>-<volume>`` the ephemeral volume controller made
from the pod's template: on the node, the PersistentVolume path).

Inline volumes are checked only when the driver's CSIDriver object (``--csidriver``) lists
the ``Ephemeral`` lifecycle mode: nothing in CSI itself says a driver makes them. The
kubelet adds ``csi.storage.k8s.io/ephemeral`` only with the pod information
(``podInfoOnMount: true``), which is how a driver serving both kinds tells them apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kubevol.csi import types as t
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
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped
from kubevol.testing.e2e.session import NAMESPACE, Session

#: The volume context key the kubelet adds for an inline volume.
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"
#: The pod volume name of the inline volume (its spec name: the directory under the pod).
INLINE = "inline"


def _marked_ephemeral(request: str) -> bool:
    """Whether a recorded NodePublishVolume request has ``csi.storage.k8s.io/ephemeral:
    "true"`` in its volume context (with podInfoOnMount a persistent volume has "false")."""
    return f'key: "{EPHEMERAL_KEY}" value: "true"' in " ".join(request.split())


def _need_inline(s: Session) -> Manifest:
    """The CSIDriver object with the Ephemeral mode; CheckSkipped unless the driver's own
    object lists it."""
    given = s.config.csidriver
    spec = given.get("spec") if given is not None else None
    modes = spec.get("volumeLifecycleModes") if isinstance(spec, Mapping) else None
    if not isinstance(modes, list) or "Ephemeral" not in modes:
        raise CheckSkipped(
            "the driver's CSIDriver object does not list the Ephemeral volumeLifecycleMode "
            + ("(give it with --csidriver FILE)" if given is None else f"(it lists {modes})")
            + ": the kubelet publishes inline volumes only to such a driver")
    return s.csidriver_object()


def _inline_volume(s: Session, *, read_only: bool = False,
                   name: str = INLINE) -> Mapping[str, object]:
    csi: dict[str, object] = {"driver": s.info.name,
                              "volumeAttributes": dict(s.config.ephemeral_attributes)}
    if read_only:
        csi["readOnly"] = True
    return {"name": name, "csi": csi}


def _run_inline(s: Session, doing: str, *, read_only: bool = False) -> str:
    driver = _need_inline(s)
    return s.run_pod([], doing, pod_volumes=[_inline_volume(s, read_only=read_only)],
                     mounts=[{"name": INLINE, "mountPath": "/mnt/inline"}], objects=[driver])


def _expect_inline_requests(s: Session, mark: int, why: str) -> None:
    """The node side published the inline volume as the kubelet does (it never stages one,
    and marks it ephemeral), and the driver answered OK."""
    if s.calls("NodeStageVolume", mark):
        raise CheckFailed("the node side staged an inline volume", expected="no NodeStage",
                          why=why + "; the kubelet publishes inline volumes only")
    published = s.relay.calls_since(mark, ("NodePublishVolume",))
    if s.csidriver_spec("podInfoOnMount") is True and (
            not published or not _marked_ephemeral(published[-1].request)):
        raise CheckFailed(f"NodePublishVolume lacked {EPHEMERAL_KEY}",
                          expected=f'volume_context {EPHEMERAL_KEY}: "true"',
                          why=why + "; the kubelet adds it with the pod information "
                                    "(podInfoOnMount)")


def _listed(s: Session) -> set[str] | None:
    """The volume ids ListVolumes answers (None without LIST_VOLUMES)."""
    if t.ControllerCapability.LIST_VOLUMES not in s.info.controller:
        return None
    ids: set[str] = set()
    token = ""
    for _ in range(1000):
        page = s.client.list_volumes(starting_token=token)
        ids |= {e.volume.volume_id for e in page.entries}
        token = page.next_token
        if not token:
            break
    return ids


def inline_read_write(s: Session) -> None:
    _need_inline(s)
    before = _listed(s)
    mark = s.relay.mark()
    uid = _run_inline(s, "starting a pod with an inline volume")
    why = ("ephemeral.go 'should create read/write inline ephemeral volume': the driver makes "
           "the volume at NodePublishVolume (volume_context has the volume attributes and, "
           f"with podInfoOnMount, {EPHEMERAL_KEY}: \"true\") and publishes it read-write")
    _expect_inline_requests(s, mark, why)
    path = s.box.volume_path(uid, INLINE)
    expect_mounted(path, "NodePublishVolume")
    data = payload(8192, uid)
    write_file(os.path.join(path, "data"), data, "the pod")
    read_back(os.path.join(path, "data"), data, "the pod", why)
    mark = s.relay.mark()
    s.delete_pod(uid, "deleting the pod")
    if not s.calls("NodeUnpublishVolume", mark):
        raise CheckFailed("the inline volume was not unpublished", why=why,
                          expected="NodeUnpublishVolume (the driver removes the volume)")
    after = _listed(s)
    if before is not None and after is not None and after - before:
        raise CheckFailed(
            f"after the pod's NodeUnpublishVolume the driver still lists volume(s) "
            f"{sorted(after - before)} it made for the inline volume",
            expected="the inline volume removed (ListVolumes as before the pod)",
            why=why + "; an inline volume lives as long as its pod: the driver removes it "
                      "at NodeUnpublishVolume")


def inline_read_only(s: Session) -> None:
    uid = _run_inline(s, "starting a pod with a read-only inline volume", read_only=True)
    path = s.box.volume_path(uid, INLINE)
    expect_mounted(path, "NodePublishVolume")
    expect_read_only(
        path, what="the read-only inline volume", writer="a pod whose inline volume is readOnly",
        why="ephemeral.go 'should create read-only inline ephemeral volume': the kubelet "
            "sends readonly=true for csi.readOnly; CSI spec: the SP MUST publish it read-only")


def inline_two_pods(s: Session) -> None:
    first = _run_inline(s, "starting the first pod with an inline volume")
    second = _run_inline(s, "starting a second pod with the same inline volume definition")
    why = ("ephemeral.go 'should support two pods which have the same volume definition': "
           "each pod gets a volume of its own (its handle is csi-<sha256(pod UID + volume "
           "name)>), made at its NodePublishVolume and removed at its NodeUnpublishVolume")
    p1, p2 = s.box.volume_path(first, INLINE), s.box.volume_path(second, INLINE)
    expect_mounted(p2, "NodePublishVolume")
    write_file(os.path.join(p1, "from-first"), payload(4096, first), "the first pod")
    if os.path.lexists(os.path.join(p2, "from-first")):
        raise CheckFailed(
            "what the first pod wrote to its inline volume is in the second pod's inline "
            "volume: the two pods share one volume",
            expected="a volume per pod (per volume handle), whatever the attributes", why=why)
    s.delete_pod(first, "deleting the first pod")
    expect_mounted(p2, "NodePublishVolume")
    write_file(os.path.join(p2, "after"), payload(4096, second),
               "the second pod, after the first was deleted")
    third = _run_inline(s, "starting a third pod with the same inline volume definition")
    if os.listdir(s.box.volume_path(third, INLINE)):
        raise CheckFailed(
            "a new pod's inline volume is not empty: "
            f"{sorted(os.listdir(s.box.volume_path(third, INLINE)))[:5]}",
            expected="a new, empty volume", why=why)


def inline_multiple(s: Session) -> None:
    driver = _need_inline(s)
    names = (INLINE, INLINE + "-2")
    uid = s.run_pod([], "starting a pod with two inline volumes",
                    pod_volumes=[_inline_volume(s, name=n) for n in names],
                    mounts=[{"name": n, "mountPath": f"/mnt/{n}"} for n in names],
                    objects=[driver])
    why = ("ephemeral.go 'should support multiple inline ephemeral volumes': each inline "
           "volume of a pod is a volume of its own")
    first, second = (s.box.volume_path(uid, n) for n in names)
    for path in (first, second):
        expect_mounted(path, "NodePublishVolume")
    write_file(os.path.join(first, "in-first"), payload(1024, uid), "the pod")
    if os.path.lexists(os.path.join(second, "in-first")):
        raise CheckFailed(
            f"what the pod wrote to its inline volume {names[0]!r} is in its inline volume "
            f"{names[1]!r}: the two share one volume",
            expected="a volume per inline volume (per handle)", why=why)


def generic_ephemeral(s: Session) -> None:
    vol = s.create_volume()
    uid, pod = s.pod([], pod_volumes=[{
        "name": "scratch",
        "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": str(vol.capacity)}}}}},
    }], mounts=[{"name": "scratch", "mountPath": "/scratch"}])
    metadata = pod["metadata"]
    pod_name = metadata["name"] if isinstance(metadata, Mapping) else ""
    pv, pvc = s.claim_objects(vol)[-2:]
    # The claim the ephemeral volume controller makes: <pod>-<volume>, owned by the pod.
    claim: Manifest = {**pvc, "metadata": {
        "name": f"{pod_name}-scratch", "namespace": NAMESPACE,
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                             "uid": uid, "controller": True}]}}
    mark = s.relay.mark()
    s.box.run_pods([pv, claim, pod], "starting a pod with a generic ephemeral volume")
    why = ("ephemeral.go 'should create read/write inline ephemeral volume' "
           "(GenericEphemeralVolume): the pod's claim is provisioned like any other and "
           "staged and published as a PersistentVolume")
    path = s.box.volume_path(uid, vol.name)
    expect_mounted(path, "NodePublishVolume")
    if any(_marked_ephemeral(c.request)
           for c in s.relay.calls_since(mark, ("NodePublishVolume",))):
        raise CheckFailed(f'a generic ephemeral volume was published with {EPHEMERAL_KEY}: '
                          '"true"',
                          expected="a persistent publish", why=why)
    data = payload(8192, vol.handle)
    write_file(os.path.join(path, "data"), data, "the pod")
    read_back(os.path.join(path, "data"), data, "the pod", why)


EPHEMERAL_CHECKS: tuple[Check, ...] = (
    check("ephemeral/inline-read-write",
          "ephemeral.go: should create read/write inline ephemeral volume", inline_read_write),
    check("ephemeral/inline-read-only",
          "ephemeral.go: should create read-only inline ephemeral volume", inline_read_only),
    check("ephemeral/inline-two-pods-same-definition",
          "ephemeral.go: should support two pods which have the same volume definition",
          inline_two_pods),
    check("ephemeral/inline-multiple",
          "ephemeral.go: should support multiple inline ephemeral volumes", inline_multiple),
    check("ephemeral/generic-read-write", "ephemeral.go: should create read/write inline "
          "ephemeral volume (GenericEphemeralVolume)", generic_ephemeral),
)
