"""kubevol.util.safeyaml: alias bombs, recursive aliases, deep nesting and oversized manifests
are refused with one UntrustedDataError, quickly and in little memory; ordinary manifests
load exactly as PyYAML's safe loader loads them (issue 20, point 6)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
import yaml

from kubevol.errors import UntrustedDataError
from kubevol.util import safeyaml
from kubevol.util.safeyaml import MAX_YAML_DEPTH, allowed_alias_ratio, load, load_all, read_manifest

#: The classic "billion laughs": 9^9 strings from a few hundred bytes.
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]"
       for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
)

POD = textwrap.dedent("""\
    apiVersion: v1
    kind: Pod
    metadata: {name: web, namespace: default, labels: {app: web}}
    spec:
      securityContext: {fsGroup: 1000}
      containers:
      - name: c
        image: busybox
        args: ["sh", "-c", "ls /data/*.log; [ -f x ] && echo '[{'"]
        volumeMounts: [{name: scratch, mountPath: /data}]
      volumes:
      - name: scratch
        emptyDir: {sizeLimit: 1Gi}
    """)


def test_the_billion_laughs_bomb_is_refused_in_little_memory() -> None:
    """The 421-byte bomb that drove ``up`` to 3.9 GB: refused, peak allocation tiny."""
    assert len(BOMB) < 500
    tracemalloc.start()
    try:
        with pytest.raises(UntrustedDataError, match="excessive aliasing"):
            load_all(BOMB, "bomb.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024


def test_moderate_aliasing_is_accepted() -> None:
    """Anchors used a few times (a shared label set, a common env list) load as usual."""
    text = textwrap.dedent("""\
        base: &env [{name: A, value: "1"}, {name: B, value: "2"}]
        one: {env: *env}
        two: {env: *env}
        three: &k {k: v}
        four: {<<: *k, x: y}
        """)
    assert load(text) == yaml.safe_load(text)


def test_the_go_yaml_ratio_rule() -> None:
    """Refused only past 100 alias decodes, 1,000 decodes and the allowed share."""
    assert allowed_alias_ratio(1_000) == 0.99
    assert allowed_alias_ratio(4_000_000) == pytest.approx(0.10)
    assert 0.10 < allowed_alias_ratio(2_000_000) < 0.99
    # 200 aliases of a 10-element list: 2,000 of ~2,200 decodes (91%): fine.
    fine = "a: &a [" + ",".join(["x"] * 10) + "]\nb: [" + ",".join(["*a"] * 200) + "]\n"
    assert len(load(fine)["b"]) == 200
    # A 100-element list aliased 5,000 times: 505,000 of 510,000 decodes (99%), more than
    # the 96% allowed at that size.
    bad = "a: &a [" + ",".join(["x"] * 100) + "]\nb: [" + ",".join(["*a"] * 5_000) + "]\n"
    with pytest.raises(UntrustedDataError, match="excessive aliasing"):
        load(bad)


@pytest.mark.parametrize(
    "text", ["a: &a [*a]", "a: &a {b: *a}", "&x [1, [2, *x]]"], ids=["seq", "map", "nested"]
)
def test_an_alias_inside_its_own_anchor_is_refused(text: str) -> None:
    """PyYAML would build a recursive object that later crashes whoever walks it."""
    with pytest.raises(UntrustedDataError, match="inside its own anchor"):
        load(text)


def test_aliases_count_towards_depth() -> None:
    """An alias of a deep node used deep down nests as deep as its expansion."""
    deep = "[" * 60 + "1" + "]" * 60
    text = f"a: &a {deep}\nb: {'[' * 50}*a{']' * 50}\n"
    with pytest.raises(UntrustedDataError, match="once alias"):
        load(text)


def test_nesting_at_the_limit_loads_and_past_it_is_refused() -> None:
    """MAX_YAML_DEPTH levels are fine, one more is not."""
    ok = "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH
    assert load(ok) is not None
    with pytest.raises(UntrustedDataError, match="deeper"):
        load("[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1))


HOSTILE_DEPTHS = {
    "flow": "'[' * 200_000",
    "block-compact": "'- ' * 200_000 + 'x'",
    "block-compact-tabs": "'-\\t' * 200_000 + 'x'",
    "after-document-start": "'--- ' + '- ' * 200_000 + 'x'",
    "with-anchors": "''.join(f'- &a{i} ' for i in range(100_000)) + 'x'",
    "indented": "''.join(' ' * i + 'k:\\n' for i in range(3_000)) + ' ' * 3_000 + 'v'",
    "mapping-flow": "'{a: ' * 100_000 + '1' + '}' * 100_000",
    # Document markers inside a flow collection: each piece looks shallow on its own.
    "flow-across-markers": "('[' * 90 + '\\n---\\n') * 3_000",
    "quoted-markers": "'a: \"\\n---\\n\"\\nb: ' + '[' * 100_000",
    # A text of JSON documents: read by json's C decoder when within the bounds.
    "json-objects": "'{\"a\": ' * 100_000 + '1' + '}' * 100_000",
}


@pytest.mark.parametrize("expr", HOSTILE_DEPTHS.values(), ids=HOSTILE_DEPTHS.keys())
def test_hostile_nesting_is_refused_without_crashing_the_process(expr: str) -> None:
    """libyaml's composer recurses in C (a segfault at about 100,000 levels): the depth is
    measured before it runs. In a child process, so that a crash shows as a failure."""
    code = textwrap.dedent(f"""\
        from kubevol.util import safeyaml
        from kubevol.errors import UntrustedDataError
        try:
            safeyaml.load_all({expr})
        except UntrustedDataError as exc:
            print("refused:", str(exc)[:80])
        else:
            print("loaded")
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused:"), proc.stdout


def test_ordinary_manifests_load_as_the_safe_loader_loads_them() -> None:
    """Brackets and stars inside strings, flow and block style, several documents."""
    text = POD + "---\n" + POD.replace("web", "db") + "---\n"
    assert load_all(text) == list(yaml.safe_load_all(text))
    assert [d["metadata"]["name"] for d in load_all(text) if d] == ["web", "db"]


def test_invalid_yaml_and_unloadable_values_are_one_error() -> None:
    """A syntax error and an integer of 100,000 digits both name where they came from."""
    with pytest.raises(UntrustedDataError, match=r"pod\.yaml is not valid YAML"):
        load_all("a: [1, 2\n", "pod.yaml")
    with pytest.raises(UntrustedDataError, match=r"pod\.yaml holds a value"):
        load_all("a: 1" + "0" * 100_000, "pod.yaml")
    with pytest.raises(UntrustedDataError, match="2 YAML documents"):
        load("a: 1\n---\nb: 2\n")


def test_size_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A text over the manifest cap, a document over the API server's 3 MiB, a file over the
    cap: refused before parsing."""
    monkeypatch.setattr(safeyaml, "MAX_MANIFEST_BYTES", 1000)
    monkeypatch.setattr(safeyaml, "MAX_DOCUMENT_BYTES", 100)
    with pytest.raises(UntrustedDataError, match="larger than 1000"):
        load_all("a: " + "x" * 2000)
    with pytest.raises(UntrustedDataError, match="a document of"):
        load_all("a: " + "x" * 200 + "\n---\nb: 1\n")
    (tmp_path / "m.yaml").write_text("a: " + "x" * 2000)
    with pytest.raises(UntrustedDataError, match="larger than 1000"):
        read_manifest(str(tmp_path / "m.yaml"), max_bytes=1000)
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(UntrustedDataError, match="not UTF-8"):
        read_manifest(str(tmp_path / "bin.yaml"))


def test_libyaml_is_used_when_pyyaml_has_it() -> None:
    """Issue 18: CSafeLoader is several times faster on 500 pods."""
    loader = safeyaml._loader("a: 1")
    try:
        assert type(loader) is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    finally:
        loader.dispose()


def test_a_json_manifest_is_read_without_importing_pyyaml() -> None:
    """PyYAML (and libyaml's bindings) are imported on the first YAML text only: a command
    that reads JSON manifests or records starts without them (about 20 ms)."""
    code = ("import sys; from kubevol.util import safeyaml; "
            "safeyaml.load_all('{\"kind\": \"Pod\"}'); print('yaml' in sys.modules); "
            "safeyaml.load_all('kind: Pod'); print('yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True"]


def test_json_documents_are_read_as_json_as_the_kubelet_reads_them() -> None:
    """The kubelet's file source hands a manifest starting with ``{`` to its JSON decoder
    as it is (apimachinery's ``yaml.ToJSON``): a JSON text gets JSON's reading, also where
    YAML 1.1's differs (``1e5`` is a number, not a string), document by document."""
    pod = yaml.safe_load(POD)
    pod["spec"]["terminationGracePeriodSeconds"] = "GRACE"
    docs = [json.dumps(pod).replace('"GRACE"', "1e5"),
            json.dumps({"kind": "ConfigMap", "data": {"k": "\u00e9 ---"}})]
    text = "\n---\n".join(docs) + "\n"
    assert load_all(text) == [json.loads(d) for d in docs]
    assert load_all(text)[0]["spec"]["terminationGracePeriodSeconds"] == 100000.0
    assert yaml.safe_load(docs[0])["spec"]["terminationGracePeriodSeconds"] == "1e5"
    # Blank documents as YAML has them: none before the first marker, None after one.
    assert load_all("---\n" + docs[1] + "\n---\n") == [json.loads(docs[1]), None]


@pytest.mark.parametrize("text", [
    '{"a": ' * (MAX_YAML_DEPTH + 1) + "1" + "}" * (MAX_YAML_DEPTH + 1),
    '{"a": "\\ud800"}',
    '{"a": 1}\n---\n' + '{"b": ' * (MAX_YAML_DEPTH + 1) + "1" + "}" * (MAX_YAML_DEPTH + 1),
])
def test_json_documents_keep_the_bounds_and_refusals(text: str) -> None:
    """Nesting past the bound and a lone surrogate escape (a string UTF-8 cannot encode)
    are refused as YAML refuses them; so is a JSON document over the API server's size."""
    with pytest.raises(UntrustedDataError):
        load_all(text)


def test_text_json_cannot_read_alone_is_read_as_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flow mapping that is not JSON, a comment, NaN (Go's JSON refuses it): YAML's
    reading, as before; an oversized JSON document is refused."""
    for text in ('{a: 1}\n', '{"a": 1} # note\n', '{"a": NaN}\n', '{"a": 1}\n--- {"b": 2}\n'):
        assert load_all(text) == list(yaml.safe_load_all(text)), text
    monkeypatch.setattr(safeyaml, "MAX_DOCUMENT_BYTES", 100)
    with pytest.raises(UntrustedDataError, match="a document of"):
        load_all('{"a": "' + "x" * 200 + '"}\n---\n{"b": 1}\n')
