"""kubevol.k8s.events: client-go's correlator rules (``tools/record/events_cache.go`` and its
tests: an identical event is counted, not posted again; the tenth distinct message about one
object and reason within 10 minutes is posted as "(combined from similar events): …"; 25 events
per object at once, then one per 5 minutes) and the Events it writes on the stand-in API server
through the real ``kubernetes`` client."""

from __future__ import annotations

import time

import pytest

from kubevol.k8s.events import (
    AGGREGATE_MAX_EVENTS,
    SPAM_BURST,
    WARNING,
    EventRecorder,
    KubeEventSink,
    ObjectRef,
)
from kubevol.testing.kube_api import KubeAPIServer

POD = ObjectRef(namespace="shop", name="web", uid="11111111-2222-3333-4444-555555555555")


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, object]]] = []

    def create(self, namespace: str, event: dict[str, object]) -> None:
        self.calls.append(("create", namespace, event))

    def patch(self, namespace: str, name: str, patch: dict[str, object]) -> None:
        self.calls.append(("patch", name, patch))


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def recorder() -> tuple[EventRecorder, Sink, Clock]:
    sink, clock = Sink(), Clock()
    return EventRecorder(sink, component="kubevol", host="n1", clock=clock), sink, clock


def test_the_same_event_is_counted_not_posted_again() -> None:
    rec, sink, clock = recorder()
    rec.event(POD, WARNING, "FailedMount", "boom")
    clock.now += 5
    rec.event(POD, WARNING, "FailedMount", "boom")
    rec.close()
    (create, patch) = sink.calls
    assert create[0] == "create" and create[2]["count"] == 1
    event = create[2]
    assert event["involvedObject"] == {"kind": "Pod", "apiVersion": "v1", "namespace": "shop",
                                       "name": "web", "uid": POD.uid}
    assert event["source"] == {"component": "kubevol", "host": "n1"}
    assert str(event["metadata"]["name"]).startswith("web.")  # type: ignore[index]
    assert patch[0] == "patch" and patch[1] == event["metadata"]["name"]  # type: ignore[index]
    assert patch[2]["count"] == 2
    assert patch[2]["lastTimestamp"] != event["lastTimestamp"]


def test_similar_events_are_combined_from_the_tenth_message() -> None:
    rec, sink, _ = recorder()
    for i in range(AGGREGATE_MAX_EVENTS):
        rec.event(POD, WARNING, "FailedMount", f"boom {i}")
    rec.close()
    messages = [c[2]["message"] for c in sink.calls]
    assert messages[:-1] == [f"boom {i}" for i in range(AGGREGATE_MAX_EVENTS - 1)]
    assert messages[-1] == f"(combined from similar events): boom {AGGREGATE_MAX_EVENTS - 1}"


def test_a_source_may_say_25_things_about_an_object_then_one_per_5_minutes() -> None:
    rec, sink, clock = recorder()
    for _ in range(SPAM_BURST + 5):
        rec.event(POD, WARNING, "FailedMount", "same")  # counted: each is a patch
    assert rec.dropped == 5
    clock.now += 300
    rec.event(POD, WARNING, "FailedMount", "same")
    rec.close()
    assert len(sink.calls) == SPAM_BURST + 1


@pytest.mark.slow
def test_events_reach_the_api_server() -> None:
    with KubeAPIServer() as api:
        rec = EventRecorder(KubeEventSink(api.api_client()), component="kubevol", host="n1")
        rec.event(POD, WARNING, "FailedMount", 'MountVolume.SetUp failed for volume "x" : no')
        time.sleep(0.01)
        rec.event(POD, WARNING, "FailedMount", 'MountVolume.SetUp failed for volume "x" : no')
        rec.close()
        (name,) = api.names("events")
        stored = api.get("events", name, "shop")
        assert stored is not None
        assert stored["reason"] == "FailedMount" and stored["count"] == 2
        assert stored["involvedObject"]["uid"] == POD.uid
