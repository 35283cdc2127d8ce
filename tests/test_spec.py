"""Covers kubevol.spec.

Spec: construction rules and loading from manifests.
"""

from __future__ import annotations

import attrs
import pytest
from kubernetes import client

from kubevol import Spec, SpecError
from kubevol.spec import DeferredApiObject, KnownSource, pod_uid


def test_from_volume_names_the_pod_volume() -> None:
    """A pod volume's Spec is named after the volume."""
    spec = Spec.from_volume(client.V1Volume(name="data", empty_dir=client.V1EmptyDirVolumeSource()))
    assert spec.name() == "data"
    assert spec.persistent_volume is None


def test_from_persistent_volume_names_the_pv_and_keeps_read_only() -> None:
    """A PV's Spec is named after the PV and carries read_only."""
    pv = client.V1PersistentVolume(metadata=client.V1ObjectMeta(name="pv-1"))
    spec = Spec.from_persistent_volume(pv, read_only=True)
    assert spec.name() == "pv-1"
    assert spec.read_only is True


def test_spec_needs_exactly_one_source() -> None:
    """Neither or both of volume/persistent_volume is a ValueError naming the rule."""
    with pytest.raises(ValueError, match="exactly one"):
        Spec()
    with pytest.raises(SpecError, match="exactly one"):
        Spec(volume=client.V1Volume(name="a"), persistent_volume=client.V1PersistentVolume())


def test_spec_is_frozen() -> None:
    """Specs cannot be changed after construction."""
    spec = Spec.from_volume(client.V1Volume(name="a"))
    with pytest.raises(AttributeError):
        spec.read_only = True  # type: ignore[misc]


def test_derived_is_read_once_per_spec_and_key_and_failures_are_not_kept() -> None:
    """Spec.derived calls the reader once per key and returns the same object after; a
    reader that raises is asked again next time; another Spec, or an evolved copy, reads
    anew."""
    spec = Spec.from_volume(client.V1Volume(name="a"))
    calls: list[str] = []

    def read(s: Spec) -> list[str]:
        calls.append(s.name())
        return [s.name()]

    first = spec.derived("test:name", read)
    assert spec.derived("test:name", read) is first and calls == ["a"]
    assert spec.derived("test:other", read) == ["a"] and len(calls) == 2

    def failing(s: Spec) -> str:
        calls.append("failed")
        raise SpecError("no")

    for _ in range(2):
        with pytest.raises(SpecError):
            spec.derived("test:failing", failing)
    assert calls.count("failed") == 2
    assert Spec.from_volume(client.V1Volume(name="a")).derived("test:name", read) is not first
    assert attrs.evolve(spec, read_only=True).derived("test:name", read) is not first


def test_from_manifest_yaml_pod_volume_uses_client_models() -> None:
    """YAML of a pod volume becomes a V1Volume with the API's field names mapped."""
    spec = Spec.from_manifest("name: cache\nemptyDir:\n  medium: Memory\n  sizeLimit: 64Mi\n")
    assert isinstance(spec.volume, client.V1Volume)
    assert spec.volume.empty_dir.medium == "Memory"
    assert spec.volume.empty_dir.size_limit == "64Mi"


def test_from_manifest_dict_persistent_volume() -> None:
    """A PersistentVolume object dict becomes a V1PersistentVolume Spec."""
    spec = Spec.from_manifest(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "pv-csi"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "hostpath.kubevol.io", "volumeHandle": "vol-1"},
            },
        }
    )
    assert spec.name() == "pv-csi"
    assert spec.persistent_volume.spec.csi.volume_handle == "vol-1"


@pytest.mark.parametrize("manifest", [
    {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    {"name": "cfg", "configMap": {"name": "cm", "items": [{"key": "a", "path": "a"}],
                                  "defaultMode": 0o440}},
    {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {
        "path": "token", "expirationSeconds": 3600}}]}},
    {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-csi"},
     "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
              "claimRef": {"namespace": "default", "name": "data"},
              "csi": {"driver": "hostpath.kubevol.io", "volumeHandle": "vol-1",
                      "volumeAttributes": {"a": "b"}, "readOnly": True}}},
])
def test_from_manifest_of_an_accepted_dict_builds_the_same_model(
    manifest: dict[str, object],
) -> None:
    """A record's volume, validated in one call (``accepted``), is the model a manifest
    gets through the client's deserialisation."""
    read, accepted = Spec.from_manifest(manifest), Spec.from_manifest(manifest, accepted=True)
    assert (accepted.volume, accepted.persistent_volume) == (read.volume, read.persistent_volume)
    assert accepted.name() == read.name()


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("- a\n- b\n", "must be a mapping"),
        ("name: [unclosed", "not valid YAML"),
        ({"kind": "Pod", "metadata": {"name": "p"}}, "'Pod' manifest"),
        ({"emptyDir": {}}, "non-empty 'name'"),
        ({"kind": "PersistentVolume", "metadata": {}}, "no metadata.name"),
    ],
)
def test_from_manifest_rejects_bad_input_clearly(manifest: object, message: str) -> None:
    """Malformed manifests raise SpecError saying what is wrong."""
    with pytest.raises(SpecError, match=message):
        Spec.from_manifest(manifest)  # type: ignore[arg-type]


def test_api_object_builds_the_same_model_as_the_constructors() -> None:
    """A model built from an API dict equals the one built from nested constructors, so
    reconstructed specs are indistinguishable from loaded ones."""
    from kubevol.spec import api_object

    built = api_object("V1PersistentVolume", {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "pv-1"},
        "spec": {"csi": {"driver": "d", "volumeHandle": "h"}, "volumeMode": "Block"},
    })
    assert built == client.V1PersistentVolume(
        api_version="v1",
        kind="PersistentVolume",
        metadata=client.V1ObjectMeta(name="pv-1"),
        spec=client.V1PersistentVolumeSpec(
            csi=client.V1CSIPersistentVolumeSource(driver="d", volume_handle="h"),
            volume_mode="Block",
        ),
    )
    assert built.spec.csi.volume_handle == "h"


def test_api_object_refuses_an_invalid_dict_clearly() -> None:
    """A dict that is not the named model is a SpecError naming the model, not a pydantic
    error leaking out."""
    from kubevol.spec import api_object

    with pytest.raises(SpecError, match="not a valid Volume"):
        api_object("V1Volume", {"name": "v", "emptyDir": "not a mapping"})


def _no_model_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(type_name: str, data: object) -> None:
        raise AssertionError(f"a {type_name} model was built")

    monkeypatch.setattr("kubevol.spec.api_object", refuse)


def test_spec_from_api_data_builds_its_model_only_when_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Spec made from API data answers its name, kind and known derived values without
    building a model; reading ``volume``/``persistent_volume`` builds the client's model,
    once."""
    volume = Spec.from_api_data(volume={"name": "data", "emptyDir": {"medium": "Memory"}},
                                known={"k": 1})
    pv = Spec.from_api_data(persistent_volume={"metadata": {"name": "pv-1"}, "spec": {}})
    with monkeypatch.context() as m:
        _no_model_built(m)
        assert (volume.name(), pv.name()) == ("data", "pv-1")
        assert (volume.is_persistent_volume, pv.is_persistent_volume) == (False, True)
        assert volume.derived("k", lambda _: 2) == 1
    assert isinstance(volume.volume, client.V1Volume)
    assert volume.volume.empty_dir.medium == "Memory"
    assert volume.volume is volume.volume
    assert volume.persistent_volume is None
    assert isinstance(pv.persistent_volume, client.V1PersistentVolume)
    assert pv.persistent_volume.metadata.name == "pv-1"


def test_deferred_api_object_reads_the_pod_uid_without_a_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pod_uid reads a deferred pod's UID from its data; any other read builds the V1Pod."""
    pod = DeferredApiObject("V1Pod", {"metadata": {"uid": "u-1"}})
    with monkeypatch.context() as m:
        _no_model_built(m)
        assert pod_uid(pod) == "u-1"
    assert pod.metadata.uid == "u-1" and pod.metadata.name is None
    assert isinstance(pod.model(), client.V1Pod)
    with pytest.raises(SpecError, match=r"no metadata\.uid"):
        pod_uid(DeferredApiObject("V1Pod", {"metadata": {}}))
    with pytest.raises(SpecError, match="not a valid Pod"):
        _ = DeferredApiObject("V1Pod", {"metadata": "not a mapping"}).spec


def test_known_source_reads_unset_fields_as_none() -> None:
    """A KnownSource answers its fields and None for any other, like an unset model field."""
    source = KnownSource({"medium": "Memory"})
    assert (source.medium, source.size_limit) == ("Memory", None)
    with pytest.raises(AttributeError):
        _ = source._private
