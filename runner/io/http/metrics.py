"""Prometheus metrics (SPEC E4), exposed through ``prometheus_client``.

Two kinds of figures:

* **process figures**: what this process did (HTTP requests by route and code, their
  latency, intake answers, cycles and their sends, confirmations, reconciles and
  failures).  Counters in memory, incremented where the work happens: a counter
  increment is a lock and an addition, nothing per scrape.
* **store figures**: what the store holds (leads by state, the uncertain backlog and the
  age of its oldest record, poll health, the last candidate sweep, the pipeline backlog).
  Read from the store at scrape time, so on PostgreSQL every host reports the same
  numbers for the shared store.  How they stay cheap is said in ``runner.io.http.figures``.

A registry of our own per server (never the library's global one): tests start several
servers in one process, and no global state needs resetting.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from runner.io.http.health import LoopState
    from runner.leads.intake import AcceptResult
    from runner.tasks.outcomes import CycleSummary

#: request latency buckets (seconds): a commit is milliseconds; a scrape of a big store less
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)
#: batch size buckets (records): group commits and records dispatched per cycle
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 5000, 20000)


class _StoreCollector(Collector):
    """Yields the store figures read just before the scrape renders."""

    def __init__(self) -> None:
        self.metrics: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # figures vary per scrape: no fixed description at registration


class Metrics:
    """The registry of one server, and the calls that feed it."""

    def __init__(self, state: LoopState,
                 read_store: Callable[[], Awaitable[list[Metric]]] | None = None) -> None:
        self.state = state
        self.read_store = read_store
        self.registry = registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("runner_http_requests", "HTTP requests answered",
                                ["route", "code"], registry=registry)
        self.latency = Histogram("runner_http_request_seconds",
                                 "time to answer an HTTP request", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self.intake = Counter("runner_intake_records",
                              "records answered by webhook intake, by result and reason",
                              ["result", "reason"], registry=registry)
        self.commit_size = Histogram("runner_intake_commit_records",
                                     "records per intake commit (group commits)",
                                     buckets=BATCH_BUCKETS, registry=registry)
        self.cycles = Counter("runner_cycles", "delivery cycles completed", registry=registry)
        self.last_cycle = Gauge("runner_last_cycle_timestamp_seconds",
                                "wall-clock time the last delivery cycle completed",
                                registry=registry)
        self.transitions = Counter(
            "runner_cycle_records",
            "records moved by delivery cycles: recovered, reconciled, dispatched, confirmed, "
            "failed_safe, uncertain, polled", ["outcome"], registry=registry)
        self.dispatch_size = Histogram("runner_cycle_dispatched_records",
                                       "records dispatched per cycle",
                                       buckets=BATCH_BUCKETS, registry=registry)
        self.scrape_store = Histogram("runner_metrics_store_seconds",
                                      "store time of one /metrics scrape",
                                      buckets=LATENCY_BUCKETS, registry=registry)
        self._store = _StoreCollector()
        registry.register(self._store)
        # the labelled children, looked up once: ``labels()`` (a lock, a dict lookup and
        # a check of every label) cost more than the increment itself, per request
        self._request_handles: dict[tuple[str, int],
                                    tuple[Callable[[], None], Callable[[float], None]]] = {}
        self._intake_handles: dict[tuple[str, str], Callable[[], None]] = {}

    # -- feeding -----------------------------------------------------------------------

    def request(self, route: str, code: int, seconds: float) -> None:
        handles = self._request_handles.get((route, code))
        if handles is None:
            handles = self._request_handles[route, code] = (
                self.requests.labels(route, str(code)).inc,
                self.latency.labels(route).observe)
        count, observe = handles
        count()
        observe(seconds)

    def accepted(self, results: Sequence[AcceptResult]) -> None:
        handles = self._intake_handles
        for result in results:
            key = (result.result, result.reason or "")
            count = handles.get(key)
            if count is None:
                count = handles[key] = self.intake.labels(*key).inc
            count()

    def committed(self, records: int) -> None:
        self.commit_size.observe(records)

    def cycle_done(self, summary: CycleSummary, wall_now: float) -> None:
        self.cycles.inc()
        self.last_cycle.set(wall_now)
        for outcome, count in summary.to_json().items():
            if count:
                self.transitions.labels(outcome).inc(count)
        self.dispatch_size.observe(summary.dispatched)

    # -- scraping ----------------------------------------------------------------------

    async def render(self) -> tuple[bytes, str]:
        if self.read_store is not None:
            import time

            began = time.perf_counter()
            self._store.metrics = await self.read_store()
            self.scrape_store.observe(time.perf_counter() - began)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
