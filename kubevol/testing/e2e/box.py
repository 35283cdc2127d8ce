"""The kubelet in the box: kubevol's node side (:class:`~kubevol.node.runtime.NodeRuntime`
with the ``kubernetes.io/csi`` plugin, and its node volume manager) on a private
kubelet-style root, running pods the checks write as manifests, as ``kubevol up`` and
``kubevol down`` run them.

Nothing here knows the driver beyond its name and endpoint: every CSI call goes through the
plugin, with the kubelet's exact requests and paths. :meth:`KubeletBox.kill` drops the node
side's memory (what a crash of the kubelet does); :meth:`KubeletBox.start` brings it back,
rebuilding what is in use from disk (reconstruction).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import attrs

from kubevol.node.desired import new_pods
from kubevol.node.host import NodeVolumeHost
from kubevol.node.manager import SyncResult
from kubevol.node.manifests import manifests_from_objects
from kubevol.node.reconstruct import Reconstruction
from kubevol.node.records import PodRecords, PodState
from kubevol.node.runtime import NodeRuntime, RecordedPods
from kubevol.plugins.csi import CSI_PLUGIN_NAME
from kubevol.testing.e2e.report import CheckFailed
from kubevol.util.lifecycle import ClosesOnExit
from kubevol.volume import Metrics

#: The kubelet's directory name for the CSI plugin (``kubernetes.io~csi``).
CSI_DIR = CSI_PLUGIN_NAME.replace("/", "~")

Manifest = Mapping[str, object]


class KubeletBox(ClosesOnExit):
    """The node side on ``root`` talking to driver ``driver_name`` at ``endpoint``.

    ``timeout`` bounds each :meth:`sync` (seconds). Close it to tear every pod down.
    """

    def __init__(
        self, root: str, *, driver_name: str, endpoint: str, node_name: str, timeout: float
    ) -> None:
        self.root = root
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.node_name = node_name
        self.timeout = timeout
        #: Objects the "API server" serves (Secrets): learnt again after each start.
        self.api_objects: list[Manifest] = []
        self.running: set[str] = set()
        self._runtime: NodeRuntime | None = None
        self._pods: RecordedPods | None = None
        #: What the last start rebuilt from disk.
        self.reconstructed: Reconstruction | None = None
        self.start()

    # -- life --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the node side: register the driver, rebuild the actual state from disk."""
        if self._runtime is not None:
            return
        self._runtime = NodeRuntime(
            self.root, node_name=self.node_name,
            csi_drivers={self.driver_name: self.endpoint}, entry_points=False,
            csi_timeout=self.timeout,
        )
        if self._runtime.unregistered:
            problems = "; ".join(self._runtime.unregistered.values())
            self.kill()
            raise CheckFailed(
                f"the driver could not be registered: {problems}",
                expected="NodeGetInfo answers with a node id",
                why="the kubelet's plugin watcher registers a driver through NodeGetInfo "
                    "before any volume of it is mounted",
            )
        if self.api_objects:
            self._runtime.learn(manifests_from_objects(self.api_objects, "the API server"))
        self._pods = self._runtime.volume_manager(workers=4, ask_api_server=False)
        self.reconstructed = self._pods.reconstruct()

    def kill(self) -> None:
        """Drop the node side's memory without tearing anything down (a kubelet crash)."""
        if self._pods is not None:
            self._pods.close(timeout=self.timeout)
            self._pods = None
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    @property
    def alive(self) -> bool:
        """Whether the node side runs (not killed)."""
        return self._runtime is not None

    def close(self) -> None:
        """Tear every pod down (started again if it was killed), then stop. Raises
        CheckFailed when something could not be torn down."""
        try:
            self.start()
            left = sorted(self.running)
            for uid in left:
                self.delete_pod(uid)
            if left:
                self.sync("tearing down the check's pods")
        finally:
            self.running.clear()
            self.kill()

    @property
    def runtime(self) -> NodeRuntime:
        if self._runtime is None:
            raise RuntimeError("the node side is not running (killed)")
        return self._runtime

    @property
    def pods(self) -> RecordedPods:
        if self._pods is None:
            raise RuntimeError("the node side is not running (killed)")
        return self._pods

    # -- pods --------------------------------------------------------------------------------

    def add_api_objects(self, objects: Sequence[Manifest]) -> None:
        """Serve ``objects`` (Secrets) from now on."""
        self.api_objects.extend(objects)
        self.runtime.learn(manifests_from_objects(objects, "the API server"))

    def run_pods(self, objects: Sequence[Manifest], doing: str) -> list[str]:
        """Record and run the pods of ``objects`` (with the PVs and PVCs they use) and sync;
        their UIDs. Raises CheckFailed when the volumes could not be set up."""
        manifests = manifests_from_objects(objects, doing)
        self.runtime.learn(manifests)
        adding = new_pods(self.runtime.mgr, manifests)
        self.pods.apply(adding=adding)
        self.running |= {p.record.uid for p in adding}
        self.sync(doing)
        return [p.record.uid for p in adding]

    def try_pods(self, objects: Sequence[Manifest], doing: str, timeout: float) -> SyncResult:
        """Record and run the pods of ``objects`` as :meth:`run_pods` does, for a pod the
        node side or the driver should refuse: sync for at most ``timeout`` seconds and
        return how it ended (unconverged, with the failures), raising nothing."""
        manifests = manifests_from_objects(objects, doing)
        self.runtime.learn(manifests)
        adding = new_pods(self.runtime.mgr, manifests)
        self.pods.apply(adding=adding)
        self.running |= {p.record.uid for p in adding}
        return self.pods.sync(timeout=timeout)

    def delete_pod(self, uid: str) -> None:
        """Stop wanting pod ``uid`` (the next :meth:`sync` tears its volumes down)."""
        self.pods.apply(terminating=[uid])
        self.running.discard(uid)

    def delete_pod_while_down(self, uid: str) -> None:
        """Mark pod ``uid`` deleted while the node side is killed (its record says
        terminating, as ``kubevol down`` leaves it); the next start tears it down."""
        if self.alive:
            raise RuntimeError("delete_pod_while_down needs the node side killed")
        records = PodRecords(NodeVolumeHost(root_dir=self.root, node_name=self.node_name))
        old = records.read(uid)
        if old is not None:
            records.write(attrs.evolve(old, state=PodState.TERMINATING))
        self.running.discard(uid)

    def sync(self, doing: str) -> None:
        """Reconcile until converged; CheckFailed naming what is pending when it does not."""
        result = self.pods.sync(timeout=self.timeout)
        if result.converged:
            return
        errors = [f"{f.kind.value}: {f.error}" for f in result.failures]
        raise CheckFailed(
            f"{doing}: the node side did not converge: "
            + "; ".join(errors or list(result.pending) or ["timed out"]),
            expected="every operation succeeds (retries included) within "
                     f"{self.timeout:.0f}s",
            why="the kubelet's volume manager must bring the pod's volumes to the desired "
                "state; the driver's answers above show which call failed",
        )

    # -- where a pod sees its volumes ----------------------------------------------------------

    def volume_path(self, uid: str, spec_name: str) -> str:
        """A filesystem volume's directory as pod ``uid``'s containers see it."""
        return os.path.join(self.root, "pods", uid, "volumes", CSI_DIR, spec_name, "mount")

    def device_path(self, uid: str, spec_name: str) -> str:
        """A block volume's device as pod ``uid``'s containers get it (the pod device link)."""
        return os.path.join(self.root, "pods", uid, "volumeDevices", CSI_DIR, spec_name)

    def subpath(self, uid: str, spec_name: str, container: str, index: int) -> str:
        """Where a subPath of container ``container``'s ``volumeMounts[index]`` is bound."""
        return os.path.join(self.root, "pods", uid, "volume-subpaths", spec_name, container,
                            str(index))

    def staging_path(self, spec_name: str) -> str:
        """The device (staging) mount path of filesystem volume ``spec_name`` on this node,
        as the node side knows it ("" when it is not staged)."""
        for volume in self.pods.manager.actual.volumes():
            if volume.volume_name.endswith(spec_name) or volume.spec.name() == spec_name:
                return volume.device_mount_path
        return ""

    def metrics(self, uid: str, spec_name: str) -> Metrics:
        """Usage of pod ``uid``'s filesystem volume through the CSI plugin (NodeGetVolumeStats),
        as ``/metrics`` reports it."""
        plugin = self.runtime.mgr.find_plugin_by_name(CSI_PLUGIN_NAME)
        return plugin.new_unmounter(spec_name, uid).get_metrics()
