"""Reading what users hand the conformance suite and ``kubevol csi`` on the command line:
sizes, durations, ``k=v`` lists, volume capabilities, secrets and parameters files.

Every parser raises ``ValueError`` with a message naming the bad input (secret values are
never part of a message).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import yaml

from kubevol.csi import types as t

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGTPE]i?)?B?\s*$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


def parse_size(text: str) -> int:
    """Bytes from ``1073741824``, ``1Gi`` (binary), ``1G`` (decimal), ``512MiB``."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (examples: 1048576, 64Mi, 10Gi, 1G)")
    number, unit = int(match.group(1)), (match.group(2) or "")
    power = _POWERS[unit[:1].upper()]
    base = 1024 if unit.lower().endswith("i") else 1000
    result: int = number * base**power
    return result


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds from ``30``, ``30s``, ``1m``, ``500ms``, ``1h``."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (examples: 30, 30s, 1m, 500ms)")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def parse_key_values(items: Iterable[str], what: str = "value") -> dict[str, str]:
    """``k=v`` items, each possibly a comma-separated list, into a dict (later wins)."""
    result: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{what} {part!r} is not KEY=VALUE")
            result[key.strip()] = value
    return result


def _access_mode(text: str) -> t.AccessMode:
    value = text.strip()
    if value.isdigit():
        try:
            return t.AccessMode(int(value))
        except ValueError:
            pass
    else:
        name = value.upper().replace("-", "_")
        if name in t.AccessMode.__members__:
            return t.AccessMode[name]
    names = ", ".join(m.name for m in t.AccessMode if m)
    raise ValueError(f"access mode {text!r} is unknown; use 1-7 or one of {names}")


def parse_capability(text: str) -> t.VolumeCapability:
    """``MODE,TYPE[,FS[,FLAG...]]`` (csc's ``--cap``): MODE a name (``SINGLE_NODE_WRITER``,
    ``single-node-writer``) or number (1-7), TYPE ``mount``/``block`` or the proto field
    number (1 block, 2 mount); for mount access an optional filesystem type and mount flags."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2:
        raise ValueError(f"capability {text!r}: expected MODE,TYPE[,FS[,FLAGS]]")
    mode = _access_mode(parts[0])
    kind = parts[1].lower()
    if kind in ("block", "1"):
        if len(parts) > 2:
            raise ValueError(f"capability {text!r}: block access takes no filesystem or flags")
        return t.VolumeCapability.block(mode)
    if kind not in ("mount", "2"):
        raise ValueError(f"capability {text!r}: TYPE must be mount, block, 1 or 2")
    fs_type = parts[2] if len(parts) > 2 else ""
    flags = tuple(p for p in parts[3:] if p)
    return t.VolumeCapability.mount(mode, fs_type=fs_type, mount_flags=flags)


# --- files ----------------------------------------------------------------------------


def _load_mapping(path: str, what: str) -> Mapping[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {what} file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} file {path} is not YAML or JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} file {path} must hold a mapping")
    return data


def _strings(data: Mapping[str, Any], where: str) -> dict[str, str]:
    out = {}
    for key, value in data.items():
        if isinstance(value, Mapping | list):
            raise ValueError(f"{where}: the value of {key!r} must be a string")
        out[str(key)] = "" if value is None else str(value)
    return out


#: csi-sanity's secrets-file section names that differ from ``<RPC>Secret``.
_SECTION_ALIASES = {"ControllerValidateVolumeCapabilities": "ValidateVolumeCapabilities"}


@attrs.frozen(kw_only=True)
class Secrets:
    """Secrets to send: one map for every RPC (``default``) and per-RPC maps that replace
    it. The ``repr`` shows key names only."""

    default: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    per_rpc: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict, repr=False)

    def for_rpc(self, rpc: str) -> dict[str, str]:
        """The secrets to send with ``rpc`` (e.g. ``CreateVolume``)."""
        return dict(self.per_rpc.get(rpc, self.default))

    def __repr__(self) -> str:
        keys = sorted(set(self.default) | {k for m in self.per_rpc.values() for k in m})
        return f"Secrets(keys={keys}, rpcs={sorted(self.per_rpc)})"


def parse_secrets_text(text: str) -> Secrets:
    """``X_CSI_SECRETS``: ``key=value`` pairs separated by commas, sent with every RPC."""
    try:
        return Secrets(default=parse_key_values([text], "secret"))
    except ValueError:
        raise ValueError("X_CSI_SECRETS must be KEY=VALUE[,KEY=VALUE...]") from None


def load_secrets(path: str) -> Secrets:
    """Read a secrets file (YAML or JSON), in either form:

    - a flat ``{key: value}`` map, sent with every RPC;
    - csi-sanity's form, one section per RPC: ``CreateVolumeSecret: {key: value}``,
      ``NodeStageVolumeSecret: ...`` (``ControllerValidateVolumeCapabilitiesSecret`` too).
    """
    data = _load_mapping(path, "secrets")
    if data and all(isinstance(v, Mapping) for v in data.values()):
        per_rpc = {}
        for section, values in data.items():
            name = str(section)
            if not name.endswith("Secret"):
                raise ValueError(f"secrets file {path}: section {name!r} is not <RPC>Secret")
            rpc = name[: -len("Secret")]
            per_rpc[_SECTION_ALIASES.get(rpc, rpc)] = _strings(values, f"{path}: {name}")
        return Secrets(per_rpc=per_rpc)
    return Secrets(default=_strings(data, path))


def load_parameters(path: str) -> dict[str, str]:
    """A ``{key: value}`` parameters file (YAML or JSON), as csi-sanity's
    ``testvolumeparameters``."""
    return _strings(_load_mapping(path, "parameters"), path)
