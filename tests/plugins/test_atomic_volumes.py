"""Covers kubevol.plugins.atomic_volume: configMap, secret, downwardAPI and projected volumes.

configMap, secret, downwardAPI and projected volumes on real directories and real tmpfs
mounts: the kubelet's layout, updates, optional sources, missing objects and keys, modes and
fsGroup, tokens, tear-down and reconstruction."""

from __future__ import annotations

import base64
import datetime
import os
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubevol import MounterArgs, NodeVolumeHost, Spec, VolumeOptions, VolumePluginMgr
from kubevol.errors import InvalidPayloadPathError, SpecError
from kubevol.k8s.objects import ManifestObjects, ObjectNotFoundError
from kubevol.k8s.tokens import IssuedToken, TokenManager, TokenProvider, TokenRequest
from kubevol.mount import parse_mountinfo
from kubevol.plugins import (
    ConfigMapPlugin,
    DownwardAPIPlugin,
    EmptyDirPlugin,
    ProjectedPlugin,
    SecretPlugin,
)
from kubevol.plugins.atomic_volume import AtomicVolume, PayloadError
from kubevol.spec import api_object

UID = "pod-uid-1"
CANARY_SECRET = "canary-secret-7f3a"
TS = re.compile(r"^\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.\d+$")


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def make_pod(uid: str = UID, **spec: Any) -> Any:
    return api_object("V1Pod", {
        "metadata": {"name": "web", "namespace": "prod", "uid": uid, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "500m"}}}],
                 **spec},
    })


def volume(name: str, **source: Any) -> Spec:
    return Spec.from_volume(api_object("V1Volume", {"name": name, **source}))


class FakeClockProvider(TokenProvider):
    """Issues ``tok-N`` from a clock the test moves."""

    def __init__(self) -> None:
        self.now = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
        self.issued = 0

    def request_token(self, request: TokenRequest) -> IssuedToken:
        self.issued += 1
        return IssuedToken(
            token=f"tok-{self.issued}-{request.service_account}-{'+'.join(request.audiences)}",
            expiration=self.now + datetime.timedelta(seconds=request.expiration_seconds),
            expiration_seconds=request.expiration_seconds,
        )


@pytest.fixture
def objects() -> ManifestObjects:
    return ManifestObjects([
        {"kind": "ConfigMap", "metadata": {"name": "app", "namespace": "prod"},
         "data": {"a.conf": "alpha", "b.conf": "beta"},
         "binaryData": {"bin": base64.b64encode(b"\x00\xff").decode()}},
        {"kind": "Secret", "metadata": {"name": "creds", "namespace": "prod"},
         "data": {"password": b64(CANARY_SECRET)}, "stringData": {"user": "admin"}},
    ])


@pytest.fixture
def provider() -> FakeClockProvider:
    return FakeClockProvider()


@pytest.fixture
def host(node_root: Path, objects: ManifestObjects, provider: FakeClockProvider) -> NodeVolumeHost:
    tokens = TokenManager(provider, clock=lambda: provider.now, jitter=lambda: 0.0)
    return NodeVolumeHost(root_dir=str(node_root), node_name="node-1", objects=objects,
                          tokens=tokens)


@pytest.fixture
def mgr(host: NodeVolumeHost) -> VolumePluginMgr:
    mgr = VolumePluginMgr()
    mgr.init_plugins([EmptyDirPlugin(), ConfigMapPlugin(), SecretPlugin(), DownwardAPIPlugin(),
                      ProjectedPlugin()], host=host)
    return mgr


@pytest.fixture
def set_up(mgr: VolumePluginMgr) -> Iterator[Any]:
    """Set a spec up for the pod; every volume set up is torn down afterwards."""
    made: list[AtomicVolume] = []

    def run(spec: Spec, pod: Any = None, args: MounterArgs | None = None) -> AtomicVolume:
        mounter = mgr.find_plugin_by_spec(spec).new_mounter(spec, pod or make_pod(),
                                                            VolumeOptions())
        assert isinstance(mounter, AtomicVolume)
        made.append(mounter)
        mounter.set_up(args or MounterArgs())
        return mounter

    yield run
    for m in made:
        m.tear_down()


def fs_type(path: str) -> str | None:
    types = [m.fs_type for m in parse_mountinfo() if m.mount_point == path]
    return types[-1] if types else None


def ready(root: Path, volume_name: str) -> Path:
    return root / "pods" / UID / "plugins" / "kubernetes.io~empty-dir" / f"wrapped_{volume_name}" \
        / "ready"


def user_visible(path: str) -> dict[str, str]:
    return {n: os.readlink(os.path.join(path, n)) for n in os.listdir(path)
            if not n.startswith("..")}


def test_config_map_layout_on_disk(set_up: Any, node_root: Path) -> None:
    """Disk (no mount), the kubelet's path, links into ``..data``, ready marker, 0644."""
    m = set_up(volume("cfg", configMap={"name": "app"}))
    path = node_root / "pods" / UID / "volumes" / "kubernetes.io~configmap" / "cfg"
    assert m.get_path() == str(path)
    assert fs_type(str(path)) is None
    assert user_visible(str(path)) == {"a.conf": "..data/a.conf", "b.conf": "..data/b.conf",
                                       "bin": "..data/bin"}
    assert TS.match(os.readlink(path / "..data"))
    assert (path / "a.conf").read_text() == "alpha"
    assert (path / "bin").read_bytes() == b"\x00\xff"
    assert stat.S_IMODE((path / "a.conf").stat().st_mode) == 0o644
    assert ready(node_root, "cfg").is_file()


def test_items_paths_and_modes(set_up: Any, node_root: Path) -> None:
    """Only the listed keys, at their paths, with per-item and default modes."""
    m = set_up(volume("cfg", configMap={"name": "app", "defaultMode": 0o440, "items": [
        {"key": "a.conf", "path": "etc/a"}, {"key": "b.conf", "path": "b", "mode": 0o400}]}))
    path = Path(m.get_path())
    assert user_visible(str(path)) == {"etc": "..data/etc", "b": "..data/b"}
    assert stat.S_IMODE((path / "etc" / "a").stat().st_mode) == 0o440
    assert stat.S_IMODE((path / "b").stat().st_mode) == 0o400


@pytest.mark.root
def test_missing_objects_and_keys(set_up: Any, mgr: VolumePluginMgr, node_root: Path) -> None:
    """Not optional: the kubelet's errors and nothing left; optional: an empty volume."""
    with pytest.raises(ObjectNotFoundError, match=r'^configmap "nope" not found$'):
        set_up(volume("cfg", configMap={"name": "nope"}))
    with pytest.raises(SpecError, match=r"^configmap references non-existent config key: x$"):
        set_up(volume("cfg", configMap={"name": "app", "items": [{"key": "x", "path": "x"}]}))
    with pytest.raises(SpecError, match=r"^references non-existent secret key: x$"):
        set_up(volume("s", secret={"secretName": "creds", "items": [{"key": "x", "path": "x"}]}))
    assert not (node_root / "pods" / UID / "volumes").exists() or not any(
        (node_root / "pods" / UID / "volumes").rglob("*..data*"))
    assert not ready(node_root, "cfg").exists()
    m = set_up(volume("cfg", configMap={"name": "nope", "optional": True}))
    assert user_visible(m.get_path()) == {}
    m = set_up(volume("opt", secret={"secretName": "creds", "optional": True,
                                     "items": [{"key": "x", "path": "x"},
                                               {"key": "user", "path": "u"}]}))
    assert user_visible(m.get_path()) == {"u": "..data/u"}


def test_update_brings_added_changed_and_removed_keys(
    set_up: Any, objects: ManifestObjects
) -> None:
    """A second set-up after the ConfigMap changed rewrites exactly the new content."""
    m = set_up(volume("cfg", configMap={"name": "app"}))
    path = m.get_path()
    first = os.readlink(os.path.join(path, "..data"))
    m.set_up(MounterArgs())
    assert os.readlink(os.path.join(path, "..data")) == first  # unchanged: not rewritten
    objects.add({"kind": "ConfigMap", "metadata": {"name": "app", "namespace": "prod"},
                 "data": {"a.conf": "ALPHA", "c.conf": "gamma"}})
    m.set_up(MounterArgs())
    assert os.readlink(os.path.join(path, "..data")) != first
    assert sorted(user_visible(path)) == ["a.conf", "c.conf"]
    assert Path(path, "a.conf").read_text() == "ALPHA"
    assert not os.path.exists(os.path.join(path, first))


@pytest.mark.root
def test_secret_on_tmpfs_and_torn_down(set_up: Any, mgr: VolumePluginMgr,
                                       node_root: Path) -> None:
    """tmpfs at the kubelet path, decoded values; tear-down unmounts and removes all."""
    spec = volume("creds", secret={"secretName": "creds"})
    m = set_up(spec)
    path = m.get_path()
    assert path.endswith("/pods/pod-uid-1/volumes/kubernetes.io~secret/creds")
    assert fs_type(path) == "tmpfs"
    assert Path(path, "password").read_text() == CANARY_SECRET
    assert Path(path, "user").read_text() == "admin"
    assert CANARY_SECRET not in repr(m.collect_payload(MounterArgs()))
    assert ready(node_root, "creds").is_file()
    unmounter = mgr.find_plugin_by_name("kubernetes.io/secret").new_unmounter("creds", UID)
    unmounter.tear_down()
    assert fs_type(path) is None
    assert not os.path.exists(path)
    assert not ready(node_root, "creds").parent.exists()


@pytest.mark.root
def test_fs_group_makes_files_group_readable(set_up: Any) -> None:
    """fsGroup: group ownership everywhere, files +0440, dirs setgid and group rx."""
    m = set_up(volume("cfg", configMap={"name": "app", "defaultMode": 0o400, "items": [
        {"key": "a.conf", "path": "d/a"}]}), args=MounterArgs(fs_group=4242))
    path = Path(m.get_path())
    data = path / os.readlink(path / "..data")
    for p in (data / "d" / "a", data / "d", data):
        st_ = p.stat()
        assert st_.st_gid == 4242
        if p.is_dir():
            assert st_.st_mode & stat.S_ISGID
            assert stat.S_IMODE(st_.st_mode) & 0o550 == 0o550
    assert stat.S_IMODE((data / "d" / "a").stat().st_mode) == 0o440
    assert os.lstat(path / "d").st_gid == 4242  # the user-visible link too


@pytest.mark.root
def test_downward_api_fields(set_up: Any) -> None:
    """Labels as quoted lines, name, and a CPU limit in millicores; on tmpfs."""
    m = set_up(volume("info", downwardAPI={"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu",
                                             "divisor": "1m"}},
    ]}))
    path = Path(m.get_path())
    assert fs_type(str(path)) == "tmpfs"
    assert (path / "labels").read_text() == 'app="web"'
    assert (path / "name").read_text() == "web"
    assert (path / "cpu").read_text() == "500"


def test_downward_api_errors_are_reported_together(set_up: Any) -> None:
    """Two bad items: one error naming both."""
    with pytest.raises(PayloadError) as info:
        set_up(volume("info", downwardAPI={"items": [
            {"path": "a", "fieldRef": {"fieldPath": "spec.bogus"}},
            {"path": "b", "resourceFieldRef": {"containerName": "x", "resource": "limits.cpu"}},
        ]}))
    assert "unsupported fieldPath: spec.bogus" in str(info.value)
    assert "container x not found" in str(info.value)


def kube_api_access(**token: Any) -> Spec:
    """The projected volume every pod gets from the ServiceAccount admission, plus a secret."""
    return volume("kube-api-access", projected={"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607, **token}},
        {"configMap": {"name": "app", "items": [{"key": "a.conf", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        {"secret": {"name": "creds", "items": [{"key": "password", "path": "pw"}]}},
    ]})


@pytest.mark.root
def test_projected_volume_with_a_token(set_up: Any, node_root: Path) -> None:
    """Every source in one tmpfs; the token from the provider for the pod's service account."""
    m = set_up(kube_api_access(audience="vault"), pod=make_pod(serviceAccountName="app"))
    path = Path(m.get_path())
    assert str(path).endswith("/volumes/kubernetes.io~projected/kube-api-access")
    assert fs_type(str(path)) == "tmpfs"
    assert sorted(user_visible(str(path))) == ["ca.crt", "namespace", "pw", "token"]
    assert (path / "token").read_text() == "tok-1-app-vault"
    assert stat.S_IMODE((path / "token").stat().st_mode) == 0o644  # defaultMode, no fsGroup
    assert (path / "namespace").read_text() == "prod"
    assert ready(node_root, "kube-api-access").is_file()


@pytest.mark.root
def test_token_file_with_fs_group_is_0640(set_up: Any) -> None:
    """With fsGroup the token is written 0600 and fsGroup makes it 0640."""
    m = set_up(kube_api_access(), args=MounterArgs(fs_group=4242))
    token = Path(m.get_path(), "token")
    assert stat.S_IMODE(token.stat().st_mode) == 0o640
    assert token.stat().st_gid == 4242


@pytest.mark.root
def test_token_file_owned_by_fs_user(set_up: Any) -> None:
    """With an fsUser the token file belongs to it, mode 0600."""
    m = set_up(kube_api_access(), args=MounterArgs(fs_user=1234))
    token = Path(m.get_path(), "token")
    assert token.stat().st_uid == 1234
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


@pytest.mark.root
def test_token_refreshed_at_80_percent(set_up: Any, provider: FakeClockProvider) -> None:
    """Set-up again before 80% of the lifetime keeps the token; after, writes a new one."""
    m = set_up(kube_api_access())
    token = Path(m.get_path(), "token")
    assert token.read_text().startswith("tok-1-")
    provider.now += datetime.timedelta(seconds=2000)  # 55% of 3607 s
    m.set_up(MounterArgs())
    assert token.read_text().startswith("tok-1-")
    provider.now += datetime.timedelta(seconds=900)  # 80.4%
    m.set_up(MounterArgs())
    assert token.read_text().startswith("tok-2-")


def test_token_without_a_provider_names_pod_volume_and_what_to_configure(
    node_root: Path, objects: ManifestObjects
) -> None:
    """No provider: a clear error, nothing mounted."""
    host = NodeVolumeHost(root_dir=str(node_root), node_name="node-1", objects=objects)
    mgr = VolumePluginMgr()
    mgr.init_plugins([EmptyDirPlugin(), ProjectedPlugin()], host=host)
    spec = kube_api_access()
    mounter = mgr.find_plugin_by_spec(spec).new_mounter(spec, make_pod(), VolumeOptions())
    with pytest.raises(Exception, match=r"pod prod/web volume 'kube-api-access' needs a "
                                        r"service-account token.*token provider") as info:
        mounter.set_up(MounterArgs())
    assert "--kubeconfig" in str(info.value)
    assert not os.path.exists(mounter.get_path())


def test_reconstructed_specs(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """Each plugin rebuilds a spec of its own kind from the volume name, as the kubelet."""
    for name, field in [("kubernetes.io/configmap", "config_map"),
                        ("kubernetes.io/secret", "secret"),
                        ("kubernetes.io/downward-api", "downward_api"),
                        ("kubernetes.io/projected", "projected")]:
        plugin = mgr.find_plugin_by_name(name)
        spec = plugin.construct_volume_spec("vol", host.get_pod_volume_dir(UID, name, "vol")).spec
        assert getattr(spec.volume, field) is not None
        assert spec.name() == "vol"
        assert mgr.find_plugin_by_spec(spec) is plugin
        assert plugin.requires_remount(spec)


@pytest.mark.slow
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.sampled_from(["/abs", "../up", "a/../../b", "..data", "..x/y", ""])
       | st.text(min_size=1, max_size=8).map(lambda t: "../" + t.replace("/", "")))
def test_bad_item_paths_write_nothing(set_up: Any, node_root: Path, bad: str) -> None:
    """An item path the writer refuses: an error naming the key, and no volume left."""
    with pytest.raises(InvalidPayloadPathError, match=r"payload key 'a.conf'"):
        set_up(volume("bad", configMap={"name": "app", "items": [
            {"key": "b.conf", "path": "ok"}, {"key": "a.conf", "path": bad}]}))
    assert not (node_root / "pods" / UID / "volumes" / "kubernetes.io~configmap" / "bad").exists()
    assert not ready(node_root, "bad").exists()


@pytest.mark.root
def test_readers_of_a_secret_volume_never_see_a_mix_during_updates(
    set_up: Any, objects: ManifestObjects
) -> None:
    """While the Secret changes and the volume is set up again and again (on tmpfs), a
    reader going through ``..data`` always sees both keys from one version."""
    def secret(version: int) -> dict[str, Any]:
        return {"kind": "Secret", "metadata": {"name": "pair", "namespace": "prod"},
                "stringData": {"left": f"v{version}", "right": f"v{version}"}}

    objects.add(secret(0))
    m = set_up(volume("pair", secret={"secretName": "pair"}))
    data = os.path.join(m.get_path(), "..data")
    stop = threading.Event()
    mixes: list[tuple[str, str]] = []
    seen: set[str] = set()

    def reader() -> None:
        while not stop.is_set():
            try:
                fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue
            try:
                pair = []
                for name in ("left", "right"):
                    f = os.open(name, os.O_RDONLY, dir_fd=fd)
                    try:
                        pair.append(os.read(f, 64).decode())
                    finally:
                        os.close(f)
            except FileNotFoundError:
                continue  # the version was retired while read: try the next one
            finally:
                os.close(fd)
            seen.add(pair[0])
            if pair[0] != pair[1]:
                mixes.append((pair[0], pair[1]))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for version in range(1, 60):
            objects.add(secret(version))
            m.set_up(MounterArgs())
    finally:
        stop.set()
        thread.join()
    assert mixes == []
    assert len(seen) > 1
    assert Path(m.get_path(), "left").read_text() == "v59"
