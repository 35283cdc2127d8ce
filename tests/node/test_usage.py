"""Covers kubevol.node.usage: the pod mounts of a table made from another by leaving mount
points out (a directory removed) are found from the other's, and are those a reading of
the same text finds."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kubevol.manager import VolumePluginMgr
from kubevol.mount.mountinfo import escape
from kubevol.mount.table import MountTable
from kubevol.node.host import NodeVolumeHost
from kubevol.node.usage import VolumeUsage
from kubevol.plugins import builtin_plugins

ROOT = "/var/lib/kv-usage-test"
PLUGINS = ("kubernetes.io~csi", "kubernetes.io~empty-dir")


def _point(pod: int, plugin: str, volume: int, sub: str) -> str:
    return f"{ROOT}/pods/uid-{pod}/volumes/{plugin}/v {volume}{sub}"


#: Mount points under the pods directory (a space in each: escaped in the table), some
#: below another one, and one elsewhere.
POINTS = [_point(p, plugin, v, sub) for p in range(3) for plugin in PLUGINS
          for v in range(2) for sub in ("", "/mount")] + ["/mnt/elsewhere"]


def _table(points: list[str]) -> MountTable:
    lines = [f"{100 + i} 1 0:{50 + i} / {escape(p)} rw,relatime - tmpfs tmpfs rw"
             for i, p in enumerate(points)]
    return MountTable.from_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n" + "\n".join(lines) + "\n")


def _usage() -> VolumeUsage:
    host = NodeVolumeHost(root_dir=ROOT, node_name="n1")
    mgr = VolumePluginMgr()
    mgr.init_plugins(builtin_plugins(), host=host)
    return VolumeUsage(host, mgr)


@settings(max_examples=60, deadline=None)
@given(present=st.lists(st.sampled_from(POINTS), min_size=1),
       gone=st.lists(st.sampled_from(POINTS), max_size=4))
def test_a_derived_table_groups_as_the_same_text_read(present: list[str],
                                                      gone: list[str]) -> None:
    usage = _usage()
    pods_dir = f"{ROOT}/pods"
    base = _table(present)
    usage._mounted_candidates(pods_dir, base)
    derived = base.without_mount_points(gone)
    found = usage._mounted_candidates(pods_dir, derived)
    assert found == _usage()._mounted_candidates(pods_dir, MountTable(derived.data))


def test_the_derived_groups_do_not_change_the_bases(tmp_path: Path) -> None:
    usage = _usage()
    pods_dir = f"{ROOT}/pods"
    base = _table(POINTS)
    grouped = usage._mounted_candidates(pods_dir, base)
    copy = {k: {d: list(v) for d, v in dirs.items()} for k, dirs in grouped.items()}
    usage._mounted_candidates(pods_dir, base.without_mount_points(POINTS[:5]))
    assert grouped == copy
