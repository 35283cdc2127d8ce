"""Manifests are checked as the API server checks them, in full, before anything is recorded
(issue 20, point 9): every hostile value below is one SpecError naming the field."""

from __future__ import annotations

import pytest

from kubevol.errors import SpecError
from kubevol.node.manifests import parse_manifests
from kubevol.node.validation import validate_pod_uid

POD = "kind: Pod\nmetadata: {{name: p{meta}}}\nspec: {{containers: [{{name: c, image: x}}]{spec}}}"

BAD = {
    "uid-hidden": (POD.format(meta=", uid: .hidden", spec=""), "must not start with '.'"),
    "uid-slash": (POD.format(meta=", uid: a/b", spec=""), "must not contain '/'"),
    "uid-too-long-for-its-record": (POD.format(meta=", uid: " + "a" * 251, spec=""),
                                    "longer than 250 bytes"),
    "volume-slash": (POD.format(meta="", spec=", volumes: [{name: a/b, emptyDir: {}}]"),
                     "volume name 'a/b' is not valid"),
    "volume-dotdot": (POD.format(meta="", spec=", volumes: [{name: '..', emptyDir: {}}]"),
                      "volume name '..' is not valid"),
    "volume-twice": (POD.format(meta="", spec=", volumes: [{name: v, emptyDir: {}}, "
                                "{name: v, emptyDir: {}}]"), "used twice"),
    "fsgroup-negative": (POD.format(meta="", spec=", securityContext: {fsGroup: -5}"),
                         "not within 0..2147483647"),
    "fsgroup-huge": (POD.format(meta="", spec=", securityContext: {fsGroup: 99999999999}"),
                     "not within"),
    "fsgroup-string": (POD.format(meta="", spec=", securityContext: {fsGroup: abc}"),
                       "must be an integer"),
    "fsgroup-bool": (POD.format(meta="", spec=", securityContext: {fsGroup: true}"),
                     "got a boolean"),
    "fsgroup-policy": (POD.format(meta="", spec=", securityContext: {fsGroupChangePolicy: x}"),
                       "fsGroupChangePolicy"),
    "metadata-string": ("kind: Pod\nmetadata: hello\n", "metadata must be a mapping"),
    "spec-list": ("kind: Pod\nmetadata: {name: p}\nspec: [1]\n", "spec must be a mapping"),
    "volumes-string": (POD.format(meta="", spec=", volumes: abc"), "volumes must be a list"),
    "volume-string": (POD.format(meta="", spec=", volumes: [abc]"), r"volumes\[0\] must be"),
    "claim-string": (POD.format(meta="", spec=", volumes: [{name: v, persistentVolumeClaim: x}]"),
                     "persistentVolumeClaim must be a mapping"),
    "config-map-bool": (POD.format(meta="", spec=", volumes: [{name: v, configMap: true}]"),
                        "configMap must be a mapping"),
    "projected-list": (POD.format(meta="", spec=", volumes: [{name: v, projected: [1]}]"),
                       "projected must be a mapping"),
    "size-limit": (POD.format(meta="", spec=", volumes: [{name: v, emptyDir: {sizeLimit: lots}}]"),
                   "not a valid quantity"),
    "host-path-relative": (POD.format(meta="", spec=", volumes: [{name: v, hostPath: {path: x}}]"),
                           "absolute path"),
    "host-path-backstep": (POD.format(meta="", spec=", volumes: [{name: v, hostPath: "
                                      "{path: /a/../etc}}]"), "without '..'"),
    "name-uppercase": ("kind: Pod\nmetadata: {name: Web}\n", "name 'Web' is not valid"),
    "namespace-list": ("kind: Pod\nmetadata: {name: p, namespace: [a]}\n", "namespace"),
    "list-items": ("kind: List\nitems: abc\n", "items of a List must be a list"),
    "pv-mode": ("kind: PersistentVolume\nmetadata: {name: pv}\nspec: {volumeMode: Tape}\n",
                "volumeMode"),
    "pv-capacity": ("kind: PersistentVolume\nmetadata: {name: pv}\nspec: {capacity: "
                    "{storage: lots}}\n", "capacity.storage"),
    "pvc-volume-name": ("kind: PersistentVolumeClaim\nmetadata: {name: c}\nspec: "
                        "{volumeName: [x]}\n", "volumeName must be a string"),
}


@pytest.mark.parametrize(("text", "message"), BAD.values(), ids=BAD.keys())
def test_invalid_objects_are_refused_naming_the_field(text: str, message: str) -> None:
    """Each is refused by parsing alone: nothing reaches a record."""
    with pytest.raises(SpecError, match=message):
        parse_manifests(text, "pod.yaml")


def test_a_valid_pod_passes() -> None:
    """The checks refuse nothing a real manifest holds."""
    text = POD.format(
        meta=", namespace: shop, uid: 0f1e2d3c-aaaa-bbbb-cccc-123456789012",
        spec=", securityContext: {fsGroup: 2000, fsGroupChangePolicy: OnRootMismatch}, "
        "volumes: [{name: scratch, emptyDir: {sizeLimit: 1Gi}}, {name: logs, hostPath: "
        "{path: /var/log}}, {name: data, persistentVolumeClaim: {claimName: data}}]",
    )
    assert len(parse_manifests(text, "pod.yaml").pods) == 1


@pytest.mark.parametrize("uid", [".", "..", ".x", "", "a/b", "a\0b", 5])
def test_pod_uids_that_cannot_name_a_record_are_refused(uid: object) -> None:
    """``down --pod-uid`` takes the same check as manifests."""
    with pytest.raises(SpecError):
        validate_pod_uid(uid)
