"""CSI drivers shipped with kubevol, written on :mod:`kubevol.csidriver.server`.

- :mod:`~kubevol.csidriver.drivers.hostpath` -- a real single-node driver: directories and
  loop-backed images, real bind mounts, snapshots as copies, state kept on disk;
  ``shared_filesystem`` mode puts every volume on one ext4 filesystem (Lustre's shape).
- :mod:`~kubevol.csidriver.drivers.sharedfs` -- volumes as sub-directories of a real network
  filesystem (NFS, CephFS, Lustre, GlusterFS), staged as Azure Lustre's driver stages them:
  the whole filesystem at each staging path, the sub-directory bound at each target.
- :mod:`~kubevol.csidriver.drivers.mock` -- an in-memory driver implementing every RPC exactly
  as the spec says, for tests of CSI clients (optionally creating target paths only).

All run on :mod:`~kubevol.csidriver.drivers.engine`, which implements the spec's rules once.
"""
