"""Covers how kubevol.node.exporter finds a pod's claims: a pod model and a deferred pod (an
agent's record, read from its dict without building the model) give the same claims."""

from __future__ import annotations

from kubevol.k8s.pod import Pod
from kubevol.node.exporter import _claims_of
from kubevol.spec import ApiMapping, DeferredApiObject, api_object

POD: ApiMapping = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "uid": "9f1c"},
    "spec": {
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-claim"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "logs", "persistentVolumeClaim": {"claimName": "logs-claim",
                                                       "readOnly": True}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "second-of-a-name"}},
        ],
    },
}


def claims_both_ways(data: ApiMapping) -> tuple[object, object]:
    model: Pod = api_object("V1Pod", data)
    deferred = DeferredApiObject("V1Pod", data)
    found = _claims_of(deferred)
    assert deferred._model is None, "the deferred pod's model was built"
    return _claims_of(model), found


def test_a_deferred_pod_gives_the_claims_of_its_model_without_building_it() -> None:
    from_model, from_dict = claims_both_ways(POD)
    assert from_model == from_dict == {
        "data": ("default", "data-claim"), "logs": ("default", "logs-claim")}


def test_a_deferred_pod_in_a_namespace_and_one_without_volumes() -> None:
    in_shop: ApiMapping = {**POD, "metadata": {"name": "web", "uid": "9f1c", "namespace": "shop"}}
    from_model, from_dict = claims_both_ways(in_shop)
    assert from_model == from_dict == {
        "data": ("shop", "data-claim"), "logs": ("shop", "logs-claim")}
    bare: ApiMapping = {**POD, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert claims_both_ways(bare) == ({}, {})
