"""Lock providers for the serial-volume-access middleware: in-process and etcd.

See :mod:`kubevol.csidriver.locks.base` for the contract, :mod:`kubevol.csidriver.locks.etcd`
for the etcd key layout and :mod:`kubevol.csidriver.locks.env` for the environment variables.
"""

from kubevol.csidriver.locks.base import (
    HeldLock,
    LockConfigError,
    LockKind,
    LockProviderError,
    VolumeLockProvider,
)
from kubevol.csidriver.locks.env import (
    etcd_provider_from_env,
    lock_provider_from_env,
    lock_timeout_from_env,
    parse_bool,
    parse_duration,
    serial_volume_access_enabled,
)
from kubevol.csidriver.locks.etcd import EtcdEndpoint, EtcdHeldLock, EtcdLockProvider
from kubevol.csidriver.locks.inprocess import InProcessLockProvider

__all__ = [
    "EtcdEndpoint",
    "EtcdHeldLock",
    "EtcdLockProvider",
    "HeldLock",
    "InProcessLockProvider",
    "LockConfigError",
    "LockKind",
    "LockProviderError",
    "VolumeLockProvider",
    "etcd_provider_from_env",
    "lock_provider_from_env",
    "lock_timeout_from_env",
    "parse_bool",
    "parse_duration",
    "serial_volume_access_enabled",
]
