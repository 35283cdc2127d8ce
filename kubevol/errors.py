"""kubevol's error tree.

Every error kubevol raises derives from :class:`KubevolError`; where an error also
means "bad value" or "not found" it subclasses the matching builtin too, so callers
may catch either::

    KubevolError
    ├── PluginNotFoundError (LookupError)      no plugin matched a name or spec
    ├── AmbiguousPluginError (LookupError)     several plugins matched; .names
    ├── PluginValidationError (ValueError)     InitPlugins problems, all of them; .problems
    ├── InvalidPathSegmentError (ValueError)   a name/id/UID that would escape the root
    ├── UnsafePathError (OSError)              a link or non-directory where a directory was
    │                                          expected under the root; nothing changed through it
    ├── UntrustedDataError (ValueError)        a file or manifest too big, too deep, too aliased,
    │                                          not a regular file or malformed; names its source
    ├── ProbeError                             a dynamic prober failed; .events still apply
    ├── SpecError (ValueError)                 a Spec or manifest that cannot describe a volume
    │   └── InvalidPayloadPathError            a configMap/secret/... file path the writer refuses
    ├── HostPathTypeError (ValueError)         a hostPath whose type check failed
    ├── OperationError                         a volume operation failed (final)
    │   ├── TransientOperationError            retry later, nothing changed on the node
    │   └── UncertainProgressError             retry: the operation may have been done
    ├── MetricsError                           .code: NOT_SUPPORTED, NO_PATH_DEFINED, FS_INFO_FAILED
    └── MountError (OSError)                   a mount(8)/umount(8)/mkfs/fsck step failed
        ├── CorruptedMountError                the mount point answers ENOTCONN, ESTALE, ...
        ├── UnformattedReadOnlyError           a blank device asked to mount read-only
        ├── FilesystemMismatchError            the device holds another filesystem type
        ├── FilesystemErrorsError              fsck found errors it could not repair
        ├── MountInfoError (ValueError)        a mountinfo line is malformed; names the line
        └── DeviceStillMountedError            the unstage guard refused an unmount; .refs

Packages that sit above this module add branches of their own, defined where they are
raised (so that ``import kubevol`` needs no grpc)::

    KubevolError
    ├── kubevol.util.units.UnitError (ValueError)    a size or duration that cannot be read
    ├── kubevol.csi.errors
    │   ├── CSIRPCError                        .code (grpc.StatusCode), .method
    │   │   └── CSIRPCUncertainError           also UncertainProgressError (non-final codes)
    │   ├── CSIEndpointError (ValueError)      an endpoint that cannot be parsed
    │   └── CSIServeError                      a driver could not be served
    ├── kubevol.csidriver.server.config.ServerConfigError (ValueError)   bad X_CSI_* settings
    ├── kubevol.csidriver.locks: LockConfigError (ValueError), LockProviderError (etcd failed)
    ├── kubevol.plugins.csi: VolumeDataError (ValueError)
    │   └── VolumeDataMissingError (FileNotFoundError)            no vol_data.json
    ├── kubevol.plugins.csi.registration: DriverNotRegisteredError (LookupError),
    │   DriverRegistrationError (ValueError)
    ├── kubevol.plugins.csi.driverinfo.CSIDriverInfoError (ValueError)
    ├── kubevol.plugins.csi.attach: APIError; VolumeAttachmentError (an OperationError)
    ├── kubevol.csidriver.drivers.engine.state.DriverStateError (ValueError)
    ├── kubevol.nomad: PluginWaitTimeoutError (a PluginNotFoundError, TimeoutError),
    │   ManagerStateError, ManagerShutdownError, PluginUnhealthyError,
    │   AttachmentTimeoutError (TimeoutError), AttachmentCancelledError,
    │   ExpansionNotSupportedError, VolumeNotPublishedError (LookupError),
    │   MountPropagationError (a MountError)
    ├── kubevol.k8s.objects: ObjectNotFoundError (LookupError), ObjectSourceError
    ├── kubevol.k8s.tokens: TokenError
    │   └── TokenProviderMissingError          no token provider is configured
    ├── kubevol.mount.subpath.SubPathError (ValueError)   a subPath that escapes or is invalid
    ├── kubevol.plugins.atomic_volume.PayloadError        several sources of a volume failed
    └── kubevol.node.errors: OperationPendingError, OperationBackoffError, VolumeInUseError,
        ReconstructionError, PrivilegeError (PermissionError)

Retry meaning follows the kubelet: :func:`is_operation_finished` is false only for
:class:`TransientOperationError` and :class:`UncertainProgressError`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence


class KubevolError(Exception):
    """Root of every error kubevol raises."""


class PluginNotFoundError(KubevolError, LookupError):
    """No volume plugin matched the name or spec that was asked for."""


class AmbiguousPluginError(KubevolError, LookupError):
    """More than one plugin matched; ``names`` lists them, sorted."""

    def __init__(self, message: str, names: Iterable[str]) -> None:
        super().__init__(message)
        self.names: tuple[str, ...] = tuple(sorted(names))


class PluginValidationError(KubevolError, ValueError):
    """Plugins failed validation or ``init``; ``problems`` holds every one found."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("; ".join(self.problems))


class InvalidPathSegmentError(KubevolError, ValueError):
    """A value that becomes one path segment is empty, too long or escapes its root."""


class UnsafePathError(KubevolError, OSError):
    """A directory kubevol walks, removes or re-owns is a symbolic link or not a directory
    (or changed under the walk); nothing was changed through it."""


class UntrustedDataError(KubevolError, ValueError):
    """Data read from disk or from a manifest was refused before it was used: not a regular
    file, over the size or nesting limit, excessively aliased, or malformed."""


class ProbeError(KubevolError):
    """A dynamic plugin prober failed; ``events`` found before the failure are still applied."""

    def __init__(self, message: str, events: Sequence[object] = ()) -> None:
        super().__init__(message)
        self.events: tuple[object, ...] = tuple(events)


class SpecError(KubevolError, ValueError):
    """A volume Spec, or the manifest it was loaded from, is not valid."""


class InvalidPayloadPathError(SpecError):
    """A path of an atomically written payload (a configMap, secret, downwardAPI or
    projected item) is refused: absolute, with a ``..`` element, too long, ...; the message
    names the key it came from."""


class HostPathTypeError(KubevolError, ValueError):
    """A hostPath volume's ``type`` check failed; the message says what was found."""


class OperationError(KubevolError):
    """A volume operation failed. Unless a subclass says otherwise, the failure is final."""


class TransientOperationError(OperationError):
    """The operation failed before changing anything; retry it later."""


class UncertainProgressError(OperationError):
    """The operation may or may not have taken effect; retry it, and clean up if it is unwanted."""


def is_operation_finished(err: BaseException) -> bool:
    """Tell whether ``err`` ends an operation for good (the kubelet's ``IsOperationFinishedError``).

    Transient and uncertain errors mean the operation may still be in progress or is worth
    retrying; every other error is final.
    """
    return not isinstance(err, TransientOperationError | UncertainProgressError)


class MetricsErrorCode(enum.IntEnum):
    """Why a volume's metrics could not be read (Kubernetes' ``ErrCode*`` values)."""

    NOT_SUPPORTED = 1
    NO_PATH_DEFINED = 2
    FS_INFO_FAILED = 3


class MetricsError(KubevolError):
    """Metrics could not be read; ``code`` is a :class:`MetricsErrorCode`."""

    def __init__(self, code: MetricsErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def not_supported(cls, driver: str | None = None) -> MetricsError:
        """Metrics are not supported (by the named CSI driver, if given)."""
        if driver:
            return cls(
                MetricsErrorCode.NOT_SUPPORTED,
                f"metrics are not supported for {driver} volumes",
            )
        return cls(MetricsErrorCode.NOT_SUPPORTED, "metrics are not supported for this volume")

    @classmethod
    def no_path_defined(cls) -> MetricsError:
        """The provider was given no path to measure."""
        return cls(MetricsErrorCode.NO_PATH_DEFINED, "no path defined for disk usage metrics")

    @classmethod
    def fs_info_failed(cls, path: str, cause: BaseException) -> MetricsError:
        """Reading filesystem information for ``path`` failed; chain the cause with ``from``."""
        return cls(
            MetricsErrorCode.FS_INFO_FAILED,
            f"failed to get filesystem info for {path!r}: {cause}",
        )


def is_not_supported(err: BaseException) -> bool:
    """True if and only if ``err`` is a :class:`MetricsError` meaning "not supported"."""
    return isinstance(err, MetricsError) and err.code is MetricsErrorCode.NOT_SUPPORTED


class MountError(KubevolError, OSError):
    """A mount, unmount, format or check step failed; the message names the path and command."""


class CorruptedMountError(MountError):
    """The path is a mount point whose filesystem no longer answers (ENOTCONN, ESTALE, ...)."""


class UnformattedReadOnlyError(MountError):
    """A blank device cannot be formatted because it was asked to mount read-only."""


class FilesystemMismatchError(MountError):
    """The device already holds a filesystem of another type than the one asked for."""


class FilesystemErrorsError(MountError):
    """``fsck`` found errors on the device that it could not repair."""


class MountInfoError(MountError, ValueError):
    """A mountinfo text is malformed; the message names the line number and its content."""


class DeviceStillMountedError(MountError):
    """The unstage guard refused to unmount a device mount path; ``refs`` lists the blockers."""

    def __init__(self, message: str, refs: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.refs: tuple[str, ...] = tuple(refs)
