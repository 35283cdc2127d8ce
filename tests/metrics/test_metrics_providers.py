"""Covers kubevol.metrics' providers (du, statfs, block, nil, cached) and kubevol.metrics.quota.

Every provider against GNU du/df/stat and blockdev on real filesystems and devices.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kubevol.errors import MetricsError, MetricsErrorCode, is_not_supported
from kubevol.metrics import (
    CachedMetrics,
    Metrics,
    MetricsBlock,
    MetricsDu,
    MetricsNil,
    MetricsProvider,
    MetricsStatFS,
    disk_usage,
)
from kubevol.metrics import quota as quota_module

Sh = Callable[..., str]
Du = Callable[[Path], tuple[int, int]]
MakeFs = Callable[..., Path]


def df(sh: Sh, path: Path) -> dict[str, int]:
    """GNU df's figures for the filesystem holding ``path``, in bytes and inodes."""
    fields = ("size", "used", "avail", "itotal", "iused", "iavail")
    out = sh("df", "-B1", f"--output={','.join(fields)}", str(path)).splitlines()[1]
    return dict(zip(fields, map(int, out.split()), strict=True))


@pytest.mark.root
def test_du_metrics_match_du_and_df(
    loop_fs: MakeFs, make_tree: Callable[[Path], None], sh: Sh, gnu_du: Du
) -> None:
    """MetricsDu: used/inodes_used from du, capacity/available/inodes/inodes_free from df."""
    fs = loop_fs()
    vol = fs / "vol"
    vol.mkdir()
    make_tree(vol)
    os.sync()
    metrics = MetricsDu(str(vol)).get_metrics()
    figures = df(sh, fs)
    assert (metrics.used, metrics.inodes_used) == gnu_du(vol)
    assert metrics.capacity == figures["size"]
    assert metrics.available == figures["avail"]
    assert metrics.inodes == figures["itotal"]
    assert metrics.inodes_free == figures["iavail"]
    assert metrics.abnormal is None
    assert metrics.message is None


@pytest.mark.root
def test_statfs_metrics_match_df_and_stat(loop_fs: MakeFs, sh: Sh) -> None:
    """MetricsStatFS equals df's size/used/avail/inodes and ``stat -f``'s block counts."""
    fs = loop_fs()
    (fs / "data").write_bytes(os.urandom(3_000_000))
    os.sync()
    metrics = MetricsStatFS(str(fs)).get_metrics()
    figures = df(sh, fs)
    assert metrics.capacity == figures["size"]
    assert metrics.used == figures["used"]
    assert metrics.available == figures["avail"]
    assert metrics.inodes == figures["itotal"]
    assert metrics.inodes_used == figures["iused"]
    assert metrics.inodes_free == figures["iavail"]
    frsize, blocks, bfree, bavail = map(int, sh("stat", "-f", "-c", "%S %b %f %a", str(fs)).split())
    assert metrics.capacity == blocks * frsize
    assert metrics.used == (blocks - bfree) * frsize
    assert metrics.available == bavail * frsize


@pytest.mark.root
def test_statfs_on_tmpfs_counts_whole_filesystem(
    mount_tmpfs: Callable[..., Path], tmp_path: Path, sh: Sh
) -> None:
    """On a 16 MiB tmpfs with 4k inodes, capacity and inodes are exactly those limits."""
    mnt = mount_tmpfs(tmp_path / "t", size="16m", nr_inodes="4k")
    (mnt / "f").write_bytes(b"x" * 1_000_000)
    metrics = MetricsStatFS(str(mnt)).get_metrics()
    assert metrics.capacity == 16 * 1024 * 1024
    assert metrics.inodes == 4096
    assert metrics.used == df(sh, mnt)["used"] >= 1_000_000


@pytest.mark.parametrize("provider", [MetricsDu, MetricsStatFS, MetricsBlock])
def test_empty_path_is_no_path_defined(provider: Callable[[str], MetricsProvider]) -> None:
    """An empty path raises NO_PATH_DEFINED from every path-based provider."""
    with pytest.raises(MetricsError) as info:
        provider("").get_metrics()
    assert info.value.code is MetricsErrorCode.NO_PATH_DEFINED


@pytest.mark.parametrize("provider", [MetricsDu, MetricsStatFS])
def test_missing_path_is_fs_info_failed(
    tmp_path: Path, provider: Callable[[str], MetricsProvider]
) -> None:
    """A missing path raises FS_INFO_FAILED naming it, chained to FileNotFoundError."""
    missing = str(tmp_path / "missing")
    with pytest.raises(MetricsError) as info:
        provider(missing).get_metrics()
    assert info.value.code is MetricsErrorCode.FS_INFO_FAILED
    assert missing in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_du_of_a_file_is_fs_info_failed(tmp_path: Path) -> None:
    """MetricsDu on a regular file raises FS_INFO_FAILED (not a directory), not a number."""
    (tmp_path / "f").write_bytes(b"abc")
    with pytest.raises(MetricsError) as info:
        MetricsDu(str(tmp_path / "f")).get_metrics()
    assert info.value.code is MetricsErrorCode.FS_INFO_FAILED
    assert isinstance(info.value.__cause__, NotADirectoryError)


def test_constructors_do_no_io() -> None:
    """Providers over paths that do not exist are built without error (I/O is deferred)."""
    for provider in (
        MetricsDu("/nonexistent/x"),
        MetricsStatFS("/nonexistent/x"),
        MetricsBlock("/nonexistent/x"),
        MetricsNil(),
        CachedMetrics(MetricsDu("/nonexistent/x")),
    ):
        assert "MetricsNil" in repr(provider) or "/nonexistent/x" in repr(provider)


def test_nil_is_not_supported() -> None:
    """MetricsNil raises NOT_SUPPORTED, which is_not_supported recognises."""
    with pytest.raises(MetricsError) as info:
        MetricsNil().get_metrics()
    assert info.value.code is MetricsErrorCode.NOT_SUPPORTED
    assert is_not_supported(info.value)
    assert not is_not_supported(MetricsError.no_path_defined())


@pytest.mark.root
def test_block_capacity_of_loop_device(
    loop_image: Callable[[int], tuple[Path, str]], sh: Sh
) -> None:
    """MetricsBlock reports a loop device's size (= image size = blockdev --getsize64) only."""
    image, device = loop_image(12 * 1024 * 1024 + 4096)
    metrics = MetricsBlock(device).get_metrics()
    assert metrics.capacity == image.stat().st_size
    assert metrics.capacity == int(sh("blockdev", "--getsize64", device))
    assert metrics.used is None
    assert metrics.inodes is None


@pytest.mark.parametrize("kind", ["file", "directory", "char-device", "missing"])
def test_block_of_non_block_device_fails(tmp_path: Path, kind: str) -> None:
    """A file, a directory, /dev/null or a missing path is FS_INFO_FAILED for MetricsBlock."""
    paths = {
        "file": tmp_path / "f",
        "directory": tmp_path,
        "char-device": Path("/dev/null"),
        "missing": tmp_path / "missing",
    }
    (tmp_path / "f").write_bytes(b"x" * 4096)
    with pytest.raises(MetricsError) as info:
        MetricsBlock(str(paths[kind])).get_metrics()
    assert info.value.code is MetricsErrorCode.FS_INFO_FAILED
    assert str(paths[kind]) in str(info.value)


class _CountingProvider(MetricsProvider):
    """Sleeps, counts calls, and fails the first ``failures`` of them."""

    def __init__(self, failures: int = 0, delay: float = 0.05) -> None:
        self.calls = 0
        self.failures = failures
        self.delay = delay
        self._lock = threading.Lock()

    def get_metrics(self) -> Metrics:
        with self._lock:
            self.calls += 1
            call = self.calls
        time.sleep(self.delay)
        if call <= self.failures:
            raise MetricsError.fs_info_failed("/x", OSError(5, "I/O error"))
        return Metrics(used=call)


def _call_concurrently(provider: MetricsProvider, n: int) -> list[Metrics | BaseException]:
    barrier = threading.Barrier(n)
    results: list[Metrics | BaseException] = [MetricsError.no_path_defined()] * n

    def call(i: int) -> None:
        barrier.wait()
        try:
            results[i] = provider.get_metrics()
        except MetricsError as exc:
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_cached_computes_once_under_concurrency() -> None:
    """32 concurrent first callers: the inner provider runs once, all get the same result."""
    inner = _CountingProvider()
    cached = CachedMetrics(inner)
    results = _call_concurrently(cached, 32)
    assert inner.calls == 1
    assert all(r is results[0] for r in results)
    assert cached.get_metrics() is results[0]
    assert inner.calls == 1


def test_cached_does_not_cache_errors() -> None:
    """A failure goes to its caller and the next call computes again; then it is cached."""
    inner = _CountingProvider(failures=2, delay=0)
    cached = CachedMetrics(inner)
    for _ in range(2):
        with pytest.raises(MetricsError):
            cached.get_metrics()
    assert cached.get_metrics().used == 3
    assert cached.get_metrics().used == 3
    assert inner.calls == 3


def test_cached_concurrent_callers_after_a_failure_retry() -> None:
    """When the first computation fails, waiting callers compute again and one success sticks."""
    inner = _CountingProvider(failures=1)
    results = _call_concurrently(CachedMetrics(inner), 8)
    errors = [r for r in results if isinstance(r, BaseException)]
    successes = [r for r in results if isinstance(r, Metrics)]
    assert len(errors) == 1
    assert len(successes) == 7
    assert {m.used for m in successes} == {2}
    assert inner.calls == 2


def test_cached_du_keeps_first_real_result(tmp_path: Path) -> None:
    """CachedMetrics(MetricsDu) keeps its first figure after the directory grows."""
    (tmp_path / "v").mkdir()
    cached = CachedMetrics(MetricsDu(str(tmp_path / "v")))
    first = cached.get_metrics()
    (tmp_path / "v" / "f").write_bytes(b"x" * 100_000)
    assert cached.get_metrics() is first
    assert MetricsDu(str(tmp_path / "v")).get_metrics().used != first.used


def _project_fs(loop_fs: MakeFs) -> tuple[Path, bool]:
    """A filesystem with project ids, accounting project quotas if this kernel can.

    Returns the mount and whether the kernel accounts project quotas on it: ext4 with
    ``-O quota,project`` mounted ``prjquota`` needs CONFIG_QUOTA and CONFIG_QFMT_V2 (without
    them ext4 refuses to mount it at all). Where that fails, xfs without quotas still keeps
    project ids on its inodes, so the ids are real and only the accounting is missing.
    """
    try:
        opts = ("-I", "256", "-O", "quota,project")
        return loop_fs("ext4", name="prj", mkfs_opts=opts, mount_opts="prjquota"), True
    except OSError:
        return loop_fs("xfs", name="prj-ids", size=320 * 1024 * 1024), False


@pytest.mark.root
def test_project_quota_directory_matches_walk(loop_fs: MakeFs, gnu_du: Du) -> None:
    """On a project-id directory, MetricsDu answers from the quota where the kernel accounts
    project quotas and from the walk where it does not: the same figures either way."""
    fs, accounting = _project_fs(loop_fs)
    vol = fs / "vol"
    vol.mkdir()
    quota_module.set_project_id(str(vol), 4242)
    assert quota_module.get_project_id(str(vol)) == 4242
    (vol / "sub").mkdir()
    for i in range(30):
        (vol / "sub" / f"f{i}").write_bytes(b"q" * (i * 1000))
    os.link(vol / "sub" / "f7", vol / "h")
    assert quota_module.get_project_id(str(vol / "sub" / "f3")) == 4242  # inherited
    os.sync()
    usage = disk_usage(str(vol))
    assert usage.source == ("quota" if accounting else "walk")
    assert (usage.bytes, usage.inodes) == gnu_du(vol)
    metrics = MetricsDu(str(vol)).get_metrics()
    assert (metrics.used, metrics.inodes_used) == gnu_du(vol)


@pytest.mark.root
def test_quota_figures_are_used_when_the_kernel_reports_them(
    loop_fs: MakeFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a project id set, MetricsDu reports curspace/curinodes from Q_GETQUOTA as is.

    The syscall is replaced here (it needs kernel quota support); the project id ioctls
    and the filesystem are real.
    """
    fs, _ = _project_fs(loop_fs)
    vol = fs / "vol"
    vol.mkdir()
    quota_module.set_project_id(str(vol), 7)
    asked: list[tuple[int, int]] = []

    def fake_quotactl_fd(fd: int, cmd: int, qid: int, size: int) -> bytes:
        asked.append((cmd, qid))
        # bhardlimit, bsoftlimit, curspace, ihardlimit, isoftlimit, curinodes, btime, itime,
        # valid = QIF_USAGE (space | inodes)
        return quota_module._IF_DQBLK.pack(0, 0, 123 * 4096, 0, 0, 17, 0, 0, 2 | 8)

    monkeypatch.setattr(quota_module, "_quotactl_fd", fake_quotactl_fd)
    metrics = MetricsDu(str(vol)).get_metrics()
    assert (metrics.used, metrics.inodes_used) == (123 * 4096, 17)
    assert asked == [((0x800007 << 8) | 2, 7)]


@pytest.mark.root
@pytest.mark.parametrize(
    ("outcome", "expected"),
    [("no-usage-flags", "walk"), ("esrch", "walk"), ("eio", "error")],
)
def test_quota_reader_falls_back_or_fails(
    loop_fs: MakeFs, monkeypatch: pytest.MonkeyPatch, outcome: str, expected: str
) -> None:
    """No usage flags or ESRCH (quota off) fall back to the walk; EIO is FS_INFO_FAILED."""
    fs, _ = _project_fs(loop_fs)
    vol = fs / "vol"
    vol.mkdir()
    quota_module.set_project_id(str(vol), 9)

    def fake_quotactl_fd(fd: int, cmd: int, qid: int, size: int) -> bytes:
        if outcome == "esrch":
            raise ProcessLookupError(3, "No such process")
        if outcome == "eio":
            raise OSError(5, "Input/output error")
        return quota_module._IF_DQBLK.pack(0, 0, 999, 0, 0, 999, 0, 0, 1)

    monkeypatch.setattr(quota_module, "_quotactl_fd", fake_quotactl_fd)
    if expected == "walk":
        assert disk_usage(str(vol)).source == "walk"
    else:
        with pytest.raises(MetricsError) as info:
            disk_usage(str(vol))
        assert info.value.code is MetricsErrorCode.FS_INFO_FAILED
        assert str(vol) in str(info.value)


@pytest.mark.root
def test_no_project_id_means_walk(tmp_path: Path, mount_tmpfs: Callable[..., Path]) -> None:
    """Directories without a project id (ext4 root fs, tmpfs) are walked."""
    mnt = mount_tmpfs(tmp_path / "t")
    for path in (tmp_path, mnt):
        assert quota_module.project_usage(str(path)) is None
        assert disk_usage(str(path)).source == "walk"
