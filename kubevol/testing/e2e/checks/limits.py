"""What a driver says about its node, held to it: ``readwriteoncepod`` (a ReadWriteOncePod
volume in use is not published to a second pod), ``volumelimits`` (NodeGetInfo's
``max_volumes_per_node``: reported as the kubelet reports it, and that many volumes really
served on the node at once) and ``topology`` (NodeGetInfo's ``accessible_topology``,
well-formed, and consistent with where CreateVolume says a volume is accessible).

In a cluster the scheduler keeps a second pod of a ReadWriteOncePod claim and pods beyond
the volume limit off the node; on the node what is left is the driver's word, which these
checks take.
"""

from __future__ import annotations

import contextlib
import os
import re

from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError, StatusCode
from kubevol.errors import KubevolError
from kubevol.plugins.csi import CSI_PLUGIN_NAME, CSIPlugin, attach_limit_key
from kubevol.testing.e2e.checks.core import (
    Check,
    check,
    expect_mounted,
    payload,
    read_back,
    write_file,
)
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped
from kubevol.testing.e2e.session import Session, Volume, is_mount_point

NC = t.NodeCapability
#: Volumes the volume limit check fills the node with at most (a larger limit is only
#: checked as reported).
MAX_FILL = 8
#: How long a pod the driver should refuse is given (seconds).
REFUSAL_WAIT = 3.0

# Kubernetes' label syntax (k8s.io/apimachinery validation): a qualified name for keys, a
# label value for values.
_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)"
QUALIFIED_NAME = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")


# -- readwriteoncepod ---------------------------------------------------------------------------


def second_pod_refused(s: Session) -> None:
    s.need_node(NC.SINGLE_NODE_MULTI_WRITER,
                "only then does the kubelet publish a ReadWriteOncePod volume "
                "SINGLE_NODE_SINGLE_WRITER")
    vol = s.create_volume(access_mode="ReadWriteOncePod")
    mark = s.relay.mark()
    first = s.run_pod([vol], "starting a pod with a ReadWriteOncePod claim")
    why = ("readwriteoncepod.go 'should block a second pod from using an in-use "
           "ReadWriteOncePod volume on the same node': the kubelet refuses the second pod "
           "itself ('volume uses the ReadWriteOncePod access mode and is already in use by "
           "another pod') and publishes a ReadWriteOncePod volume SINGLE_NODE_SINGLE_WRITER, "
           "which CSI allows at one target only")
    sent = s.calls("NodePublishVolume", mark) + s.calls("NodeStageVolume", mark)
    if not sent or not all("SINGLE_NODE_SINGLE_WRITER" in c for c in sent):
        raise CheckFailed("the node side did not send SINGLE_NODE_SINGLE_WRITER for a "
                          "ReadWriteOncePod claim", expected="access_mode "
                          "SINGLE_NODE_SINGLE_WRITER in NodeStage and NodePublish", why=why)
    data = payload(4096, vol.handle)
    if not s.config.mock:
        write_file(os.path.join(s.box.volume_path(first, vol.name), "own"), data,
                   "the first pod")
    uid, pod = s.pod([vol])
    mark = s.relay.mark()
    s.box.try_pods([*s.claim_objects(vol)[-2:], pod],
                   "starting a second pod with the same ReadWriteOncePod claim",
                   timeout=min(REFUSAL_WAIT, s.config.timeout))
    target = s.box.volume_path(uid, vol.name)
    published = [c for c in s.relay.calls_since(mark, ("NodePublishVolume",)) if c.ok]
    if published or is_mount_point(target):
        raise CheckFailed(
            "a second pod on the node got the ReadWriteOncePod volume the first pod uses "
            f"(NodePublishVolume at {target} answered OK)",
            expected="NodePublishVolume refused (FAILED_PRECONDITION): the volume is "
                     "published SINGLE_NODE_SINGLE_WRITER at another target", why=why)
    if not s.config.mock:
        _second_target_refused(s, vol, why)
    if not s.config.mock:
        read_back(os.path.join(s.box.volume_path(first, vol.name), "own"), data,
                  "the first pod, after the second was refused", why)
    # Upstream then deletes the first pod and sees the second one start.
    s.delete_pod(first, "deleting the first pod: the second one may now start")
    if not s.config.mock:
        expect_mounted(target, "NodePublishVolume")
        read_back(os.path.join(target, "own"), data, "the second pod, once the first left",
                  why + "; once the first pod is gone the second gets the volume")


def _second_target_refused(s: Session, vol: Volume, why: str) -> None:
    """The kubelet never asks for it (it refuses the second pod itself), so the check asks
    the driver directly what CSI requires of it: a NodePublishVolume of a
    SINGLE_NODE_SINGLE_WRITER volume at a second target fails with FAILED_PRECONDITION."""
    target = os.path.join(s.box.root, "e2e-second-target")
    capability = t.VolumeCapability.mount(access_mode=t.AccessMode.SINGLE_NODE_SINGLE_WRITER)
    try:
        s.client.node_publish_volume(
            vol.handle, target, capability, staging_target_path=s.box.staging_path(vol.name),
            volume_context=vol.context,
            secrets=s.config.secrets.for_rpc("NodePublishVolume"))
    except CSIRPCError as exc:
        if exc.code is StatusCode.FAILED_PRECONDITION:
            return
        raise CheckFailed(
            f"NodePublishVolume at a second target answered {exc}",
            expected="FAILED_PRECONDITION", why=why) from exc
    with contextlib.suppress(KubevolError):
        s.client.node_unpublish_volume(vol.handle, target)
    raise CheckFailed(
        "a second pod on the node got the ReadWriteOncePod volume the first pod uses: the "
        f"driver published it SINGLE_NODE_SINGLE_WRITER at a second target ({target})",
        expected="FAILED_PRECONDITION (CSI spec NodePublishVolume: a volume published "
                 "SINGLE_NODE_SINGLE_WRITER at one target is refused at another)", why=why)


# -- volumelimits -------------------------------------------------------------------------------


def volume_limit(s: Session) -> None:
    limit = s.client.node_get_info().max_volumes_per_node
    if limit <= 0:
        raise CheckSkipped("NodeGetInfo reports no max_volumes_per_node (no limit)")
    why = ("volumelimits.go 'should verify that all csinodes have volume limits' and "
           "'should support volume limits': the kubelet publishes max_volumes_per_node as "
           "the node's allocatable count for the driver, and the scheduler places up to "
           "that many volumes on the node")
    plugin = s.box.runtime.mgr.find_plugin_by_name(CSI_PLUGIN_NAME)
    limits = plugin.get_volume_limits() if isinstance(plugin, CSIPlugin) else {}
    key = attach_limit_key(s.info.name)
    if limits.get(key) != limit:
        raise CheckFailed(f"the node side reports {key}={limits.get(key)}, the driver "
                          f"{limit}", expected=f"{key}={limit}", why=why)
    if limit > MAX_FILL:
        return
    volumes = [s.create_volume() for _ in range(limit)]
    try:
        uid = s.run_pod(volumes, f"starting a pod with {limit} volumes (the driver's limit)")
    except CheckFailed as exc:
        raise CheckFailed(
            f"NodeGetInfo says max_volumes_per_node {limit}, but a pod with {limit} volumes "
            f"could not start: {exc.what}",
            expected=f"{limit} volumes in use on the node at once", why=why) from exc
    for v in volumes if not s.config.mock else ():
        expect_mounted(s.box.volume_path(uid, v.name), "NodePublishVolume")


# -- topology -----------------------------------------------------------------------------------


def node_topology(s: Session) -> None:
    if t.PluginServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS not in s.info.plugin.services:
        raise CheckSkipped("the driver does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS")
    why = ("topology.go 'should provision a volume and schedule a pod with "
           "AllowedTopologies': the kubelet labels the node (CSINode topologyKeys) with "
           "NodeGetInfo's accessible_topology; a volume is placed where CreateVolume's "
           "accessible_topology matches those labels")
    try:
        node = s.client.node_get_info().accessible_topology
    except KubevolError as exc:
        raise CheckFailed(f"NodeGetInfo failed: {exc}", expected="OK", why=why) from exc
    if node is None or not node.segments:
        raise CheckFailed(
            "the driver advertises VOLUME_ACCESSIBILITY_CONSTRAINTS but NodeGetInfo reports "
            "no accessible_topology", expected="the node's topology segments", why=why)
    bad = [f"{k!r}: {v!r}" for k, v in node.segments.items()
           if len(k) > 316 or not QUALIFIED_NAME.match(k) or not LABEL_VALUE.match(v)]
    if bad:
        raise CheckFailed(
            f"NodeGetInfo's accessible_topology has segments that are not labels: {bad}",
            expected="keys that are qualified names ([prefix/]name) and label values",
            why=why + "; CSI spec Topology: keys and values follow Kubernetes label syntax")
    vol = s.create_volume(topology=t.TopologyRequirement(requisite=(node,), preferred=(node,)))
    if not vol.topology:
        raise CheckFailed("CreateVolume with the node's topology as requisite answered no "
                          "accessible_topology", expected="where the volume is accessible",
                          why=why)
    here = [z for z in vol.topology
            if all(node.segments.get(k) == v for k, v in z.segments.items())]
    if not here:
        zones = [dict(z.segments) for z in vol.topology]
        raise CheckFailed(
            f"CreateVolume says the volume is accessible in {zones}, none of which is this "
            f"node ({dict(node.segments)}), though the node's topology was requisite",
            expected="a segment of this node", why=why)
    uid = s.run_pod([vol], "starting a pod on the node")
    if not s.config.mock:
        expect_mounted(s.box.volume_path(uid, vol.name), "NodePublishVolume")


LIMITS_CHECKS: tuple[Check, ...] = (
    check("readwriteoncepod/second-pod-refused", "readwriteoncepod.go: should block a second "
          "pod from using an in-use ReadWriteOncePod volume on the same node",
          second_pod_refused, data=False),
    check("volumelimits/limit-honoured", "volumelimits.go: should support volume limits "
          "(and: should verify that all csinodes have volume limits)", volume_limit,
          data=False),
    check("topology/node-topology", "topology.go: should provision a volume and schedule a "
          "pod with AllowedTopologies", node_topology, data=False),
)
