"""CSI drivers shipped with kubevol, written on :mod:`kubevol.csidriver.server`.

- :mod:`~kubevol.csidriver.drivers.hostpath` -- a real single-node driver: directories and
  loop-backed images, real bind mounts, snapshots as copies, state kept on disk;
  ``shared_filesystem`` mode puts every volume on one ext4 filesystem (Lustre's shape).
- :mod:`~kubevol.csidriver.drivers.mock` -- an in-memory driver implementing every RPC exactly
  as the spec says, for tests of CSI clients (optionally creating target paths only).

Both run on :mod:`~kubevol.csidriver.drivers.engine`, which implements the spec's rules once.
"""
