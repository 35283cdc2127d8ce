"""Covers kubevol.node.agent.

``kubevol agent`` end to end: real mounts, the bundled hostpath CSI driver on a unix
socket, a static-pod directory changed while the agent runs, and its /metrics scraped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

import kubevol.spec
from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.node.agent import Agent
from kubevol.node.runtime import NodeRuntime
from kubevol.node.sdnotify import SystemdNotifier
from kubevol.plugins.csi.registration.server import serve_registration
from kubevol.testing.mount_rig import mounts_under, unmount_all_under
from kubevol.testing.waiting import wait_until

UIDS = {
    "web": "0000000a-0000-4000-8000-000000000001",
    "db": "0000000a-0000-4000-8000-000000000002",
    "raw": "0000000a-0000-4000-8000-000000000003",
}


@attrs.define
class AgentEnv:
    tmp: Path
    root: Path
    manifests: Path
    driver: RunningDriver

    def create_volume(self, name: str, *, block: bool = False) -> str:
        cap = t.VolumeCapability.block() if block else t.VolumeCapability.mount()
        with CSIClient(self.driver.endpoint) as client:
            volume = client.create_volume(
                name, [cap], capacity_range=t.CapacityRange(required_bytes=16 << 20)
            )
        return volume.volume_id

    def pod_volume(self, pod: str, volume: str, plugin: str = "kubernetes.io~csi") -> str:
        return f"{self.root}/pods/{UIDS[pod]}/volumes/{plugin}/{volume}"


@pytest.fixture
def env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AgentEnv]:
    """The hostpath driver keeping its volumes on a tmpfs of its own (so that their usage
    does not move with the rest of the machine), a root and an empty manifest directory.
    Parametrised indirectly with True, the driver attaches (PUBLISH_UNPUBLISH_VOLUME)."""
    if os.geteuid() != 0:
        pytest.fail("the agent tests need root (real mounts)")
    (tmp_path / "hp").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(tmp_path / "hp")],
                   check=True)
    (tmp_path / "manifests").mkdir()
    running = HostPathDriver(
        HostPathConfig(state_dir=str(tmp_path / "hp"), node_id="n1",
                       enable_attach=getattr(request, "param", False))
    ).serve()
    try:
        yield AgentEnv(tmp=tmp_path, root=tmp_path / "root", manifests=tmp_path / "manifests",
                       driver=running)
    finally:
        running.stop()
        unmount_all_under(tmp_path)


def pv(name: str, handle: str, *, block: bool = False) -> str:
    mode = "volumeMode: Block\n  " if block else ""
    return f"""---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {name}}}
spec:
  {mode}capacity: {{storage: 16Mi}}
  accessModes: [ReadWriteOnce]
  csi: {{driver: {DRIVER_NAME}, volumeHandle: "{handle}"}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}-claim, namespace: shop}}
spec: {{volumeName: {name}, accessModes: [ReadWriteOnce]{", volumeMode: Block" if block else ""}}}
"""


def pod(name: str, volumes: str, containers: str = "[{name: c, image: x}]") -> str:
    return f"""---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: shop, uid: {UIDS[name]}}}
spec:
  containers: {containers}
  volumes:
{volumes}"""


def write_atomically(path: Path, text: str) -> None:
    """An editor's save: a temporary file renamed into place."""
    tmp = path.parent / f".{path.name}.swp"
    tmp.write_text(text)
    os.rename(tmp, path)


@attrs.define
class RunningAgent:
    agent: Agent
    thread: threading.Thread
    stop: threading.Event

    def url(self, path: str) -> str:
        assert self.agent.server is not None
        return f"http://{self.agent.server.address}{path}"

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """``/metrics`` as Prometheus' text parser reads it, by series; a series given twice
        (which Prometheus would silently take one of) fails the test."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as resp:
            text = resp.read().decode()
        samples = [
            ((s.name, tuple(sorted(s.labels.items()))), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
        out = dict(samples)
        assert len(out) == len(samples), f"duplicate series in /metrics:\n{text}"
        return out


class AgentThreads:
    """Agents run in threads of the test, each with its runtime; :meth:`stop_all` stops
    them (nothing torn down), closes them and their runtimes."""

    def __init__(self) -> None:
        self._started: list[tuple[Agent, threading.Thread, threading.Event, NodeRuntime]] = []

    def run(self, agent: Agent, runtime: NodeRuntime) -> tuple[threading.Thread, threading.Event]:
        """Start ``agent`` in a thread and wait for its first reconcile pass."""
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        self._started.append((agent, thread, stop, runtime))
        wait_until(agent.ready.is_set, 30, "the first reconcile pass")
        return thread, stop

    def stop_all(self) -> None:
        for agent, thread, stop, runtime in self._started:
            stop.set()
            thread.join(30)
            agent.close()
            runtime.close()


@pytest.fixture
def start_agent(env: AgentEnv) -> Iterator[Callable[..., RunningAgent]]:
    threads = AgentThreads()

    def start(**kwargs: object) -> RunningAgent:
        runtime = NodeRuntime(str(env.root), node_name="n1",
                              csi_drivers={DRIVER_NAME: env.driver.endpoint})
        agent = Agent(runtime, manifest_dir=str(env.manifests),
                      metrics_address="127.0.0.1:0", **kwargs)  # type: ignore[arg-type]
        thread, stop = threads.run(agent, runtime)
        return RunningAgent(agent=agent, thread=thread, stop=stop)

    yield start
    threads.stop_all()


def test_static_pods_come_and_go(env: AgentEnv, start_agent: Callable[..., RunningAgent]) -> None:
    """Manifests dropped into the directory are mounted (CSI filesystem, CSI block,
    emptyDir); removing a volume from a pod tears only it down; deleting a manifest tears
    its pod down and unstages its volume; stopping the agent leaves the rest mounted."""
    running = start_agent()
    assert running.agent.running_pods() == []
    web_handle = env.create_volume("web-data")
    raw_handle = env.create_volume("raw-disk", block=True)
    (env.manifests / "web.yaml").write_text(pv("pv-web", web_handle) + pod("web", """\
  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}
  - {name: scratch, emptyDir: {}}
"""))
    write_atomically(env.manifests / "raw.yaml", pv("pv-raw", raw_handle, block=True) + pod(
        "raw", "  - {name: disk, persistentVolumeClaim: {claimName: pv-raw-claim}}\n",
        "[{name: c, image: x, volumeDevices: [{name: disk, devicePath: /dev/xvda}]}]"))
    (env.manifests / "db.yaml").write_text(pod("db", "  - {name: cache, emptyDir: {}}\n"))
    (env.manifests / "notes.txt").write_text("not a manifest")

    web_mount = env.pod_volume("web", "pv-web") + "/mount"
    raw_link = f"{env.root}/pods/{UIDS['raw']}/volumeDevices/kubernetes.io~csi/pv-raw"
    wait_until(lambda: running.agent.running_pods() == sorted(UIDS.values()), 30, "all three pods")
    wait_until(lambda: web_mount in mounts_under(env.root), 30, "the CSI mount")
    wait_until(lambda: os.path.lexists(raw_link), 30, "the block device link")
    assert os.path.isdir(env.pod_volume("db", "cache", "kubernetes.io~empty-dir"))
    assert running.agent.health() is None

    # Edit: the web pod loses its CSI volume.
    write_atomically(env.manifests / "web.yaml", pv("pv-web", web_handle) + pod(
        "web", "  - {name: scratch, emptyDir: {}}\n"))
    globalmounts = [m for m in mounts_under(env.root) if m.endswith("/globalmount")]
    assert globalmounts
    wait_until(lambda: web_mount not in mounts_under(env.root), 30, "the removed volume torn down")
    wait_until(lambda: not any(
        m.endswith("/globalmount") for m in mounts_under(env.root)
    ), 30, "its device unstaged")
    assert os.path.isdir(env.pod_volume("web", "scratch", "kubernetes.io~empty-dir"))

    # Delete: the raw pod goes, its device link and directory with it.
    (env.manifests / "raw.yaml").unlink()
    wait_until(lambda: not os.path.lexists(f"{env.root}/pods/{UIDS['raw']}"),
        30, "the raw pod gone")
    assert running.agent.running_pods() == sorted([UIDS["web"], UIDS["db"]])
    assert not [m for m in mounts_under(env.root) if "pv-raw" in m]  # unpublished, unstaged

    running.stop.set()
    running.thread.join(30)
    assert not running.thread.is_alive()
    # Stopping tears nothing down.
    assert os.path.isdir(env.pod_volume("db", "cache", "kubernetes.io~empty-dir"))
    assert os.path.isdir(env.pod_volume("web", "scratch", "kubernetes.io~empty-dir"))


def csi_mount_operations(
    running: RunningAgent, names: tuple[str, ...] = ("mount_device", "volume_mount")
) -> dict[str, float]:
    """How many mount_device (NodeStageVolume) and volume_mount (NodePublishVolume)
    operations of the CSI plugin the agent ran, by operation name (or of the ``names``
    given)."""
    out = dict.fromkeys(names, 0.0)
    for (name, labels), value in running.scrape().items():
        label = dict(labels)
        if (name == "storage_operation_duration_seconds_count"
                and "csi" in label.get("volume_plugin", "")
                and label.get("operation_name") in out):
            out[label["operation_name"]] += value
    return out


def test_a_restarted_agent_stages_and_publishes_nothing_again(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]
) -> None:
    """An agent started again on a root where its pods' volumes are mounted (a restart, a
    crash) takes the device and pod mounts it finds as done: it settles without a
    NodeStageVolume or NodePublishVolume. A pod mount that went away while no agent ran is
    set up again (published), its device mount, still there, is not staged again."""
    handle = env.create_volume("web-data")
    (env.manifests / "web.yaml").write_text(pv("pv-web", handle) + pod("web", """\
  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}
  - {name: scratch, emptyDir: {}}
"""))
    web_mount = env.pod_volume("web", "pv-web") + "/mount"
    first = start_agent()
    wait_until(first.agent.settled.is_set, 30, "the first agent settled")
    assert web_mount in mounts_under(env.root)
    assert csi_mount_operations(first) == {"mount_device": 1.0, "volume_mount": 1.0}
    first.stop.set()
    first.thread.join(30)

    second = start_agent()
    wait_until(second.agent.settled.is_set, 30, "the restarted agent settled")
    assert csi_mount_operations(second) == {"mount_device": 0.0, "volume_mount": 0.0}
    assert web_mount in mounts_under(env.root)
    assert second.agent.running_pods() == [UIDS["web"]]
    second.stop.set()
    second.thread.join(30)

    subprocess.run(["umount", web_mount], check=True)
    third = start_agent()
    wait_until(lambda: web_mount in mounts_under(env.root), 30, "the pod mount set up again")
    wait_until(third.agent.settled.is_set, 30, "the third agent settled")
    assert csi_mount_operations(third) == {"mount_device": 0.0, "volume_mount": 1.0}


def test_a_restarted_agent_finds_its_pods_without_building_their_models(
    env: AgentEnv, start_agent: Callable[..., RunningAgent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pods a restarted agent reads back from its records were accepted before: their
    V1Pod models (0.1-0.2 s of class imports, then one build per pod) are built when first
    read, and neither settling after a restart nor the volume stats refresh that follows
    (which finds the pods' claims) reads one. Read, the model is the pod's."""
    handle = env.create_volume("web-data")
    (env.manifests / "web.yaml").write_text(pv("pv-web", handle) + pod("web", """\
  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}
  - {name: scratch, emptyDir: {}}
"""))
    first = start_agent()
    wait_until(first.agent.settled.is_set, 30, "the first agent settled")
    first.stop.set()
    first.thread.join(30)

    built: list[str] = []
    deserialize, api_object = kubevol.spec.deserialize, kubevol.spec.api_object

    def count(type_name: str) -> None:
        built.append(type_name)

    # The two ways a pod's model is built: from a manifest, and deferred.
    def counted_deserialize(data: Mapping[str, object], type_name: str) -> object:
        count(type_name)
        return deserialize(data, type_name)

    def counted_api_object(type_name: str, data: Mapping[str, object]) -> object:
        count(type_name)
        return api_object(type_name, data)

    monkeypatch.setattr("kubevol.node.manifests.deserialize", counted_deserialize)
    monkeypatch.setattr("kubevol.spec.api_object", counted_api_object)
    second = start_agent(stats_period=0.2)
    wait_until(second.agent.settled.is_set, 30, "the restarted agent settled")
    assert second.agent.running_pods() == [UIDS["web"]]
    stats = second.agent.metrics.stats
    wait_until(lambda: [(c.namespace, c.claim) for c in stats.snapshot()]
               == [("shop", "pv-web-claim")], 30, "the claim's usage measured")
    assert "V1Pod" not in built
    assert built  # the volumes' models were built, and counted
    desired = second.agent.pods.manager.desired.pod(UIDS["web"])
    assert desired is not None
    metadata = desired.pod.metadata
    assert metadata is not None and metadata.name == "web"


def test_an_idle_agent_closes_its_driver_channel_and_opens_it_for_the_next_pod(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]
) -> None:
    """An agent idle for ``channel_idle_period`` closes the driver's gRPC channel (its open
    channel kept gRPC's threads busy); the next pod's calls open it again and the pod is
    set up."""
    first, second = env.create_volume("web-data"), env.create_volume("db-data")
    (env.manifests / "web.yaml").write_text(pv("pv-web", first) + pod("web", """\
  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}
"""))
    running = start_agent(channel_idle_period=0.3)
    wait_until(running.agent.settled.is_set, 30, "the agent settled")
    client = running.agent.runtime.registry.client(DRIVER_NAME)
    wait_until(lambda: not client.channel_open, 10, "the idle channel closed")
    (env.manifests / "db.yaml").write_text(pv("pv-db", second) + pod("db", """\
  - {name: data, persistentVolumeClaim: {claimName: pv-db-claim}}
"""))
    db_mount = env.pod_volume("db", "pv-db") + "/mount"
    wait_until(lambda: db_mount in mounts_under(env.root), 30, "the next pod's volume mounted")
    # An operation's duration is recorded as it ends, after its mount is there.
    wait_until(lambda: csi_mount_operations(running) == {"mount_device": 2.0,
                                                         "volume_mount": 2.0},
               10, "both pods' volumes staged and published, once each")


def test_a_restarted_agent_takes_a_finished_empty_dir_as_done(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]
) -> None:
    """A disk emptyDir whose set-up finished (its ready marker, written last, is there) is
    not set up again by a restarted agent (no set-up operation of the empty-dir plugin);
    one without the marker (a crash in the middle of its set-up) is, and gets its marker."""
    (env.manifests / "web.yaml").write_text(pod("web", "  - {name: scratch, emptyDir: {}}\n"))
    ready = f"{env.root}/pods/{UIDS['web']}/plugins/kubernetes.io~empty-dir/scratch/ready"

    def set_ups_until_settled() -> float:
        running = start_agent()
        wait_until(running.agent.settled.is_set, 30, "the agent settled")
        count = set_ups(running, "kubernetes.io/empty-dir")
        running.stop.set()
        running.thread.join(30)
        return count

    assert set_ups_until_settled() == 1.0 and os.path.isfile(ready)
    assert set_ups_until_settled() == 0.0  # restarted: taken as done
    os.unlink(ready)
    assert set_ups_until_settled() == 1.0 and os.path.isfile(ready)


def set_ups(running: RunningAgent, plugin: str) -> float:
    """How many set-ups (volume_mount operations) of ``plugin`` the agent ran."""
    return sum(
        value for (name, labels), value in running.scrape().items()
        if name == "storage_operation_duration_seconds_count"
        and dict(labels).get("volume_plugin") == plugin
        and dict(labels).get("operation_name") == "volume_mount"
    )


@pytest.mark.parametrize("env", [False, True], indirect=True,
                         ids=["driver-attaching-nothing", "driver-attaching"])
def test_an_agent_runs_an_attach_only_where_attaching_does_something(
    env: AgentEnv, start_agent: Callable[..., RunningAgent], request: pytest.FixtureRequest
) -> None:
    """A CSI volume whose driver attaches nothing (no PUBLISH_UNPUBLISH_VOLUME, on a node
    that attaches by itself) is taken as attached with no attach operation: when a pod
    first uses it (stage and publish follow at once, two steps as in the kubelet) and when
    a restarted agent finds its device mounted (nothing at all). A volume whose driver
    attaches gets its attach at each start (ControllerPublishVolume is idempotent, and
    gives back the publish context a new process does not know)."""
    attaching = 1.0 if request.node.callspec.params["env"] else 0.0
    handle = env.create_volume("web-data")
    (env.manifests / "web.yaml").write_text(pv("pv-web", handle) + pod("web", """\
  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}
"""))
    counts = []
    for _ in range(2):
        running = start_agent()
        wait_until(running.agent.settled.is_set, 30, "the agent settled")
        counts.append(csi_mount_operations(
            running, ("volume_attach", "mount_device", "volume_mount")))
        running.stop.set()
        running.thread.join(30)
    assert counts[0] == {"volume_attach": attaching, "mount_device": 1.0, "volume_mount": 1.0}
    assert counts[1] == {"volume_attach": attaching, "mount_device": 0.0, "volume_mount": 0.0}
    assert env.pod_volume("web", "pv-web") + "/mount" in mounts_under(env.root)


@pytest.mark.parametrize("after_the_mount", ["fsGroup", "subPath"])
def test_a_restarted_agent_sets_up_again_what_has_steps_after_the_mount(
    env: AgentEnv, start_agent: Callable[..., RunningAgent], after_the_mount: str
) -> None:
    """A volume whose set-up goes on after the driver's mount (fsGroup ownership, a subPath
    bind) is set up again by a restarted agent, as the kubelet sets up every volume it
    reconstructs: a crash between the mount and those steps would otherwise leave the pod
    without them for good."""
    handle = env.create_volume("web-data")
    text = pv("pv-web", handle) + pod(
        "web", "  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}\n",
        "[{name: c, image: x, volumeMounts: [{name: data, mountPath: /d, subPath: logs}]}]"
        if after_the_mount == "subPath" else "[{name: c, image: x}]")
    if after_the_mount == "fsGroup":
        text = text.replace("spec:\n  containers:", "spec:\n  securityContext: {fsGroup: 2000}\n"
                            "  containers:")
        assert "fsGroup: 2000" in text
    (env.manifests / "web.yaml").write_text(text)
    first = start_agent()
    wait_until(first.agent.settled.is_set, 30, "the first agent settled")
    first.stop.set()
    first.thread.join(30)

    second = start_agent()
    wait_until(second.agent.settled.is_set, 30, "the restarted agent settled")
    assert csi_mount_operations(second) == {"mount_device": 0.0, "volume_mount": 1.0}


def test_a_half_written_manifest_is_not_read(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]
) -> None:
    """A manifest still open for writing is read only once its writer closes it; a manifest
    that is not valid is reported and changes nothing."""
    running = start_agent()
    path = env.manifests / "db.yaml"
    with open(path, "w") as f:
        f.write(pod("db", "  - {name: cache, emptyDir: {}}\n")[:60])
        f.flush()
        time.sleep(0.5)
        assert running.agent.running_pods() == []
        assert running.agent.source is not None and running.agent.source.errors == {}
        f.write(pod("db", "  - {name: cache, emptyDir: {}}\n")[60:])
    wait_until(lambda: running.agent.running_pods() == [UIDS["db"]], 30, "the pod")

    (env.manifests / "bad.yaml").write_text("kind: Pod\nmetadata: {name: [\n")
    wait_until(lambda: "bad.yaml" in running.agent.source.errors, 30, "the bad file reported")  # type: ignore[union-attr]
    assert running.agent.running_pods() == [UIDS["db"]]


def test_metrics_match_kubevol_metrics(
    env: AgentEnv, start_agent: Callable[..., RunningAgent], capsys: pytest.CaptureFixture[str]
) -> None:
    """/metrics has the claim's kubelet_volume_stats_* with the kubelet's labels and the same
    values `kubevol metrics` reports for that volume; operations are timed under the
    kubelet's names; /healthz answers ok."""
    running = start_agent(stats_period=0.2)
    handle = env.create_volume("web-data")
    (env.manifests / "web.yaml").write_text(pv("pv-web", handle) + pod(
        "web", "  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}\n"))
    mount = env.pod_volume("web", "pv-web") + "/mount"
    wait_until(lambda: mount in mounts_under(env.root), 30, "the CSI mount")
    with open(os.path.join(mount, "payload"), "wb") as f:
        f.write(b"x" * (1 << 20))
    labels = (("namespace", "shop"), ("persistentvolumeclaim", "pv-web-claim"))

    def used() -> float | None:
        return running.scrape().get(("kubelet_volume_stats_used_bytes", labels))

    wait_until(lambda: (used() or 0) >= 1 << 20, 30, "a measurement with the payload")
    # The cache is refreshed on its period: wait out one more, so both see the same tree.
    time.sleep(0.5)
    samples = running.scrape()
    capsys.readouterr()
    assert main(["metrics", mount, "--provider", "du", "-o", "json"]) == 0
    walked = json.loads(capsys.readouterr().out)
    assert main(["csi", "node", "stats", "-e", env.driver.endpoint, "-o", "json",
                 f"{handle}:{mount}"]) == 0
    (stats,) = json.loads(capsys.readouterr().out)
    by_unit = {t.UsageUnit[u["unit"]]: u for u in stats["usage"]}  # enums by name
    # A CSI volume's figures are its driver's NodeGetVolumeStats, as in the kubelet; the
    # hostpath driver measures used bytes and inodes with du, as `kubevol metrics` does.
    expected = {
        "kubelet_volume_stats_capacity_bytes": by_unit[t.UsageUnit.BYTES]["total"],
        "kubelet_volume_stats_available_bytes": by_unit[t.UsageUnit.BYTES]["available"],
        "kubelet_volume_stats_used_bytes": walked["used"],
        "kubelet_volume_stats_inodes": walked["inodes"],
        "kubelet_volume_stats_inodes_free": walked["inodes_free"],
        "kubelet_volume_stats_inodes_used": walked["inodes_used"],
        "kubelet_volume_stats_health_status_abnormal": 0,
    }
    assert by_unit[t.UsageUnit.BYTES]["used"] == walked["used"] == 1 << 20
    assert by_unit[t.UsageUnit.INODES]["total"] == walked["inodes"]
    assert {m: samples[(m, labels)] for m in expected} == expected
    mounted = ("storage_operation_duration_seconds_count", (
        ("migrated", "false"), ("operation_name", "volume_mount"), ("status", "success"),
        ("volume_plugin", f"kubernetes.io/csi:{DRIVER_NAME}"),
    ))
    assert samples[mounted] == 1
    staged = ("storage_operation_duration_seconds_count", (
        ("migrated", "false"), ("operation_name", "mount_device"), ("status", "success"),
        ("volume_plugin", f"kubernetes.io/csi:{DRIVER_NAME}"),
    ))
    assert samples[staged] == 1
    assert samples[("kubevol_reconciler_desired_volumes", ())] == 1
    assert samples[("kubevol_reconciler_actual_volumes", ())] == 1
    assert samples[("kubevol_reconciler_uncertain_volumes", ())] == 0
    with urllib.request.urlopen(running.url("/healthz"), timeout=10) as resp:
        assert resp.status == 200 and resp.read() == b"ok"


def test_healthz_and_systemd_notify(env: AgentEnv, tmp_path: Path) -> None:
    """Before its first pass the agent is not healthy; systemd hears READY=1 after the first
    pass, WATCHDOG=1 as $WATCHDOG_USEC asks, and STOPPING=1 when it stops."""
    import socket

    sock_path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(sock_path)
    listener.settimeout(10)
    runtime = NodeRuntime(str(env.root), node_name="n1")
    agent = Agent(runtime, manifest_dir=str(env.manifests), metrics_address="127.0.0.1:0",
                  notifier=SystemdNotifier(sock_path, watchdog_usec=200_000))
    assert agent.health() == "the first reconcile pass has not finished"
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        messages = [listener.recv(100).decode() for _ in range(3)]
        assert messages[0] == "READY=1"
        assert messages[1:] == ["WATCHDOG=1", "WATCHDOG=1"]
        assert agent.health() is None
        assert agent.server is not None
        address = agent.server.address
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        stop.set()
        thread.join(30)
    rest = []
    listener.settimeout(0.5)
    try:
        while True:
            rest.append(listener.recv(100).decode())
    except TimeoutError:
        pass
    listener.close()
    assert rest[-1] == "STOPPING=1"
    assert agent.health() == "the agent is not running"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{address}/healthz", timeout=2)
    agent.close()
    runtime.close()


def test_drivers_register_through_the_plugins_registry(env: AgentEnv) -> None:
    """A CSI driver the agent was not told about registers by putting its registration
    socket in the agent's plugins_registry (the node-driver-registrar protocol); its
    volumes are then mounted for static pods."""
    # Registration socket paths must fit a sockaddr_un: a short directory of the test's own.
    registry_dir = tempfile.mkdtemp(prefix="kvreg-", dir="/tmp")
    runtime = NodeRuntime(str(env.root), node_name="n1")
    agent = Agent(runtime, manifest_dir=str(env.manifests), plugins_registry=registry_dir)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    server = None
    try:
        wait_until(agent.ready.is_set, 30, "the first reconcile pass")
        assert not runtime.registry.is_registered(DRIVER_NAME)
        server = serve_registration(env.driver.handle, DRIVER_NAME, registry_dir)
        status = server.wait_for_status(10)
        assert status is not None and status.registered
        handle = env.create_volume("web-data")
        (env.manifests / "web.yaml").write_text(pv("pv-web", handle) + pod(
            "web", "  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}\n"))
        mount = env.pod_volume("web", "pv-web") + "/mount"
        wait_until(lambda: mount in mounts_under(env.root), 30, "the CSI mount")
    finally:
        if server is not None:
            server.stop()
        stop.set()
        thread.join(30)
        agent.close()
        runtime.close()
        shutil.rmtree(registry_dir, ignore_errors=True)
