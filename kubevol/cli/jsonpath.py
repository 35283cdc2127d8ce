"""kubectl's JSONPath templates, for ``-o jsonpath=TEMPLATE``.

kubectl's template language (client-go's ``util/jsonpath``) is JSONPath inside ``{}`` plus
literal text around it, quoted text inside it (``{"\\t"}``), and ``{range EXPR}...{end}``
loops; an action that selects several values prints them joined by spaces, a map or a list
prints as compact JSON, a missing field prints nothing (kubectl allows missing keys). No
package on PyPI implements that language: ``jsonpath-ng`` evaluates
JSONPath expressions but has no templates, ranges or literal text, and its lexer refuses
kubectl's keys (``k8s-app``, ``web/html``, ``kubernetes\\.io/hostname``). So the language is
written here, small, and tested against the outputs client-go's own tests and kubectl's
documentation give (``tests/cli/test_jsonpath.py``).

What it evaluates: ``$`` (the root) and ``@`` (the current object), ``.name`` and
``['name']`` children (``\\.`` escapes a dot in a name), ``..name`` recursive descent,
``*`` and ``[*]`` wildcards, ``[i]``, ``[start:end:step]`` with negative indices,
``[1,3]`` and ``['a.b', 'c']`` unions, and ``[?(@.x OP value)]`` filters with ``==``,
``!=``, ``<``, ``<=``, ``>``, ``>=``, ``=~`` (a regular expression, strings only) or just
``[?(@.x)]`` (the field exists).

One habit of kubevol's own: a template without any ``{`` that starts with ``$`` or ``.``
is one expression (``$.items[*].name``, as kubectl's ``--sort-by`` takes it), not text.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterator

import attrs


class TemplateError(ValueError):
    """A template that cannot be parsed, or that cannot be applied to the data."""


#: A step of a path: from the nodes selected so far, the next ones.
Step = Callable[[list[object], object], list[object]]


@attrs.frozen
class _Path:
    """A JSONPath expression: where it starts (``$`` root, ``@`` current) and its steps."""

    root: bool
    steps: tuple[Step, ...]

    def select(self, root: object, current: object) -> list[object]:
        nodes = [root if self.root else current]
        for step in self.steps:
            nodes = step(nodes, root)
        return nodes


@attrs.frozen
class _Text:
    text: str


@attrs.frozen
class _Range:
    path: _Path
    body: tuple[_Text | _Path | _Range, ...]


Node = _Text | _Path | _Range


@attrs.frozen
class Template:
    """A compiled template; :meth:`execute` applies it to JSON data."""

    nodes: tuple[Node, ...]

    def execute(self, data: object) -> str:
        """The text the template makes of ``data``. Raises :class:`TemplateError` when it
        does not fit the data (an index into a map, a regular expression on a number)."""
        out: list[str] = []
        _run(self.nodes, data, data, out)
        return "".join(out)


def _run(nodes: tuple[Node, ...], root: object, current: object, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Path):
            out.append(" ".join(text_of(v) for v in node.select(root, current)))
        else:
            for item in node.path.select(root, current):
                _run(node.body, root, item, out)


def text_of(value: object) -> str:
    """One selected value as kubectl prints it: strings as they are, maps and lists as
    compact JSON with sorted keys, whole floats without ``.0``, nothing for null."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(_go_numbers(value), separators=(",", ":"), sort_keys=True,
                      ensure_ascii=False)


def _go_numbers(value: object) -> object:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _go_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_numbers(v) for v in value]
    return value


# -- the template ---------------------------------------------------------------------------


def compile_template(template: str) -> Template:
    """Parse ``template``; raises :class:`TemplateError` naming what is wrong."""
    if "{" not in template and template.strip().startswith(("$", ".")):
        template = "{" + template.strip() + "}"
    stack: list[tuple[_Path | None, list[Node]]] = [(None, [])]
    for kind, text in _actions(template):
        body = stack[-1][1]
        if kind == "text":
            if text:
                body.append(_Text(text))
            continue
        action = text.strip()
        if action == "end":
            if len(stack) == 1:
                raise TemplateError("{end}: not in range, nothing to end")
            path, inner = stack.pop()
            assert path is not None
            stack[-1][1].append(_Range(path, tuple(inner)))
        elif action.startswith("range ") or action.startswith("range\t"):
            stack.append((_parse_path(action[len("range"):].strip()), []))
        elif action[:1] in ('"', "'"):
            body.append(_Text(_unquote(action)))
        else:
            body.append(_parse_path(action))
    if len(stack) != 1:
        raise TemplateError("{range ...} without its {end}")
    return Template(tuple(stack[0][1]))


def _actions(template: str) -> Iterator[tuple[str, str]]:
    """``("text", literal)`` and ``("action", inside the braces)`` in order."""
    i = 0
    while i < len(template):
        start = template.find("{", i)
        if start < 0:
            yield "text", template[i:]
            return
        yield "text", template[i:start]
        j, quote = start + 1, ""
        while j < len(template):
            c = template[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = ""
            elif c in "\"'":
                quote = c
            elif c == "}":
                break
            j += 1
        else:
            raise TemplateError(f"unclosed action at {template[start:]!r}")
        yield "action", template[start + 1:j]
        i = j + 1


def _unquote(text: str) -> str:
    if len(text) < 2 or text[-1] != text[0]:
        raise TemplateError(f"unterminated quoted string {text!r}")
    if text[0] == "'":
        return text[1:-1]
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise TemplateError(f"bad quoted string {text!r}: {exc}") from None
    assert isinstance(value, str)
    return value


# -- paths ----------------------------------------------------------------------------------

_NAME_END = set(".[]()=!<>~ \t'\"")


class _Parser:
    """A recursive-descent parser of one JSONPath expression."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def peek(self, n: int = 1) -> str:
        return self.text[self.i:self.i + n]

    def fail(self, what: str) -> TemplateError:
        return TemplateError(f"{what} at {self.text[self.i:]!r} in {self.text!r}")

    def path(self, *, stop: str = "") -> _Path:
        # ``$`` is the root; ``@``, ``.x`` and ``[...]`` start from the current object
        # (the root, or the item of the enclosing range).
        root = self.peek() == "$"
        if self.peek() in ("$", "@"):
            self.i += 1
        elif self.peek() not in (".", "["):
            raise TemplateError(f"unrecognized identifier {self.text[self.i:]}")
        steps: list[Step] = []
        while self.i < len(self.text) and self.peek() not in stop:
            steps.append(self.step())
        return _Path(root, tuple(steps))

    def step(self) -> Step:
        if self.peek() == "[":
            return self.bracket()
        if self.peek(2) == "..":
            dots = len(self.text[self.i:]) - len(self.text[self.i:].lstrip("."))
            if dots > 3:
                raise self.fail("too many dots")
            self.i += dots
            if self.i >= len(self.text):
                return lambda nodes, _root: nodes  # ``{..}``: the object itself
            inner = self.step() if self.peek() == "[" else _child(self.name())
            return lambda nodes, root: inner(_descend(nodes, root), root)
        if self.peek() == ".":
            self.i += 1
            if self.peek() == "*":
                self.i += 1
                return _wildcard
            if self.peek() == "[":
                return self.bracket()
            return _child(self.name())
        raise self.fail("unexpected character")

    def name(self) -> str:
        chars: list[str] = []
        while self.i < len(self.text):
            c = self.peek()
            if c == "\\" and self.peek(2) == "\\.":
                chars.append(".")
                self.i += 2
                continue
            if c in _NAME_END:
                break
            chars.append(c)
            self.i += 1
        if not chars:
            raise self.fail("expected a field name")
        return "".join(chars)

    def bracket(self) -> Step:
        self.i += 1  # [
        if self.peek() == "*":
            self.i += 1
            step: Step = _wildcard
        elif self.peek(2) == "?(":
            self.i += 2
            step = self.filter()
        else:
            end = self.text.find("]", self.i)
            if end < 0:
                raise self.fail("unclosed [")
            step = _subscript(self.text[self.i:end], self.text)
            self.i = end
        if self.peek() != "]":
            raise self.fail("expected ]")
        self.i += 1
        return step

    def filter(self) -> Step:
        left = self.path(stop=" \t=!<>~)")
        match = re.match(r"\s*(==|!=|<=|>=|=~|<>|<|>)?\s*", self.text[self.i:])
        assert match is not None
        op = match.group(1)
        self.i += match.end()
        if op is None:
            right: object = None
        else:
            close = self.text.find(")", self.i)
            if close < 0:
                raise self.fail("unclosed filter")
            if op == "<>":
                raise TemplateError("unrecognized filter operator <>")
            right = _literal(self.text[self.i:close].strip())
            self.i = close
        if self.peek() != ")":
            raise self.fail("expected )")
        self.i += 1
        return _filter(left, op, right)


def _parse_path(text: str) -> _Path:
    parser = _Parser(text.strip())
    return parser.path()


def _literal(text: str) -> object:
    if text[:1] in ("'", '"'):
        return _unquote(text)
    if text in ("true", "false"):
        return text == "true"
    try:
        return json.loads(text)
    except ValueError:
        raise TemplateError(f"unrecognized value {text!r} in a filter") from None


def _child(name: str) -> Step:
    def step(nodes: list[object], _root: object) -> list[object]:
        return [n[name] for n in nodes if isinstance(n, dict) and name in n]
    return step


def _wildcard(nodes: list[object], _root: object) -> list[object]:
    out: list[object] = []
    for n in nodes:
        if isinstance(n, dict):
            out += n.values()
        elif isinstance(n, list):
            out += n
    return out


def _descend(nodes: list[object], _root: object) -> list[object]:
    out: list[object] = []

    def walk(n: object) -> None:
        out.append(n)
        for child in n.values() if isinstance(n, dict) else n if isinstance(n, list) else ():
            walk(child)

    for n in nodes:
        walk(n)
    return out


def _subscript(text: str, whole: str) -> Step:
    """``[i]``, ``[a:b:c]``, ``[1,3]`` or ``['a.b', 'c']``."""
    parts = [p.strip() for p in _split_union(text)]
    if len(parts) > 1 or parts[0][:1] in ("'", '"'):
        paths = [_quoted_path(p, whole) for p in parts]

        def union(nodes: list[object], root: object) -> list[object]:
            out: list[object] = []
            for path in paths:
                out += path(nodes, root)
            return out

        return union
    spec = parts[0]
    try:
        bounds = [int(b) if b.strip() else None for b in spec.split(":")]
    except ValueError:
        raise TemplateError(f"bad index [{spec}] in {whole!r}") from None
    if len(bounds) > 3:
        raise TemplateError(f"bad slice [{spec}] in {whole!r}")

    def index(nodes: list[object], _root: object) -> list[object]:
        out: list[object] = []
        for n in nodes:
            if not isinstance(n, list):
                raise TemplateError(f"[{spec}]: {text_of(n)[:60]} is not an array")
            if len(bounds) == 1:
                i = bounds[0]
                assert i is not None
                if -len(n) <= i < len(n):
                    out.append(n[i])
                else:
                    raise TemplateError(f"array index {i} out of bounds (length {len(n)})")
            else:
                start, stop, stride = [*bounds, None][:3]
                out += n[slice(start, stop, stride)]
        return out

    return index


def _split_union(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quote = ""
    for c in text:
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == ",":
            parts.append("".join(current))
            current = []
            continue
        current.append(c)
    parts.append("".join(current))
    return parts


def _quoted_path(part: str, whole: str) -> Step:
    if part[:1] not in ("'", '"'):
        return _subscript(part, whole)
    key = _unquote(part)
    names = [n.replace("\0", ".") for n in key.replace("\\.", "\0").split(".")]
    steps = [_child(n) for n in names]

    def path(nodes: list[object], root: object) -> list[object]:
        for step in steps:
            nodes = step(nodes, root)
        return nodes

    return path


def _filter(left: _Path, op: str | None, right: object) -> Step:
    def keep(item: object, root: object) -> bool:
        values = left.select(root, item)
        if op is None:
            return bool(values)
        return any(_compare(v, op, right) for v in values)

    def step(nodes: list[object], root: object) -> list[object]:
        out: list[object] = []
        for n in nodes:
            items = n if isinstance(n, list) else list(n.values()) if isinstance(n, dict) else []
            out += [item for item in items if keep(item, root)]
        return out

    return step


def _compare(value: object, op: str, right: object) -> bool:
    if op == "=~":
        if not isinstance(value, str) or not isinstance(right, str):
            raise TemplateError(f"=~ compares strings only, not {text_of(value)!r}")
        return re.search(right, value) is not None
    if op in ("==", "!="):
        same = type(value) is type(right) or (
            _number(value) and _number(right))
        equal = same and value == right
        return equal if op == "==" else not equal
    if isinstance(value, str) and isinstance(right, str):
        return bool(_ORDER[op](value, right))
    if (isinstance(value, int | float) and isinstance(right, int | float)
            and _number(value) and _number(right)):
        return bool(_ORDER[op](value, right))
    return False


#: The filters' ordering operators.
_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
