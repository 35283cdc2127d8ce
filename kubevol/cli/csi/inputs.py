"""Reading what users type after ``kubevol csi``: ``k=v`` lists, volume capabilities, secrets
from ``$X_CSI_SECRETS`` or a file. Sizes and durations are :mod:`kubevol.util.units`'.

Every parser raises ``ValueError`` with a message naming the bad input (secret values are
never part of a message).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kubevol.cli.parser import arg_type
from kubevol.csi import types as t
from kubevol.csidriver.sanity.inputs import Secrets, load_secrets


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


def parse_secrets_text(text: str) -> Secrets:
    """``X_CSI_SECRETS``: ``key=value`` pairs separated by commas, sent with every RPC."""
    try:
        return Secrets(default=parse_key_values([text], "secret"))
    except ValueError:
        raise ValueError("X_CSI_SECRETS must be KEY=VALUE[,KEY=VALUE...]") from None


def secrets_from(path: str | None, env: Mapping[str, str]) -> Secrets:
    """The secrets to send: from the file at ``path`` (a flat map or csi-sanity's per-RPC
    sections), else from ``env["X_CSI_SECRETS"]``."""
    if path:
        return load_secrets(path)
    text = env.get("X_CSI_SECRETS", "")
    return parse_secrets_text(text) if text.strip() else Secrets()


CAPABILITY = arg_type(parse_capability, "capability")
