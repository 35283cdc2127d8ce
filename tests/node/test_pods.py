"""Covers kubevol.node.desired, kubevol.node.manifests and kubevol.node.records.

Manifests into desired pods, and the on-disk pod records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs
import pytest

from kubevol.errors import SpecError
from kubevol.manager import VolumePluginMgr
from kubevol.node.desired import desired_pod, new_pods
from kubevol.node.host import NodeVolumeHost, node_plugins
from kubevol.node.manifests import manifest_pod_uid, parse_manifests
from kubevol.node.records import PodRecord, PodRecords, PodState, RecordWatcher, records_for
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import VolumeMode

MANIFEST = """
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-data}
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /srv/data}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: data, namespace: shop}
  spec: {volumeName: pv-data, accessModes: [ReadWriteOnce]}
- apiVersion: v1
  kind: Pod
  metadata: {name: web, namespace: shop}
  spec:
    securityContext: {fsGroup: 2000}
    containers:
    - name: c
      image: x
      volumeMounts: [{name: data, mountPath: /data}, {name: tmp, mountPath: /tmp}]
    volumes:
    - name: data
      persistentVolumeClaim: {claimName: data, readOnly: true}
    - name: tmp
      emptyDir: {}
"""


@pytest.fixture
def mgr(tmp_path: Path) -> VolumePluginMgr:
    m = VolumePluginMgr()
    m.init_plugins(node_plugins(), host=NodeVolumeHost(root_dir=str(tmp_path), node_name="n"))
    return m


def test_claims_resolve_to_their_volume(mgr: VolumePluginMgr) -> None:
    """A claim in the pod resolves through spec.volumeName to the PV, read-only kept."""
    m = parse_manifests(MANIFEST)
    assert [p["metadata"]["name"] for p in m.pods] == ["web"]
    dp = desired_pod(mgr, m.pods[0], m)
    data, tmp = dp.volumes
    assert data.spec.persistent_volume.metadata.name == "pv-data"
    assert data.spec.read_only is True
    assert data.spec_name == "pv-data" and data.outer_name == "data"
    assert data.size == 2 << 30
    assert data.fs_group == 2000
    assert data.plugin_name == "kubernetes.io/host-path"
    assert data.unique_name == f"kubernetes.io/host-path/{dp.uid}-pv-data"
    assert tmp.plugin_name == "kubernetes.io/empty-dir" and tmp.mode is VolumeMode.FILESYSTEM
    assert dp.name == "shop/web"


def test_claim_ref_binds_when_volume_name_is_missing(mgr: VolumePluginMgr) -> None:
    """A claim without spec.volumeName finds the PV whose claimRef names it."""
    text = MANIFEST.replace("spec: {volumeName: pv-data, accessModes: [ReadWriteOnce]}",
                            "spec: {accessModes: [ReadWriteOnce]}")
    text = text.replace("hostPath: {path: /srv/data}",
                        "hostPath: {path: /srv/data}\n  claimRef: {name: data, namespace: shop}")
    m = parse_manifests(text)
    dp = desired_pod(mgr, m.pods[0], m)
    assert dp.volumes[0].spec_name == "pv-data"


def test_unbound_claim_is_a_clear_error(mgr: VolumePluginMgr) -> None:
    """A claim that leads to no PV names the claim."""
    text = MANIFEST.replace("volumeName: pv-data", "volumeName: pv-other")
    m = parse_manifests(text)
    with pytest.raises(SpecError, match="shop/data is not bound"):
        desired_pod(mgr, m.pods[0], m)


def test_block_use_of_a_filesystem_volume_is_refused(mgr: VolumePluginMgr) -> None:
    """volumeDevices naming a Filesystem volume is an error naming the volume."""
    text = MANIFEST.replace("volumeMounts: [{name: data, mountPath: /data}, ",
                            "volumeDevices: [{name: data, devicePath: /dev/xvda}]\n"
                            "      volumeMounts: [")
    m = parse_manifests(text)
    with pytest.raises(SpecError, match="'data' is used as a device"):
        desired_pod(mgr, m.pods[0], m)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [", "not valid YAML"),
        ("kind: Deployment\nmetadata: {name: x}", "'Deployment' is not supported"),
        ("kind: Pod\nmetadata: {}", "has no metadata.name"),
        ("- 1\n- 2", "must be a mapping"),
    ],
)
def test_bad_manifests_are_refused(text: str, message: str) -> None:
    """Bad YAML, kinds and objects without names are errors naming the file."""
    with pytest.raises(SpecError, match=message) as info:
        parse_manifests(text, "pods.yaml")
    assert "pods.yaml" in str(info.value)


def test_uid_is_stable_and_explicit_uid_wins() -> None:
    """Without metadata.uid the UID derives from namespace/name; with one, it is used."""
    pod = {"kind": "Pod", "metadata": {"name": "web", "namespace": "shop"}}
    assert manifest_pod_uid(pod) == manifest_pod_uid(dict(pod))
    assert manifest_pod_uid(pod) != manifest_pod_uid({"kind": "Pod", "metadata": {"name": "web"}})
    assert manifest_pod_uid({"kind": "Pod", "metadata": {"name": "w", "uid": "abc-1"}}) == "abc-1"
    with pytest.raises(ValueError, match="must not contain"):
        manifest_pod_uid({"kind": "Pod", "metadata": {"name": "w", "uid": "../x"}})


def test_records_round_trip_atomically(tmp_path: Path) -> None:
    """Records are written whole, read back, listed and removed; no temp file stays."""
    host = NodeVolumeHost(root_dir=str(tmp_path), node_name="n")
    records = PodRecords(host)
    m = parse_manifests(MANIFEST)
    [record] = records_for(m, PodState.RUNNING)
    assert [o["kind"] for o in record.objects] == ["Pod", "PersistentVolumeClaim",
                                                   "PersistentVolume"]
    records.write(record)
    records.write(PodRecord(uid=record.uid, state=PodState.TERMINATING, objects=record.objects))
    assert os.listdir(records.dir) == [f"{record.uid}.json"]
    again = records.read(record.uid)
    assert again is not None and again.state is PodState.TERMINATING
    assert again.name == "shop/web"
    assert again.manifests().pods[0]["metadata"]["name"] == "web"
    assert [r.uid for r in records.all()] == [record.uid]
    with open(os.path.join(records.dir, f"{record.uid}.json"), encoding="utf-8") as f:
        assert json.load(f)["state"] == "terminating"
    records.remove(record.uid)
    records.remove(record.uid)
    assert records.all() == [] and records.read(record.uid) is None


def test_record_watcher_reports_only_changes(tmp_path: Path) -> None:
    """refresh() re-reads new, changed and removed records, and nothing else."""
    records = PodRecords(NodeVolumeHost(root_dir=str(tmp_path), node_name="n"))
    watcher = RecordWatcher(records)
    assert watcher.refresh() == ({}, set())
    [record] = records_for(parse_manifests(MANIFEST), PodState.RUNNING)
    records.write(record)
    found, changed = watcher.refresh()
    assert changed == {record.uid} and found[record.uid].state is PodState.RUNNING
    assert watcher.refresh()[1] == set()
    records.write(PodRecord(uid=record.uid, state=PodState.TERMINATING, objects=record.objects))
    found, changed = watcher.refresh()
    assert changed == {record.uid} and found[record.uid].state is PodState.TERMINATING
    records.remove(record.uid)
    assert watcher.refresh() == ({}, {record.uid})


def test_record_watcher_takes_a_noted_record_as_read(tmp_path: Path) -> None:
    """A record noted with the stamp its write returned is listed without being read or
    reported changed; once the file is rewritten it is read again."""
    records = PodRecords(NodeVolumeHost(root_dir=str(tmp_path), node_name="n"))
    watcher = RecordWatcher(records)
    [record] = records_for(parse_manifests(MANIFEST), PodState.RUNNING)
    watcher.note(record, records.write(record))
    reads: list[str] = []
    read = records.read

    def counting_read(uid: str) -> PodRecord | None:
        reads.append(uid)
        return read(uid)

    records.read = counting_read  # type: ignore[method-assign]
    found, changed = watcher.refresh()
    assert found == {record.uid: record} and changed == set() and reads == []
    records.write(PodRecord(uid=record.uid, state=PodState.TERMINATING, objects=record.objects))
    found, changed = watcher.refresh()
    assert changed == {record.uid} and found[record.uid].state is PodState.TERMINATING
    assert reads == [record.uid]


def test_volume_manager_writes_only_terminating_records_as_terminating(
    tmp_path: Path,
) -> None:
    """``terminating`` records are written before anything is torn down: a running record
    given as one is refused before anything is written."""
    [record] = records_for(parse_manifests(MANIFEST), PodState.RUNNING)
    with NodeRuntime(str(tmp_path), node_name="n1", entry_points=False) as runtime:
        with pytest.raises(ValueError, match="terminating"):
            runtime.volume_manager(workers=0, terminating=[record])
        assert runtime.records.all() == []
        ending = attrs.evolve(record, state=PodState.TERMINATING)
        pods = runtime.volume_manager(workers=0, terminating=[ending])
        try:
            assert pods.records == {record.uid: ending}
            assert runtime.records.read(record.uid) == ending
        finally:
            pods.close()


def test_new_pods_pair_records_with_desired_pods_built_once(
    tmp_path: Path, mgr: VolumePluginMgr
) -> None:
    """new_pods checks and builds each pod once, with the record that keeps it; a record's
    manifests are its objects, checked like a file's, without a YAML round trip."""
    m = parse_manifests(MANIFEST)
    [new] = new_pods(mgr, m)
    [record] = records_for(m, PodState.RUNNING)
    assert new.record == record
    assert new.desired.uid == record.uid
    assert [v.outer_name for v in new.desired.volumes] == [
        v.outer_name for v in desired_pod(mgr, m.pods[0], m).volumes
    ]
    assert record.manifests() == m
    with pytest.raises(SpecError, match="record of pod x: kind 'Deployment' is not supported"):
        PodRecord(uid="x", state=PodState.RUNNING, objects=({"kind": "Deployment"},)).manifests()


def test_the_terminating_records_are_known_as_records_change(tmp_path: Path) -> None:
    """A long-running agent asks after every pass whether a pod is terminating: the manager
    keeps their UIDs as records are added, marked terminating, replaced, read back after
    another writer's change, and forgotten, always those of the records in that state."""
    m = parse_manifests(MANIFEST)
    with NodeRuntime(str(tmp_path), node_name="n1", entry_points=False) as runtime:
        pods = runtime.volume_manager(workers=0)

        def terminating() -> set[str]:
            by_state = {u for u, r in pods.records.items() if r.state is PodState.TERMINATING}
            assert pods.terminating == by_state
            return by_state

        try:
            [new] = new_pods(runtime.mgr, m)
            uid = new.record.uid
            pods.apply(adding=[new])
            assert terminating() == set()
            pods.apply(terminating=[uid])
            assert terminating() == {uid}
            pods.apply(adding=[new])  # wanted again before it was gone
            assert terminating() == set()
            runtime.records.write(attrs.evolve(new.record, state=PodState.TERMINATING))
            pods.refresh()  # another writer's record
            assert terminating() == {uid}
            assert pods.forget_terminated() == [uid]  # nothing of it was mounted
            assert terminating() == set() and pods.records == {}
        finally:
            pods.close()
