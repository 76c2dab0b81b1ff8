"""Prometheus metrics of one server (``--metrics-port``), kept off the hot path's cost.

The event loop only bumps plain integers and floats on pre-built per-op records (a dict
lookup, a ``bisect`` into the latency buckets, a few additions: about 1.2 µs a request,
against about 6.7 µs for ``prometheus_client``'s locked ``Histogram.observe`` + ``Counter.inc``
on pre-bound children, measured with ``timeit`` on the 2-core development machine);
a ``prometheus_client`` collector turns them into counter/histogram/gauge families when
``/metrics`` is scraped. Gauges that are cheap to read then (connections paused, requests in
flight, per-tensor sizes) are computed at scrape time, and ``ProcessCollector`` adds RSS, CPU and
open files. Each server owns its own registry: nothing global, so several servers may share a
process (tests). The endpoint runs on the event loop with connection, time and header limits and
an optional bearer token (``asyncgraph.server.metrics_http``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from asyncgraph.protocol.ops import Op
from asyncgraph.server.metrics_http import MetricsEndpoint

if TYPE_CHECKING:
    from asyncgraph.storage.store import PartitionStore

__all__ = ["LATENCY_BUCKETS", "UNKNOWN_OP", "OpStats", "ServerMetrics"]

#: Upper bounds of the request latency buckets in seconds: 50 µs (a loopback ping) to 10 s.
LATENCY_BUCKETS = (
    5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)  # fmt: skip
#: Label of requests naming an op this server does not know.
UNKNOWN_OP = "unknown"


class OpStats:
    """Answered requests of one op: outcomes and a latency histogram (per-bucket, not cumulative)."""

    __slots__ = ("buckets", "error", "ok", "seconds")

    def __init__(self) -> None:
        self.ok = 0
        self.error = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf


class ServerMetrics:
    """Counters of one server, its ``/metrics`` collector and the HTTP endpoint exposing them."""

    def __init__(self, *, part_id: int, store: Callable[[], PartitionStore | None]) -> None:
        self.part_id = part_id
        self.ops: dict[str, OpStats] = {str(op): OpStats() for op in Op}
        self.ops[UNKNOWN_OP] = OpStats()
        self.rows_in = 0  # rows pushed / updated
        self.rows_out = 0  # rows pulled
        self.bytes_in = 0
        self.bytes_out = 0
        self.socket_writes = 0  # writelines calls: replies to one read's requests share one
        self.connections_open = 0
        self.connections_total = 0
        self.connection_failures = 0
        self._store = store
        self._inflight: Callable[[], int] = lambda: 0
        self._paused: Callable[[], int] = lambda: 0
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu, fds
        self.registry.register(_Collector(self))
        self.port: int | None = None
        self._http: MetricsEndpoint | None = None

    def observe(self, op: str, ok: bool, t0: float) -> None:
        """Count one answered request and its latency since ``t0`` (``perf_counter``)."""
        elapsed = perf_counter() - t0
        stats = self.ops.get(op)
        if stats is None:
            stats = self.ops[UNKNOWN_OP]
        stats.buckets[bisect_left(LATENCY_BUCKETS, elapsed)] += 1
        stats.seconds += elapsed
        if ok:
            stats.ok += 1
        else:
            stats.error += 1

    def watch(self, inflight: Callable[[], int], paused: Callable[[], int]) -> None:
        """Read the in-flight and held-back counts from the transport at scrape time."""
        self._inflight, self._paused = inflight, paused

    async def start_http(self, host: str, port: int, token: bytes | None = None) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) from the event loop, bounded
        (``asyncgraph.server.metrics_http``; ``token``: required as a bearer token); the port."""
        self._http = MetricsEndpoint(self.registry, token=token)
        self.port = await self._http.start(host, port)
        return self.port

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


class _Collector(Collector):
    """Builds the metric families from a ``ServerMetrics`` when scraped (HTTP thread)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        requests = CounterMetricFamily(
            "asyncgraph_requests", "requests answered, by op and outcome", labels=["op", "outcome"]
        )
        latency = HistogramMetricFamily(
            "asyncgraph_request_seconds",
            "time from decoding a request to queueing its reply, by op",
            labels=["op"],
        )
        bounds = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
        for op, stats in list(m.ops.items()):
            requests.add_metric([op, "ok"], stats.ok)
            requests.add_metric([op, "error"], stats.error)
            cumulative, running = [], 0
            for bound, n in zip(bounds, list(stats.buckets), strict=True):
                running += n
                cumulative.append((bound, float(running)))
            latency.add_metric([op], cumulative, sum_value=stats.seconds)
        yield requests
        yield latency
        rows = CounterMetricFamily("asyncgraph_rows", "tensor rows moved, by direction", labels=["direction"])
        rows.add_metric(["in"], m.rows_in)
        rows.add_metric(["out"], m.rows_out)
        yield rows
        traffic = CounterMetricFamily(
            "asyncgraph_bytes", "bytes on client connections, by direction", labels=["direction"]
        )
        traffic.add_metric(["in"], m.bytes_in)
        traffic.add_metric(["out"], m.bytes_out)
        yield traffic
        yield CounterMetricFamily(
            "asyncgraph_socket_writes",
            "writes to client sockets (replies to the requests of one read share one)",
            value=m.socket_writes,
        )
        yield CounterMetricFamily("asyncgraph_connections", "client connections accepted",
                                  value=m.connections_total)  # fmt: skip
        yield CounterMetricFamily(
            "asyncgraph_connection_failures",
            "connections closed for an authentication or protocol failure",
            value=m.connection_failures,
        )
        yield GaugeMetricFamily("asyncgraph_connections_open", "client connections open",
                                value=m.connections_open)  # fmt: skip
        yield GaugeMetricFamily(
            "asyncgraph_requests_in_flight", "async requests (barriers) waiting for their result",
            value=m._inflight(),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "asyncgraph_connections_held_back",
            "connections whose reading is paused by back-pressure (their requests wait in the socket)",
            value=m._paused(),
        )
        yield GaugeMetricFamily("asyncgraph_partition", "partition this server serves", value=m.part_id)
        nbytes = GaugeMetricFamily("asyncgraph_tensor_bytes", "bytes held of a tensor", labels=["tensor"])
        n_rows = GaugeMetricFamily("asyncgraph_tensor_rows", "rows held of a tensor", labels=["tensor"])
        store = m._store()
        if store is not None:
            for name, (count, size) in store.local_sizes().items():
                nbytes.add_metric([name], float(size))
                n_rows.add_metric([name], float(count))
        yield nbytes
        yield n_rows
        overlay = store.overlay.stats() if store is not None and store.overlay is not None else {}
        for key, what in _OVERLAY:  # a live graph's (issue 35)
            value = store.overlay.compactions if key == "compactions" and store and store.overlay else None
            yield GaugeMetricFamily(f"asyncgraph_{key}", what, value=float(value or overlay.get(key, 0)))


#: A live graph's overlay gauges: ``Overlay.stats`` keys (and the compactions counted).
_OVERLAY = (
    ("overlay_edges", "edges added since the last compaction (the overlay's appended edges)"),
    ("overlay_removed", "edges removed since the last compaction (tombstones)"),
    ("overlay_bytes", "bytes the live graph's overlay holds (its compacted CSC included)"),
    ("compactions", "compactions that made the overlay's CSC"),
)
