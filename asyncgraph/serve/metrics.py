"""Prometheus metrics of a serving process: requests by outcome, batch sizes, and latency by
stage (queue, sample, pull, forward, total), on its own registry (``GET /metrics``)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

__all__ = ["STAGES", "ServeMetrics"]

STAGES = ("queue", "sample", "pull", "forward", "total")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServeMetrics:
    """The serving process's counters and histograms (one registry per process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "asyncgraph_serve_requests",
            "Inference requests by outcome (ok, or the error code)",
            ["outcome"],
            registry=self.registry,
        )
        self.batch_nodes = Histogram(
            "asyncgraph_serve_batch_nodes",
            "Distinct nodes per dynamic batch",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "asyncgraph_serve_batch_requests",
            "Requests merged into one dynamic batch",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "asyncgraph_serve_latency_seconds",
            "Latency of each stage of a request (queue, sample, pull, forward) and in total",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.remote_rows = Counter(
            "asyncgraph_serve_remote_rows",
            "Feature rows pulled from servers on other hosts (or over sockets)",
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "asyncgraph_serve_cache_hits",
            "Feature rows read from the serve process's feature cache",
            registry=self.registry,
        )

        # labelled children resolved once: ``labels()`` per observation was 4% of the loop at load
        self._stages = {stage: self.latency.labels(stage=stage) for stage in STAGES}
        self._outcomes: dict[str, Any] = {}

    def observe_stage(self, stage: str, seconds: float) -> None:
        child = self._stages.get(stage)
        (child if child is not None else self.latency.labels(stage=stage)).observe(seconds)

    def count_request(self, outcome: str) -> None:
        """One more request answered with ``outcome`` (``ok`` or an error code)."""
        child = self._outcomes.get(outcome)
        if child is None:
            child = self._outcomes[outcome] = self.requests.labels(outcome=outcome)
        child.inc()

    def text(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)
