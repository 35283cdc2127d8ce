"""What configMap, secret, downwardAPI and projected volumes share: an emptyDir they wrap
(its ``ready`` marker at ``pods/<uid>/plugins/kubernetes.io~empty-dir/wrapped_<volume>``),
files projected into it by the atomic writer, fsGroup applied to the read-only volume,
tear-down through the emptyDir, and the kubelet's payload rules for ConfigMap and Secret
keys (``items``, ``optional``, ``defaultMode``, per-item ``mode``).
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kubevol.errors import KubevolError, SpecError
from kubevol.host import VolumeHost
from kubevol.k8s.pod import Pod
from kubevol.layout import validate_path_segment
from kubevol.metrics import CachedMetrics, MetricsDu
from kubevol.plugin import VolumePlugin
from kubevol.plugins.atomic_writer import (
    DATA_DIR_NAME,
    DEFAULT_MODE,
    AtomicWriter,
    FileProjection,
    validate_payload,
    validate_payload_path,
)
from kubevol.plugins.empty_dir import MEDIUM_DEFAULT
from kubevol.plugins.ownership import set_volume_ownership
from kubevol.spec import ApiMapping, KnownSource, Spec, api_object, pod_uid
from kubevol.types import Attributes, MounterArgs, ReconstructedVolume, VolumeOptions
from kubevol.volume import Metrics, Mounter, Unmounter

if TYPE_CHECKING:
    from kubernetes.client import V1KeyToPath

log = logging.getLogger(__name__)


class PayloadError(KubevolError):
    """Errors of several sources of one volume, all of them (the kubelet's aggregate)."""

    def __init__(self, errors: Sequence[BaseException]) -> None:
        self.errors = tuple(errors)
        text = [str(e) for e in self.errors]
        super().__init__(text[0] if len(text) == 1 else "[" + ", ".join(text) + "]")


def raise_all(errors: Sequence[BaseException]) -> None:
    """Raise the one error, or a :class:`PayloadError` holding several; nothing if none."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise PayloadError(errors)


def mode_of(value: int | None, default: int | None) -> int:
    """A file mode: ``value``, else ``default``, else the API's default 0644."""
    if value is not None:
        return int(value)
    return int(default) if default is not None else DEFAULT_MODE


def key_payload(
    *,
    kind: str,
    items: Sequence[V1KeyToPath] | None,
    values: Mapping[str, bytes],
    default_mode: int | None,
    optional: bool,
) -> dict[str, FileProjection]:
    """The kubelet's ``MakePayload`` for a ConfigMap or Secret (``kind``): every key as a
    file when ``items`` is empty, else each item's ``key`` at its ``path``. A missing key is
    skipped when ``optional``, else an error naming the key (never a value)."""
    mode = mode_of(None, default_mode)
    if not items:
        return {
            validate_payload_path(name, key=name): FileProjection(data=data, mode=mode)
            for name, data in values.items()
        }
    payload: dict[str, FileProjection] = {}
    for item in items:
        data = values.get(item.key)
        if data is None:
            if optional:
                continue
            if kind == "configmap":
                raise SpecError(f"configmap references non-existent config key: {item.key}")
            raise SpecError(f"references non-existent secret key: {item.key}")
        path = validate_payload_path(item.path or "", key=item.key)
        payload[path] = FileProjection(data=data, mode=mode_of(item.mode, default_mode))
    return payload


def empty_dir_spec(medium: str) -> Spec:
    """The emptyDir these volumes wrap (``Memory`` for secrets and projected volumes)."""
    empty_dir = {"medium": medium} if medium else {}
    return Spec.from_volume(api_object("V1Volume", {"name": "wrapped", "emptyDir": empty_dir}))


def pod_namespace(pod: Pod | None) -> str:
    """The pod's namespace (``default`` when the manifest gives none)."""
    return str(getattr(getattr(pod, "metadata", None), "namespace", None) or "default")


def describe_pod(pod: Pod | None) -> str:
    """``namespace/name`` of a ``V1Pod``, for messages."""
    return f"{pod_namespace(pod)}/{getattr(getattr(pod, 'metadata', None), 'name', None) or '?'}"


class AtomicVolume(Mounter, Unmounter, abc.ABC):
    """One pod's volume of files written by the atomic writer into a wrapped emptyDir.

    A mounter has ``pod`` (a ``V1Pod``); an unmounter only the pod's UID. Subclasses say
    what to write in :meth:`collect_payload`.
    """

    def __init__(
        self,
        *,
        host: VolumeHost,
        plugin_name: str,
        volume_name: str,
        pod_uid: str,
        medium: str,
        pod: Pod | None = None,
        opts: VolumeOptions | None = None,
        source: Any = None,
    ) -> None:
        self.host = host
        self.plugin_name = plugin_name
        self.volume_name = validate_path_segment(volume_name, "volume name")
        self.pod_uid = pod_uid
        self.medium = medium
        self.pod = pod
        self.opts = opts or VolumeOptions()
        #: The volume source (``V1SecretVolumeSource``, ...); None for an unmounter.
        self.source = source
        self._metrics = CachedMetrics(MetricsDu(self.get_path()))

    def get_path(self) -> str:
        return self.host.get_pod_volume_dir(self.pod_uid, self.plugin_name, self.volume_name)

    def get_metrics(self) -> Metrics:
        return self._metrics.get_metrics()

    def can_mount(self) -> None:
        """Nothing is needed beyond what the wrapped emptyDir needs."""

    def get_attributes(self) -> Attributes:
        # Read-only for fsGroup purposes: the kubelet adds group read, not write.
        return Attributes(read_only=True, managed=True, selinux_relabel=True)

    @abc.abstractmethod
    def collect_payload(self, args: MounterArgs) -> dict[str, FileProjection]:
        """The files to project. Raises before anything is written when data is missing."""

    def mounter_pod(self) -> Pod:
        """The pod this mounter sets up the volume for; KubevolError on an unmounter, which
        has none."""
        if self.pod is None:
            raise KubevolError(f"volume {self.volume_name!r}: an unmounter has no pod")
        return self.pod

    def log_context(self) -> str:
        return f"pod {describe_pod(self.pod)} volume {self.volume_name}"

    def set_up_at(self, directory: str, args: MounterArgs) -> None:
        """Collect the payload, set up the wrapped emptyDir, write the files. Idempotent: a
        second call rewrites only what changed (that is how updates and token refreshes
        reach the pod). A failure on the first set-up removes what it made; on a later one
        the volume a container may be using is left as it was."""
        if self.pod is None:
            raise KubevolError(f"volume {self.volume_name!r}: an unmounter cannot set up")
        wrapped = self.host.new_wrapper_mounter(
            self.volume_name, empty_dir_spec(self.medium), self.pod, self.opts
        )
        # Bad input changes nothing: every path is checked before the emptyDir is made.
        payload = validate_payload(self.collect_payload(args))
        first = not os.path.lexists(os.path.join(directory, DATA_DIR_NAME))
        wrapped.set_up_at(directory, args)
        done = False
        try:
            writer = AtomicWriter(directory, self.log_context())
            writer.write(payload, self._set_perms(directory, args.fs_group))
            done = True
        finally:
            if not done and first:
                try:
                    self.tear_down_at(directory)
                except Exception as exc:  # the set-up error is the one to report
                    log.error("%s: cleanup after a failed set-up failed: %s",
                              self.log_context(), exc)

    @staticmethod
    def _set_perms(directory: str, fs_group: int | None) -> Callable[[str], None] | None:
        if fs_group is None:
            return None

        def set_perms(_ts_dir: str) -> None:
            # The first write also makes the links outside the timestamped dir: own the
            # whole volume, not only the new data.
            set_volume_ownership(directory, fs_group, None, read_only=True)

        return set_perms

    def tear_down_at(self, directory: str) -> None:
        """Tear down through the wrapped emptyDir (unmount tmpfs or delete the dir, drop the
        ready marker). Idempotent."""
        unmounter = self.host.new_wrapper_unmounter(
            self.volume_name, empty_dir_spec(self.medium), self.pod_uid
        )
        unmounter.tear_down_at(directory)


class AtomicVolumePlugin(VolumePlugin, abc.ABC):
    """The plugin side shared by the four kinds: init, remount, unmounters, reconstruction."""

    #: Medium of the wrapped emptyDir.
    medium: str = MEDIUM_DEFAULT

    def __init__(self) -> None:
        self._host: VolumeHost | None = None

    @property
    def host(self) -> VolumeHost:
        if self._host is None:
            raise RuntimeError(f"{type(self).__name__} used before init()")
        return self._host

    def init(self, host: VolumeHost) -> None:
        self._host = host

    def requires_remount(self, spec: Spec) -> bool:
        """Always: set-up runs again periodically to bring updates (and fresh tokens)."""
        return True

    @abc.abstractmethod
    def source_of(self, spec: Spec) -> Any:
        """The volume source this plugin handles, or None."""

    @abc.abstractmethod
    def empty_source(self, volume_name: str) -> dict[str, ApiMapping]:
        """The pod volume (API dict) reconstruction rebuilds: the kubelet keeps nothing else."""

    @abc.abstractmethod
    def volume_class(self) -> type[AtomicVolume]:
        """The volume class of this plugin."""

    def can_support(self, spec: Spec) -> bool:
        return self._source(spec) is not None

    def _source(self, spec: Spec) -> Any:
        """:meth:`source_of` a pod volume, None for a PersistentVolume; read once per Spec
        (a reconstructed Spec carries it: :meth:`construct_volume_spec`)."""
        return spec.derived(f"{self.get_plugin_name()}:source", self._read_source)

    def _read_source(self, spec: Spec) -> Any:
        return None if spec.is_persistent_volume else self.source_of(spec)

    def _check(self, spec: Spec) -> Any:
        source = self._source(spec)
        if source is None:
            raise SpecError(f"volume {spec.name()!r} is not a {self.get_plugin_name()} volume")
        return source

    def new_mounter(self, spec: Spec, pod: Pod, opts: VolumeOptions) -> AtomicVolume:
        source = self._check(spec)
        return self.volume_class()(
            host=self.host, plugin_name=self.get_plugin_name(), volume_name=spec.name(),
            pod_uid=pod_uid(pod), medium=self.medium, pod=pod, opts=opts, source=source,
        )

    def new_unmounter(self, volume_name: str, pod_uid: str) -> AtomicVolume:
        return self.volume_class()(
            host=self.host, plugin_name=self.get_plugin_name(), volume_name=volume_name,
            pod_uid=pod_uid, medium=self.medium,
        )

    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        source = self.empty_source(volume_name)
        (fields,) = source.values()
        # The model's names of the source's few fields (secretName: secret_name); the tests
        # hold the result equal to the built model's source.
        known = KnownSource({_snake_case(k): v for k, v in fields.items()})
        return ReconstructedVolume(spec=Spec.from_api_data(
            volume={"name": volume_name, **source},
            known={f"{self.get_plugin_name()}:source": known},
        ))


def _snake_case(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
