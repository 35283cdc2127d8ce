"""Volume metrics from the driver's NodeGetVolumeStats (the kubelet's ``metricsCsi``)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TypeVar

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient, StartedCall
from kubevol.errors import KubevolError, MetricsError
from kubevol.plugins.csi.context import CSIContext
from kubevol.plugins.csi.registration.registry import DriverNotRegisteredError
from kubevol.volume import Metrics, MetricsProvider

_Sent = TypeVar("_Sent")


class CSIMetrics(MetricsProvider):
    """Usage of a published CSI volume, as the driver reports it.

    Figures the driver leaves out read 0, as in the kubelet; the volume condition fills
    ``abnormal``/``message`` only when the driver advertises VOLUME_CONDITION.
    """

    def __init__(self, *, ctx: CSIContext, driver: str, volume_id: str, target_path: str) -> None:
        self.ctx = ctx
        self.driver = driver
        self.volume_id = volume_id
        self.target_path = target_path

    def get_metrics(self) -> Metrics:
        """Ask the driver now. Raises :class:`~kubevol.errors.MetricsError`: NOT_SUPPORTED
        without GET_VOLUME_STATS, NO_PATH_DEFINED without a path, FS_INFO_FAILED when the
        driver is not registered or a call fails."""
        caps, now, stats = self._ask(lambda client: client.node_get_volume_stats(
            self.volume_id, self.target_path, timeout=self.ctx.timeout))
        return self._figures(stats, caps, now)

    def metrics_starter(self) -> Callable[[], PendingMetrics] | None:
        """:meth:`start`, once the driver's node capabilities are known (asking them would
        block: the caller then calls :meth:`get_metrics`)."""
        try:
            known = self.ctx.client(self.driver).node_capabilities_known()
        except DriverNotRegisteredError:
            known = True  # start() fails at once
        return self.start if known else None

    def start(self) -> PendingMetrics:
        """:meth:`get_metrics` without waiting for the driver: NodeGetVolumeStats is sent and
        its answer read by :meth:`PendingMetrics.outcome`. Raises as :meth:`get_metrics` for
        what it can tell at once."""
        caps, now, started = self._ask(lambda client: client.node_get_volume_stats_started(
            self.volume_id, self.target_path, timeout=self.ctx.timeout))
        return PendingMetrics(self, caps, now, started)

    def _ask(
        self, send: Callable[[CSIClient], _Sent]
    ) -> tuple[frozenset[t.NodeCapability], datetime.datetime, _Sent]:
        """The driver's capabilities, the time, and what ``send`` made of the client;
        raises the :class:`~kubevol.errors.MetricsError` each failure means."""
        if not self.target_path:
            raise MetricsError.no_path_defined()
        now = datetime.datetime.now(datetime.UTC)
        try:
            client = self.ctx.client(self.driver)
            caps = self._capabilities(client)
            return caps, now, send(client)
        except MetricsError:
            raise
        except (DriverNotRegisteredError, KubevolError) as exc:
            raise MetricsError.fs_info_failed(self.target_path, exc) from exc

    def _capabilities(self, client: CSIClient) -> frozenset[t.NodeCapability]:
        """The client's cached answer (asked again by every other node operation): the
        kubelet asks before each NodeGetVolumeStats, but an agent refreshing every claim's
        stats each minute would ask once per claim for the same answer."""
        caps = client.node_get_capabilities(timeout=self.ctx.timeout)
        if t.NodeCapability.GET_VOLUME_STATS not in caps:
            raise MetricsError.not_supported(self.driver)
        return caps

    def _figures(
        self, stats: t.VolumeStats, caps: frozenset[t.NodeCapability], now: datetime.datetime
    ) -> Metrics:
        if not stats.usage:
            raise MetricsError.fs_info_failed(
                self.target_path, ValueError("failed to get usage from response. usage is nil")
            )
        values = {"used": 0, "capacity": 0, "available": 0,
                  "inodes_used": 0, "inodes": 0, "inodes_free": 0}
        nbytes = stats.by_unit(t.UsageUnit.BYTES)
        if nbytes is not None:
            values.update(used=nbytes.used, capacity=nbytes.total, available=nbytes.available)
        inodes = stats.by_unit(t.UsageUnit.INODES)
        if inodes is not None:
            values.update(
                inodes_used=inodes.used, inodes=inodes.total, inodes_free=inodes.available
            )
        abnormal: bool | None = None
        message: str | None = None
        if t.NodeCapability.VOLUME_CONDITION in caps:
            condition = stats.volume_condition or t.VolumeCondition()
            abnormal, message = condition.abnormal, condition.message
        return Metrics(time=now, abnormal=abnormal, message=message, **values)


class PendingMetrics:
    """A NodeGetVolumeStats in flight (:meth:`CSIMetrics.start`): a
    :class:`kubevol.mount.probe.Pending` of :class:`~kubevol.volume.Metrics`."""

    def __init__(self, metrics: CSIMetrics, caps: frozenset[t.NodeCapability],
                 now: datetime.datetime, started: StartedCall[t.VolumeStats]) -> None:
        self._metrics = metrics
        self._caps = caps
        self._now = now
        self._started = started

    def done(self) -> bool:
        """Whether the driver answered (or the call failed)."""
        return self._started.done()

    def when_done(self, fn: Callable[[], None]) -> None:
        """Have ``fn()`` called once the call ended (at once if it has)."""
        self._started.when_done(fn)

    def outcome(self) -> Metrics:
        """The figures of the ended call; raises as :meth:`CSIMetrics.get_metrics`."""
        try:
            stats = self._started.outcome()
        except KubevolError as exc:
            raise MetricsError.fs_info_failed(self._metrics.target_path, exc) from exc
        return self._metrics._figures(stats, self._caps, self._now)
