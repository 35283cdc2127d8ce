"""Covers kubevol.mount.table: a table without some mount points drops exactly the lines
mounted there (a line whose root, the fourth field, names the path stays)."""

from __future__ import annotations

from kubevol.mount.table import MountTable

#: Lines in the kernel's format (proc_pid_mountinfo(5)); line 3 is a bind mount whose root
#: is the path removed, line 4 a mount point with an escaped space.
TEXT = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "30 22 0:40 / /var/lib/pods/a rw,relatime - tmpfs tmpfs rw\n"
    "31 22 8:1 /var/lib/pods/a /mnt/x rw,relatime - ext4 /dev/sda1 rw\n"
    "32 22 0:41 / /var/lib/pods/b\\040c rw,relatime - tmpfs tmpfs rw\n"
    "33 30 0:42 / /var/lib/pods/a rw,relatime - tmpfs tmpfs rw\n"
)


def test_only_the_lines_at_the_mount_points_go() -> None:
    table = MountTable.from_text(TEXT)
    out = table.without_mount_points(["/var/lib/pods/a", "/var/lib/pods/b c"])
    assert [e.id for e in out.entries()] == [22, 31]
    assert out.derived_from == (table, frozenset({"/var/lib/pods/a", "/var/lib/pods/b c"}))
    assert table.without_mount_points(["/nowhere"]) is table
    assert [e.id for e in table.without_mount_points(["/"]).entries()] == [30, 31, 32, 33]
