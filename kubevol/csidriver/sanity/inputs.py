"""Reading the files users hand the conformance suite (and ``kubevol csi``): secrets
(csi-sanity's per-RPC sections or a flat map) and parameters. Sizes and durations are
:mod:`kubevol.util.units`'.

Every reader raises ``ValueError`` with a message naming the bad input (secret values are
never part of a message).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


def _load_mapping(path: str, what: str) -> Mapping[object, object]:
    import yaml  # only files need it: `kubevol csi` uses Secrets on every call

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


def _strings(data: Mapping[object, object], where: str) -> dict[str, str]:
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


def load_secrets(path: str) -> Secrets:
    """Read a secrets file (YAML or JSON), in either form:

    - a flat ``{key: value}`` map, sent with every RPC;
    - csi-sanity's form, one section per RPC: ``CreateVolumeSecret: {key: value}``,
      ``NodeStageVolumeSecret: ...`` (``ControllerValidateVolumeCapabilitiesSecret`` too).
    """
    data = _load_mapping(path, "secrets")
    sections = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    if data and len(sections) == len(data):
        per_rpc = {}
        for section, values in sections.items():
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
