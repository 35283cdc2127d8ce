"""Covers kubevol.node.static_pods: the merged objects of a manifest directory, kept
current file by file, are those of merging every file again in name order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubevol.node.manifests import Manifests, load_manifest_files
from kubevol.node.static_pods import ManifestDirectory

#: Few names, so that files often define the same object (the later file wins).
NAMES = ("a", "b", "c")
FILES = ("1.json", "2.yaml", "3.json", "4.yml")


def _objects(names: list[str], tag: int) -> list[dict[str, object]]:
    """A Pod, ConfigMap, claim and PV per name; ``tag`` tells the files' versions apart."""
    out: list[dict[str, object]] = []
    for name in names:
        out += [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}{tag}"},
             "spec": {"containers": [{"name": "c", "image": "i"}]}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
             "data": {"tag": str(tag)}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
             "spec": {"volumeName": f"pv-{name}", "resources": {"requests": {"storage": "1"}},
                      "accessModes": ["ReadWriteOnce"]}},
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv-{name}"},
             "spec": {"capacity": {"storage": "1"}, "accessModes": ["ReadWriteOnce"],
                      "hostPath": {"path": f"/tmp/{tag}"}}},
        ]
    return out


def _write(path: Path, names: list[str], tag: int) -> None:
    """Write then rename into place (a half-written file is never read)."""
    tmp = path.parent / f".{path.name}"
    tmp.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                               "items": _objects(names, tag)}))
    os.rename(tmp, path)


def _merged_anew(directory: Path) -> Manifests:
    out = Manifests()
    for name in sorted(os.listdir(directory)):
        if not name.startswith("."):
            out = out.merged(load_manifest_files([str(directory / name)]))
    return out


_STEPS = st.lists(
    st.tuples(st.sampled_from(FILES), st.lists(st.sampled_from(NAMES), unique=True),
              st.booleans()),
    min_size=1, max_size=12,
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
def test_merged_file_by_file_is_merged_anew(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, list[str], bool]]
) -> None:
    directory = tmp_path_factory.mktemp("manifests")
    with ManifestDirectory(str(directory)) as source:
        for tag, (name, names, remove) in enumerate(steps):
            path = directory / name
            if remove:
                if path.exists():
                    path.unlink()
            else:
                _write(path, names, tag)
            while source.wait(0.05):
                pass
            before = source.manifests()
            assert before == _merged_anew(directory)
            assert source.manifests() is before  # nothing changed: the same object


def test_a_kind_no_changed_file_defines_keeps_its_object(tmp_path: Path) -> None:
    """The agent compares the merged objects of two changes by identity: a kind no changed
    file defines is the same object, and so is each object of a file not read again."""
    _write(tmp_path / "1.json", ["a"], 1)
    with ManifestDirectory(str(tmp_path)) as source:
        first = source.manifests()
        (tmp_path / "2.json").write_text(json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "z"}}))
        assert source.wait(10)  # returns at the event: the bound is for a loaded machine
        second = source.manifests()
        assert second.pvs is first.pvs and second.pvcs is first.pvcs
        assert second.pods is first.pods
        assert second.config_maps is not first.config_maps
        assert second.config_maps[("default", "a")] is first.config_maps[("default", "a")]
        assert set(second.config_maps) == {("default", "a"), ("default", "z")}
