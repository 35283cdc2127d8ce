"""Test doubles shipped with kubevol for unit tests of code built on it.

They stand in for real systems only in unit tests of logic; kubevol's own tests also run
every part against the real thing (real mounts, real gRPC).
"""

from kubevol.testing.fake_mounter import FakeAction, FakeMounter

__all__ = ["FakeAction", "FakeMounter"]
