"""The recycler pod template: how a cluster scrubs a released volume with a pod."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubevol.errors import SpecError
from kubevol.k8s.pod import Pod

if TYPE_CHECKING:
    from kubernetes.client import V1Pod

#: Scrubs the volume mounted at /scrub and fails unless it ends up empty.
_SCRUB_SCRIPT = (
    'test -e /scrub && find /scrub -mindepth 1 -delete && test -z "$(ls -A /scrub)" || exit 1'
)


def new_persistent_volume_recycler_pod_template() -> V1Pod:
    """A ``V1Pod`` that empties the volume mounted at ``/scrub`` and checks it is empty.

    Callers must set ``spec.volumes[0]`` to the volume to scrub; ``metadata.generate_name``
    (``pv-recycler-``) and ``spec.active_deadline_seconds`` (60) may be adjusted.
    """
    from kubernetes import client

    return client.V1Pod(
        metadata=client.V1ObjectMeta(generate_name="pv-recycler-", namespace="default"),
        spec=client.V1PodSpec(
            active_deadline_seconds=60,
            restart_policy="Never",
            volumes=[client.V1Volume(name="vol")],
            containers=[
                client.V1Container(
                    name="pv-recycler",
                    image="registry.k8s.io/build-image/debian-base:bookworm-v1.0.4",
                    command=["/bin/sh"],
                    args=["-c", _SCRUB_SCRIPT],
                    volume_mounts=[client.V1VolumeMount(name="vol", mount_path="/scrub")],
                )
            ],
        ),
    )


def validate_recycler_pod_template(pod: Pod | None) -> None:
    """Raise SpecError unless ``pod`` (a ``V1Pod``) defines at least one volume to scrub."""
    volumes = pod.spec.volumes if pod is not None and pod.spec is not None else None
    if not volumes:
        raise SpecError("the recycler pod template must define at least one volume; it has none")
