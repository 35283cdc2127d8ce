"""Covers kubevol.plugins.recycler.

Recycler pod template helpers.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from kubevol import (
    SpecError,
    new_persistent_volume_recycler_pod_template,
    validate_recycler_pod_template,
)


def test_template_scrubs_the_mounted_volume() -> None:
    """The template mounts volume 0 at /scrub and its command empties it."""
    pod = new_persistent_volume_recycler_pod_template()
    assert isinstance(pod, client.V1Pod)
    assert pod.metadata.generate_name == "pv-recycler-"
    assert pod.spec.active_deadline_seconds == 60
    container = pod.spec.containers[0]
    assert container.volume_mounts[0].mount_path == "/scrub"
    assert container.volume_mounts[0].name == pod.spec.volumes[0].name
    assert "find /scrub -mindepth 1 -delete" in container.args[1]
    validate_recycler_pod_template(pod)


def test_template_without_volume_is_refused() -> None:
    """A template with no volume is invalid."""
    pod = new_persistent_volume_recycler_pod_template()
    pod.spec.volumes = []
    with pytest.raises(SpecError, match="at least one volume"):
        validate_recycler_pod_template(pod)
