"""The kubelet's Events about pods' volumes (``kubectl describe pod`` shows them): which
failed operation is which reason, and the message the kubelet writes for it
(``pkg/volume/util/operationexecutor``: ``<prefix> for volume "<name>" : <error>``, the
reasons of ``pkg/kubelet/events``). Recorded through :mod:`kubevol.k8s.events`."""

from __future__ import annotations

from kubevol.k8s.events import WARNING, EventRecorder, ObjectRef
from kubevol.node.executor import OperationKey, OperationKind
from kubevol.node.state import DesiredState

#: A failed operation's reason and message prefix, as the kubelet's operation generator
#: reports it.
FAILURES: dict[OperationKind, tuple[str, str]] = {
    OperationKind.SET_UP: ("FailedMount", "MountVolume.SetUp failed"),
    OperationKind.MOUNT_DEVICE: ("FailedMount", "MountVolume.MountDevice failed"),
    OperationKind.WAIT_FOR_ATTACH: ("FailedMount", "MountVolume.WaitForAttach failed"),
    OperationKind.ATTACH: ("FailedAttachVolume", "AttachVolume.Attach failed"),
    OperationKind.MAP: ("FailedMapVolume", "MapVolume.SetUpDevice failed"),
    OperationKind.EXPAND: ("FileSystemResizeFailed", "MountVolume.NodeExpandVolume failed"),
}


def failure_message(prefix: str, volume: str, error: BaseException) -> str:
    """The kubelet's event message (``generateVolumeMsg``'s simple form)."""
    return f'{prefix} for volume "{volume}" : {error}'


class PodVolumeEvents:
    """Turns failed operations into Warning events on the pods whose volume failed (every
    desired pod using it, for an operation on the whole volume)."""

    def __init__(self, recorder: EventRecorder, desired: DesiredState) -> None:
        self.recorder = recorder
        self.desired = desired

    def observe(self, key: OperationKey, kind: OperationKind, error: BaseException | None) -> None:
        if error is None or kind not in FAILURES:
            return
        reason, prefix = FAILURES[kind]
        for pod in self.desired.pods():
            if key.pod and pod.uid != key.pod:
                continue
            for volume in pod.volumes:
                if volume.unique_name != key.volume:
                    continue
                meta = pod.pod.metadata
                namespace, name = (meta.namespace, meta.name) if meta else (None, None)
                self.recorder.event(
                    ObjectRef(namespace=namespace or "default", name=str(name), uid=pod.uid),
                    WARNING, reason, failure_message(prefix, volume.spec_name, error))
