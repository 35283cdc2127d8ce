"""Covers kubevol.cli.jsonpath.

kubectl's JSONPath templates (``-o jsonpath=``) give kubectl's output: the cases and the
expected text are client-go's own (``util/jsonpath/jsonpath_test.go``) and kubectl's
documentation's (``docs/reference/kubectl/jsonpath``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubevol.cli.jsonpath import TemplateError, compile_template

TYPES: dict[str, Any] = {
    "bools": [True, False, True, False],
    "integers": [1, 2, 3, 4],
    "floats": [1.0, 2.2, 3.3, 4.0],
    "strings": ["one", "two", "three", "four"],
    "interfaces": [True, "one", 1, 1.1],
    "maps": [
        {"name": "one", "value": 1},
        {"name": "two", "value": 2.02},
        {"name": "three", "value": 3.03},
        {"name": "four", "value": 4.04},
    ],
}

STORE: dict[str, Any] = {
    "Name": "jsonpath",
    "Book": [
        {"Category": "reference", "Author": "Nigel Rees", "Title": "Sayings of the Centurey",
         "Price": 8.95},
        {"Category": "fiction", "Author": "Evelyn Waugh", "Title": "Sword of Honour",
         "Price": 12.99},
        {"Category": "fiction", "Author": "Herman Melville", "Title": "Moby Dick",
         "Price": 8.99},
    ],
    "Bicycle": [
        {"Color": "red", "Price": 19.95, "IsNew": True},
        {"Color": "green", "Price": 20.01, "IsNew": False},
    ],
    "Labels": {"engieer": 10, "web/html": 15, "k8s-app": 20},
    "Employees": {"jason": "manager", "dan": "clerk"},
}

#: kubectl's documented input (and client-go's TestKubernetes).
NODES: dict[str, Any] = json.loads("""{
  "kind": "List",
  "items": [
    {"kind": "None",
     "metadata": {"name": "127.0.0.1", "labels": {"kubernetes.io/hostname": "127.0.0.1"}},
     "status": {"capacity": {"cpu": "4"}, "ready": true,
                "addresses": [{"type": "LegacyHostIP", "address": "127.0.0.1"}]}},
    {"kind": "None",
     "metadata": {"name": "127.0.0.2", "labels": {"kubernetes.io/hostname": "127.0.0.2"}},
     "status": {"capacity": {"cpu": "8"}, "ready": false,
                "addresses": [{"type": "LegacyHostIP", "address": "127.0.0.2"},
                              {"type": "another", "address": "127.0.0.3"}]}}
  ],
  "users": [
    {"name": "myself", "user": {}},
    {"name": "e2e", "user": {"username": "admin", "password": "secret"}}
  ]
}""")

POINTS = [
    {"id": "i1", "x": 4, "y": -5},
    {"id": "i2", "x": -2, "y": -5, "z": 1},
    {"id": "i3", "x": 8, "y": 3},
    {"id": "i4", "x": -6, "y": -1},
    {"id": "i5", "x": 0, "y": 2, "z": 1},
    {"id": "i6", "x": 1, "y": 4},
]

CASES: list[tuple[str, Any, str]] = [
    # client-go TestTypesInput
    ("{ .bools }", TYPES, "[true,false,true,false]"),
    ("{ .bools[0] }", TYPES, "true"),
    ("{ .bools[-1] }", TYPES, "false"),
    ("{ .bools[0:2] }", TYPES, "true false"),
    ("{ .bools[:4:2] }", TYPES, "true true"),
    ("{ .integers[-2] }", TYPES, "3"),
    ("{ .integers[:4:2] }", TYPES, "1 3"),
    ("{ .floats }", TYPES, "[1,2.2,3.3,4]"),
    ("{ .floats[0] }", TYPES, "1"),
    ("{ .floats[-2] }", TYPES, "3.3"),
    ("{ .strings }", TYPES, '["one","two","three","four"]'),
    ("{ .strings[:4:2] }", TYPES, "one three"),
    ("{ .interfaces }", TYPES, '[true,"one",1,1.1]'),
    ("{ .interfaces[0:2] }", TYPES, "true one"),
    ("{ .maps[0] }", TYPES, '{"name":"one","value":1}'),
    ("{ .maps[1::2] }", TYPES, '{"name":"two","value":2.02} {"name":"four","value":4.04}'),
    # client-go TestStructInput
    ("hello jsonpath", None, "hello jsonpath"),
    ("{..}", [1, 2, 3], "[1,2,3]"),
    ("{[?(@<5)]}", [2, 6, 3, 7], "2 3"),
    ('{"{"}', None, "{"),
    ("{[1,3,4]}", [0, 1, 2, 3, 4], "1 3 4"),
    ("{[0:2]}", ["Monday", "Tudesday"], "Monday Tudesday"),
    ("hello {.Name}", STORE, "hello jsonpath"),
    ("{$.Labels.web/html}", STORE, "15"),
    ("{$.Employees.jason}", STORE, "manager"),
    ("{.Labels.k8s-app}", STORE, "20"),
    ("{.Bicycle[*].Color}", STORE, "red green"),
    ("{.Book[*].Author}", STORE, "Nigel Rees Evelyn Waugh Herman Melville"),
    ('{range .Bicycle[*]}{ "{" }{ @.* }{ "} " }{end}', STORE,
     "{red 19.95 true} {green 20.01 false} "),
    ("{..Price}", STORE, "8.95 12.99 8.99 19.95 20.01"),
    ("{...Price}", STORE, "8.95 12.99 8.99 19.95 20.01"),
    ('{range .Bicycle[*]}{ @ }{ " " }{end}', STORE,
     '{"Color":"red","IsNew":true,"Price":19.95} {"Color":"green","IsNew":false,"Price":20.01} '),
    ("{.Book[-1:]}", STORE,
     '{"Author":"Herman Melville","Category":"fiction","Price":8.99,"Title":"Moby Dick"}'),
    ("{..Book[2]}", STORE,
     '{"Author":"Herman Melville","Category":"fiction","Price":8.99,"Title":"Moby Dick"}'),
    ("{.Bicycle[?(@.IsNew==true)]}", STORE, '{"Color":"red","IsNew":true,"Price":19.95}'),
    ("{.Bicycle[?(@.Color=~'^g.*en.*')]}", STORE,
     '{"Color":"green","IsNew":false,"Price":20.01}'),
    ("{.hello}", STORE, ""),  # kubectl allows missing keys
    ("before-{.hello}after", STORE, "before-after"),
    # client-go TestJSONInput
    ("{[?(@.z)].id}", POINTS, "i2 i5"),
    ("{[0]['id']}", POINTS, "i1"),
    # client-go TestKubernetes, and kubectl's documentation's table
    ("{range .items[*]}{.metadata.name}, {end}{.kind}", NODES, "127.0.0.1, 127.0.0.2, List"),
    ('{range .items[*]}{.metadata.name}{"\\t"}{end}', NODES, "127.0.0.1\t127.0.0.2\t"),
    ("{.items[*].status.addresses[*].address}", NODES, "127.0.0.1 127.0.0.2 127.0.0.3"),
    ("{range .items[*]}{range .status.addresses[*]}{.address}, {end}{end}", NODES,
     "127.0.0.1, 127.0.0.2, 127.0.0.3, "),
    ("{.items[*].metadata.name}", NODES, "127.0.0.1 127.0.0.2"),
    ("{.items[*]['metadata.name', 'status.capacity']}", NODES,
     '127.0.0.1 127.0.0.2 {"cpu":"4"} {"cpu":"8"}'),
    ("{range .items[*]}[{.metadata.name}, {.status.capacity}] {end}", NODES,
     '[127.0.0.1, {"cpu":"4"}] [127.0.0.2, {"cpu":"8"}] '),
    ('{.users[?(@.name=="e2e")].user.password}', NODES, "secret"),
    ("{.items[0].metadata.labels.kubernetes\\.io/hostname}", NODES, "127.0.0.1"),
    ('{.items[?(@.metadata.labels.kubernetes\\.io/hostname=="127.0.0.1")].kind}', NODES,
     "None"),
    ("{.items[?(@..ready==true)].metadata.name}", NODES, "127.0.0.1"),
    ("{..name}", NODES, "127.0.0.1 127.0.0.2 myself e2e"),
    ("kind is {.kind}", NODES, "kind is List"),
    ("{['kind']}", NODES, "List"),
    ("{.users[0].name}", NODES, "myself"),
    ("{range .items[*]}{.kind}{end}", {"items": []}, ""),
    # kubevol's own habit: a template without braces that starts with $ or . is one path
    ("$.items[*].kind", NODES, "None None"),
]


@pytest.mark.parametrize(("template", "data", "expected"), CASES)
def test_templates_print_what_kubectl_prints(template: str, data: Any, expected: str) -> None:
    """Each template gives kubectl's documented output for the same input."""
    assert compile_template(template).execute(data) == expected


@pytest.mark.parametrize(
    ("template", "data", "message"),
    [
        ("{hello}", STORE, "unrecognized identifier hello"),
        ("{.Labels[0]}", STORE, "not an array"),
        ("{.Book[?(@.Price<>10)]}", STORE, "unrecognized filter operator <>"),
        ("{range .Labels.*}{@}{end}{end}", STORE, "not in range, nothing to end"),
        ("{.Bicycle[?(@.IsNew=~'.*ue')]}", STORE, "=~ compares strings only"),
        ("{............Price}", STORE, "too many dots"),
        ("{range .items[*]}{.x}", NODES, "without its {end}"),
        ("{.a", NODES, "unclosed action"),
    ],
)
def test_bad_templates_are_refused_with_the_reason(
    template: str, data: Any, message: str
) -> None:
    """A template kubectl refuses is refused here too, saying why."""
    with pytest.raises(TemplateError, match=message.replace("[", r"\[").replace("{", r"\{")):
        compile_template(template).execute(data)
