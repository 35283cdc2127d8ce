"""Covers kubevol.node.validation and kubevol.node.records.

Manifests are checked as the API server checks them, in full, before anything is recorded
(issue 20, point 9; issue 28, points 3 and 6): every hostile value below is one SpecError
naming the field, and a pod record edited on disk to hold one is skipped."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.errors import SpecError
from kubevol.node.host import NodeVolumeHost
from kubevol.node.manifests import parse_manifests
from kubevol.node.records import PodRecords, PodState, RecordError, RecordWatcher, records_for
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


# -- file modes, item keys and paths, projected sources, subPaths (issue 28) ----------------------

#: A volume of each kind with a file mode at ``{mode}``, by the field that holds it.
MODE_FIELDS = {
    "configMap.defaultMode": "configMap: {{name: app, defaultMode: {mode}}}",
    "configMap.items[0].mode":
        "configMap: {{name: app, items: [{{key: k, path: p, mode: {mode}}}]}}",
    "secret.defaultMode": "secret: {{secretName: s, defaultMode: {mode}}}",
    "secret.items[0].mode":
        "secret: {{secretName: s, items: [{{key: k, path: p, mode: {mode}}}]}}",
    "downwardAPI.defaultMode": "downwardAPI: {{defaultMode: {mode}}}",
    "downwardAPI.items[0].mode": "downwardAPI: {{items: [{{path: n, mode: {mode}, "
                                 "fieldRef: {{fieldPath: metadata.name}}}}]}}",
    "projected.defaultMode": "projected: {{defaultMode: {mode}, sources: []}}",
    "projected.sources[0].configMap.items[0].mode":
        "projected: {{sources: [{{configMap: {{name: app, items: [{{key: k, path: p, "
        "mode: {mode}}}]}}}}]}}",
    "projected.sources[0].secret.items[0].mode":
        "projected: {{sources: [{{secret: {{name: s, items: [{{key: k, path: p, "
        "mode: {mode}}}]}}}}]}}",
    "projected.sources[0].downwardAPI.items[0].mode":
        "projected: {{sources: [{{downwardAPI: {{items: [{{path: n, mode: {mode}, "
        "fieldRef: {{fieldPath: metadata.name}}}}]}}}}]}}",
}
#: setuid root (04755), everything (-1 and 07777 are rwsrwsrwt), beyond any mode_t.
BAD_MODES = {"setuid": 0o4755, "negative": -1, "all-bits": 0o7777, "huge": 99999999999}


def volume_pod(source: str, mounts: str = "") -> str:
    """A pod with one volume ``v`` of ``source`` (its YAML flow mapping's inside)."""
    return POD.format(meta="", spec=f", volumes: [{{name: v, {source}}}]").replace(
        "image: x}", f"image: x{mounts}}}", 1)


@pytest.mark.parametrize("mode", BAD_MODES.values(), ids=BAD_MODES.keys())
@pytest.mark.parametrize("field", MODE_FIELDS)
def test_file_modes_beyond_0777_are_refused_naming_the_field(field: str, mode: int) -> None:
    """``validate{ConfigMap,Secret,DownwardAPI,Projected}VolumeSource`` and
    ``validateKeyToPath``: a mode outside 0..0777 would write setuid, setgid or sticky files,
    or fail at every set-up; refused with the API server's words."""
    text = volume_pod(MODE_FIELDS[field].format(mode=mode))
    with pytest.raises(SpecError) as caught:
        parse_manifests(text, "pod.yaml")
    assert f"volume v: {field} {mode} " in str(caught.value)
    assert "must be a number between 0 and 0777 (octal), both inclusive" in str(caught.value)


@pytest.mark.parametrize("mode", [0, 0o777])
@pytest.mark.parametrize("field", MODE_FIELDS)
def test_file_modes_0_to_0777_are_accepted(field: str, mode: int) -> None:
    """Both ends of the range are valid modes."""
    assert len(parse_manifests(volume_pod(MODE_FIELDS[field].format(mode=mode))).pods) == 1


def test_a_mode_that_is_not_an_integer_is_refused() -> None:
    """A string or a boolean is no mode (YAML's ``0644`` is an integer, ``"0644"`` is not)."""
    for value in ('"0644"', "true", "4.5"):
        with pytest.raises(SpecError, match=r"configMap\.defaultMode must be an integer"):
            parse_manifests(volume_pod(f"configMap: {{name: app, defaultMode: {value}}}"))


ITEMS = "{kind}: {{{name}, items: [{{key: k, path: {path!r}}}]}}"
BAD_SOURCES = {
    "config-map-absolute-path": (ITEMS.format(kind="configMap", name="name: app",
                                              path="/etc/passwd"),
                                 r"configMap\.items\[0\]\.path: .*must be a relative path"),
    "config-map-backstep": (ITEMS.format(kind="configMap", name="name: app", path="a/../../b"),
                            r"configMap\.items\[0\]\.path: .*must not contain '\.\.'"),
    "config-map-writer-name": (ITEMS.format(kind="configMap", name="name: app", path="..data"),
                               r"configMap\.items\[0\]\.path: .*must not start with '\.\.'"),
    "secret-dotdot": (ITEMS.format(kind="secret", name="secretName: s", path=".."),
                      r"secret\.items\[0\]\.path: .*must not contain '\.\.'"),
    "secret-writer-name": (ITEMS.format(kind="secret", name="secretName: s", path="..x/y"),
                           r"secret\.items\[0\]\.path: .*must not start with '\.\.'"),
    "item-key-missing": ("configMap: {name: app, items: [{path: p}]}",
                         r"configMap\.items\[0\]\.key is required"),
    "item-path-missing": ("secret: {secretName: s, items: [{key: k}]}",
                          r"secret\.items\[0\]\.path is required"),
    "item-path-empty": ("configMap: {name: app, items: [{key: k, path: ''}]}",
                        r"configMap\.items\[0\]\.path is required"),
    "config-map-name-missing": ("configMap: {optional: true}", r"configMap\.name is required"),
    "secret-name-missing": ("secret: {defaultMode: 0400}", r"secret\.secretName is required"),
    "downward-api-absolute": ("downwardAPI: {items: [{path: /x, fieldRef: {fieldPath: "
                              "metadata.name}}]}",
                              r"downwardAPI\.items\[0\]\.path: .*must be a relative path"),
    "projected-token-backstep": ("projected: {sources: [{serviceAccountToken: {path: ../t}}]}",
                                 r"projected\.sources\[0\]\.serviceAccountToken\.path: .*"
                                 r"must not contain '\.\.'"),
    "projected-item-backstep": ("projected: {sources: [{configMap: {name: app, items: [{key: k, "
                                "path: a/../../x}]}}]}",
                                r"projected\.sources\[0\]\.configMap\.items\[0\]\.path"),
    "projected-name-missing": ("projected: {sources: [{secret: {items: []}}]}",
                               r"projected\.sources\[0\]\.secret\.name is required"),
    "projected-two-kinds": ("projected: {sources: [{configMap: {name: a}, secret: {name: b}}]}",
                            r"sources\[0\] may not specify more than 1 volume type per source"),
    "projected-same-path": ("projected: {sources: [{configMap: {name: a, items: [{key: k, "
                            "path: x}]}}, {serviceAccountToken: {path: ./x}}]}",
                            r"sources\[1\]: conflicting duplicate paths: 'x'"),
    "token-too-short": ("projected: {sources: [{serviceAccountToken: {path: t, "
                        "expirationSeconds: 599}}]}",
                        r"expirationSeconds 599: may not specify a duration less than 10 minutes"),
    "token-too-long": ("projected: {sources: [{serviceAccountToken: {path: t, "
                       "expirationSeconds: 4294967297}}]}",
                       r"larger than 2\^32 seconds"),
}


@pytest.mark.parametrize(("source", "message"), BAD_SOURCES.values(), ids=BAD_SOURCES.keys())
def test_invalid_item_keys_paths_and_projections_are_refused(source: str, message: str) -> None:
    """``validateKeyToPath`` (``ValidateLocalNonReservedPath``), the sources' required names,
    ``validateDownwardAPIVolumeFile`` and ``validateProjectionSources``: refused by parsing,
    before a record holds what would fail at every set-up."""
    with pytest.raises(SpecError, match=message):
        parse_manifests(volume_pod(source), "pod.yaml")


def test_valid_items_and_projections_pass() -> None:
    """Nested relative paths, a name that only contains ``..``, a token of 10 minutes."""
    source = ("projected: {defaultMode: 0440, sources: ["
              "{configMap: {name: app, items: [{key: k, path: conf/app..yaml, mode: 0400}]}}, "
              "{secret: {name: s, items: [{key: k, path: certs/tls.key}]}}, "
              "{downwardAPI: {items: [{path: meta/name, fieldRef: {fieldPath: metadata.name}}]}},"
              " {serviceAccountToken: {path: token, expirationSeconds: 600}}]}")
    assert len(parse_manifests(volume_pod(source)).pods) == 1
    assert len(parse_manifests(volume_pod(ITEMS.format(
        kind="configMap", name="name: app", path="a/b/c"))).pods) == 1


BAD_MOUNTS = {
    "sub-path-absolute": ("subPath: /etc", r"containers\[0\]\.volumeMounts\[0\]\.subPath: "
                          r".*must not be an absolute path"),
    "sub-path-backstep": ("subPath: a/../..", r"volumeMounts\[0\]\.subPath: .*must not contain"),
    "sub-path-dotdot": ("subPath: ..", r"volumeMounts\[0\]\.subPath: .*must not contain"),
    "sub-path-expr-backstep": ("subPathExpr: '$(POD_NAME)/../..'",
                               r"volumeMounts\[0\]\.subPathExpr: .*must not contain"),
    "sub-path-expr-absolute": ("subPathExpr: '/$(POD_NAME)'",
                               r"volumeMounts\[0\]\.subPathExpr: .*absolute"),
    "both": ("subPath: a, subPathExpr: b", "subPathExpr and subPath are mutually exclusive"),
}


@pytest.mark.parametrize(("mount", "message"), BAD_MOUNTS.values(), ids=BAD_MOUNTS.keys())
def test_sub_paths_leaving_their_volume_are_refused(mount: str, message: str) -> None:
    """``ValidateVolumeMounts``' ``validateLocalDescendingPath`` on subPath and subPathExpr
    (before expansion), and not both."""
    text = volume_pod("emptyDir: {}", f", volumeMounts: [{{name: v, mountPath: /m, {mount}}}]")
    with pytest.raises(SpecError, match=message):
        parse_manifests(text, "pod.yaml")


def test_sub_paths_of_init_containers_are_checked_too() -> None:
    """Every container list is checked, named in the message."""
    text = ("kind: Pod\nmetadata: {name: p}\nspec: {initContainers: [{name: i, image: x, "
            "volumeMounts: [{name: v, mountPath: /m, subPath: ../x}]}], "
            "volumes: [{name: v, emptyDir: {}}]}")
    with pytest.raises(SpecError, match=r"initContainers\[0\]\.volumeMounts\[0\]\.subPath"):
        parse_manifests(text, "pod.yaml")


def test_relative_sub_paths_pass() -> None:
    """Nested subPaths and an expression to expand later are valid."""
    text = volume_pod("emptyDir: {}", ", volumeMounts: [{name: v, mountPath: /a, subPath: x/y},"
                      " {name: v, mountPath: /b, subPathExpr: 'logs/$(POD_NAME)'}]")
    assert len(parse_manifests(text).pods) == 1


UP_BAD = {
    "setuid-mode": ("configMap: {name: app, defaultMode: 2541}", "",
                    "pod default/p volume v: configMap.defaultMode 2541"),
    "item-path": ("configMap: {name: app, items: [{key: k, path: /etc/cron.d/x}]}", "",
                  "pod default/p volume v: configMap.items[0].path"),
    "sub-path": ("configMap: {name: app}", ", volumeMounts: [{name: v, mountPath: /m, "
                 "subPath: ../../etc}]", "pod default/p containers[0].volumeMounts[0].subPath"),
}


@pytest.mark.root
@pytest.mark.parametrize(("source", "mounts", "field"), UP_BAD.values(), ids=UP_BAD.keys())
def test_up_refuses_an_invalid_pod_and_records_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, mounts: str, field: str
) -> None:
    """``kubevol up`` of a manifest whose pod the API server would refuse: exit 64 naming the
    field, no pod record and no pod directory (before, the setuid mode was written and the
    bad path recorded, to fail at every later ``up``)."""
    manifest = tmp_path / "pod.yaml"
    manifest.write_text("kind: ConfigMap\nmetadata: {name: app}\ndata: {k: v}\n---\n"
                        + volume_pod(source, mounts) + "\n")
    root = tmp_path / "root"
    code = main(["up", "--root", str(root), "--node-name", "n1", str(manifest)])
    assert code == 64
    err = capsys.readouterr().err
    assert field in err, err
    assert not (root / "pods").exists()
    assert not (root / "kubevol" / "pods").exists() or not os.listdir(root / "kubevol" / "pods")


def test_a_record_edited_to_hold_an_invalid_pod_is_skipped(tmp_path: Path) -> None:
    """Records are hostile input: one whose pod was edited on disk to a setuid defaultMode is
    reported and skipped by read, scan and the watcher; the other records still load."""
    records = PodRecords(NodeVolumeHost(root_dir=str(tmp_path), node_name="n"))
    text = "\n---\n".join(
        f"kind: Pod\nmetadata: {{name: {n}}}\nspec: {{volumes: [{{name: v, configMap: "
        "{name: app, defaultMode: 0644}}]}" for n in ("good", "edited")
    )
    good, edited = records_for(parse_manifests(text), PodState.RUNNING)
    records.write_many([good, edited])
    path = os.path.join(records.dir, f"{edited.uid}.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data["objects"][0]["spec"]["volumes"][0]["configMap"]["defaultMode"] = 0o4755
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)

    found, bad = records.scan()
    assert [r.uid for r in found] == [good.uid]
    assert list(bad) == [edited.uid]
    assert re.search(rf"record of pod {edited.uid}: pod default/edited volume v: "
                     r"configMap\.defaultMode 2541 \(0o4755\) is not valid", bad[edited.uid])
    with pytest.raises(RecordError, match="must be a number between 0 and 0777"):
        records.read(edited.uid)
    watcher = RecordWatcher(records)
    loaded, _ = watcher.refresh()
    assert list(loaded) == [good.uid] and list(watcher.unreadable) == [edited.uid]
