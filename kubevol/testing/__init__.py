"""Test doubles shipped with kubevol for unit tests of code built on it.

They stand in for real systems only in unit tests of logic; kubevol's own tests also run
every part against the real thing (real mounts, real gRPC).

Modules that start real servers import their dependencies on use:
``kubevol.testing.etcd`` (a real etcd), ``kubevol.testing.kube_api`` (a stand-in
Kubernetes API server on loopback), ``kubevol.testing.mount_rig`` (loop devices, tmpfs,
bind and corrupted mounts that clean up after themselves), ``kubevol.testing.kubelet_root``
(a kubelet root shaped as a real node has it, on real mounts, built from the kubelet's code),
``kubevol.testing.glusterfs`` (a private GlusterFS server and fuse.glusterfs mounts to freeze
or kill),
``kubevol.testing.csi_driver``
(a configurable, recording, fault-injecting CSI driver on kubevol's server framework, served
in-process or as ``python -m kubevol.testing.csi_driver``).

``kubevol.testing.fake_nomad`` fakes :mod:`kubevol.nomad`'s ``Manager`` and
``NodeController`` in memory, for unit tests of a Nomad-like agent.
"""

from kubevol.testing.fake_mounter import FakeAction, FakeMounter
from kubevol.testing.fake_nomad import FakeCSIManager, FakeNodeController, FakeNomadCall
from kubevol.testing.fake_plugin import FakeVolumePlugin, fake_plugin_with

__all__ = [
    "FakeAction",
    "FakeCSIManager",
    "FakeMounter",
    "FakeNodeController",
    "FakeNomadCall",
    "FakeVolumePlugin",
    "fake_plugin_with",
]
