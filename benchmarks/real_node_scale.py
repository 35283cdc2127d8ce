"""``kubevol reconstruct -o json`` of a kubelet root shaped like a real node, at the scale of
a host with many small pods (issue 14): 5,000 pods of 4 volumes each, every pod with its
projected service-account token on a real tmpfs, against ``find ROOT -name vol_data.json``
in the same run.

Usage (as root, in a private mount namespace: the tree has 5,000 tmpfs mounts)::

    unshare -m --propagation private .venv/bin/python -m benchmarks.real_node_scale \\
        [--pods 5000] [--repeat 5]

Each pod is laid out as the kubelet lays it out (facts from the kubelet's code: volume
directories, the atomic writer's ``..data`` link to a ``..<timestamp>`` directory and the
user-visible links into it, the wrapped emptyDir's ``ready`` marker, the CSI plugin's
``vol_data.json`` keys and its staging directory named by the volume handle's sha256), with
four volumes:

- ``kube-api-access-<5>``, projected: a tmpfs mounted at its volume directory holding
  ``token``, ``ca.crt`` and ``namespace``;
- a configMap with two keys and an emptyDir (``ready`` marker), on disk;
- a CSI PersistentVolume (``vol_data.json`` and ``mount/``; its staging ``globalmount``
  and ``vol_data.json`` under ``plugins/kubernetes.io/csi/<driver>/<sha256(handle)>``);

and the files a pod directory has besides (``etc-hosts``, ``containers/<name>/<id>``).

Then, interleaved, ``--repeat`` fresh processes of each (after one warm-up round): the CLI
as an operator runs it (start-up included, bytecode cache on: ``PYTHONDONTWRITEBYTECODE``
removed from its environment) and ``find``. It prints the medians and best runs, their
ratio, the CLI's largest max RSS, the load average, and checks that the JSON lists every
volume, no failure, and every token volume mounted. Targets: <= 2 s from the CLI, max RSS
under 300 MB (and, for information, the ratio to ``find``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.reconstruct import cli_and_find
from benchmarks.report import Row, emit, load_average
from kubevol.mount import syscalls

CLI_TARGET_SECONDS = 2.0
RSS_TARGET_MB = 300.0
DRIVER = "pd.csi.storage.gke.io"
NODE = "node-1"


def mount_tmpfs(target: str) -> None:
    """mount(2) a small tmpfs at ``target`` (as the kubelet's wrapped Memory emptyDir)."""
    syscalls.mount("tmpfs", target, "tmpfs", 0, "size=1m")


def atomic_write(directory: str, files: dict[str, str], stamp: str) -> None:
    """The atomic writer's layout: files in ``..<stamp>``, ``..data`` linking to it, and
    each visible name a link to ``..data/<name>``."""
    ts_dir = f"..{stamp}"
    os.mkdir(os.path.join(directory, ts_dir))
    for name, text in files.items():
        with open(os.path.join(directory, ts_dir, name), "w", encoding="utf-8") as f:
            f.write(text)
    os.symlink(ts_dir, os.path.join(directory, "..data"))
    for name in files:
        os.symlink(os.path.join("..data", name), os.path.join(directory, name))


def ready_marker(pod: str, volume: str) -> None:
    """The wrapped emptyDir's ``ready`` marker of an atomic-writer volume (or an emptyDir's
    own, when ``volume`` has no ``wrapped_`` prefix)."""
    marker_dir = os.path.join(pod, "plugins", "kubernetes.io~empty-dir", volume)
    os.makedirs(marker_dir)
    open(os.path.join(marker_dir, "ready"), "w").close()


def build_tree(root: str, pods: int) -> list[str]:
    """The kubelet root; returns the tmpfs mounts made (to undo them)."""
    stamp = "2026_11_23_08_00_00.1234567890"
    csi_base = os.path.join(root, "plugins", "kubernetes.io", "csi", DRIVER)
    mounts: list[str] = []
    for p in range(pods):
        uid = f"{p:08x}-1f2e-4d3c-8b4a-{p:012x}"
        pod = os.path.join(root, "pods", uid)
        volumes = os.path.join(pod, "volumes")
        # projected service-account token, on tmpfs
        token = f"kube-api-access-{p % 100000:05d}"
        token_dir = os.path.join(volumes, "kubernetes.io~projected", token)
        os.makedirs(token_dir)
        mount_tmpfs(token_dir)
        mounts.append(token_dir)
        atomic_write(token_dir, {"token": "eyJhbGciOi.x.y", "ca.crt": "-----BEGIN---",
                                 "namespace": "default"}, stamp)
        ready_marker(pod, f"wrapped_{token}")
        # configMap, on disk
        config_dir = os.path.join(volumes, "kubernetes.io~configmap", "config")
        os.makedirs(config_dir)
        atomic_write(config_dir, {"app.yaml": "a: 1\n", "log.level": "info"}, stamp)
        ready_marker(pod, "wrapped_config")
        # emptyDir, on disk
        os.makedirs(os.path.join(volumes, "kubernetes.io~empty-dir", "cache"))
        ready_marker(pod, "cache")
        # CSI PersistentVolume, published (not mounted here) and staged
        pv, handle = f"pvc-{p:08x}-5a6b-4c7d-8e9f-0a1b2c3d4e5f", f"projects/p/disks/d-{p}"
        csi_dir = os.path.join(volumes, "kubernetes.io~csi", pv)
        os.makedirs(os.path.join(csi_dir, "mount"))
        with open(os.path.join(csi_dir, "vol_data.json"), "w", encoding="utf-8") as f:
            json.dump({"attachmentID": hashlib.sha256(handle.encode()).hexdigest(),
                       "driverName": DRIVER, "nodeName": NODE, "specVolID": pv,
                       "volumeHandle": handle, "volumeLifecycleMode": "Persistent"},
                      f, sort_keys=True, separators=(",", ":"))
        stage = os.path.join(csi_base, hashlib.sha256(handle.encode()).hexdigest())
        os.makedirs(os.path.join(stage, "globalmount"))
        with open(os.path.join(stage, "vol_data.json"), "w", encoding="utf-8") as f:
            json.dump({"driverName": DRIVER, "volumeHandle": handle}, f)
        # what else a pod directory holds
        open(os.path.join(pod, "etc-hosts"), "w").close()
        os.makedirs(os.path.join(pod, "containers", "app"))
        open(os.path.join(pod, "containers", "app", f"{p:08x}"), "w").close()
    return mounts


def unmount_all(mounts: list[str]) -> None:
    for target in reversed(mounts):
        syscalls.umount(target, syscalls.MNT_DETACH)


def run_timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, float, bytes]:
    """Seconds, CPU seconds (user + system), max RSS (MB) and stdout of one run of
    ``argv``, which must succeed."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} exited {proc.returncode}")
    return took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out


def check_output(out: bytes, pods: int) -> str:
    """What is wrong with the CLI's JSON, or ""."""
    data = json.loads(out)
    volumes, failures = data["volumes"], data["failures"]
    tokens = [v for v in volumes if v["plugin"] == "kubernetes.io/projected"]
    if len(volumes) != 4 * pods:
        return f"{len(volumes)} volumes listed, {4 * pods} expected"
    if failures:
        return f"{len(failures)} failures, e.g. {failures[0]['reason']}"
    if len(tokens) != pods or any(v["mount"] != "mounted" for v in tokens):
        return "a token volume is not listed as mounted"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root in a private mount namespace (the tree has tmpfs mounts)",
              file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="kubevol-bench-real-node-")
    root = os.path.join(work, "root")
    mounts: list[str] = []
    try:
        started = time.perf_counter()
        mounts = build_tree(root, args.pods)
        print(f"built {args.pods} pods x 4 volumes ({len(mounts)} tmpfs mounts) in "
              f"{time.perf_counter() - started:.1f} s under {root}")
        commands, env = cli_and_find(root)
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        rss: list[float] = []
        problem = ""
        for round_ in range(args.repeat + 1):
            for name, argv in commands.items():
                took, cpu_time, max_rss, out = run_timed(argv, env)
                if name == "cli":
                    problem = problem or check_output(out, args.pods)
                    rss.append(max_rss)
                if round_:  # the first round warms the caches and writes bytecode
                    times[name].append(took)
                    cpu[name].append(cpu_time)
        cli, find = statistics.median(times["cli"]), statistics.median(times["find"])
        print(f"kubevol reconstruct -o json ({4 * args.pods} volumes, CLI, start-up "
              f"included): median {cli:.3f} s, best {min(times['cli']):.3f} s, max RSS "
              f"{max(rss):.0f} MB")
        print(f"find ROOT -name vol_data.json: median {find:.3f} s, best "
              f"{min(times['find']):.3f} s")
        print(f"ratio (medians) {cli / find:.2f}x, (best) "
              f"{min(times['cli']) / min(times['find']):.2f}x; CPU time (user + system, "
              f"medians): kubevol {statistics.median(cpu['cli']):.3f} s, find "
              f"{statistics.median(cpu['find']):.3f} s (the machine may be shared: CPU "
              "time is what load changes least)")
        if problem:
            print(f"FAILED: {problem}", file=sys.stderr)
        rows = [
            Row(work=f"reconstruct -o json, {args.pods} pods x 4 volumes, tmpfs each (CLI)",
                unit="s", kubevol=cli, reference=find,
                reference_name="find ROOT -name vol_data.json",
                max_value=CLI_TARGET_SECONDS * max(1.0, args.pods / 5000)),
            Row(work=f"reconstruct -o json, {args.pods} pods x 4 volumes: max RSS",
                unit="MB", kubevol=max(rss), reference=RSS_TARGET_MB,
                reference_name="the target", max_value=RSS_TARGET_MB),
        ]
        for row in rows:
            emit(row)
        print(load_average())
        return 0 if all(row.met for row in rows) and not problem else 1
    finally:
        unmount_all(mounts)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
