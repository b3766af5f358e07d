"""``gen:results KIND [BACKEND]``: the latest results file of a kind
(``bench/results/KIND-*.json``), rendered by its kind's renderer (``docs/gen/performance.py``,
``docs/gen/reliability.py``); ``gen:figure KIND KEY [FORMAT]``, one figure of it, for a
sentence that cites a measurement; and ``gen:stop-moments``, every stop-moment run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mkdocs.exceptions import PluginError

from docs.gen.common import ROOT, all_results, provenance
from docs.gen.performance import (
    render_accept_scale,
    render_accept_scale_matrix,
    render_batch,
    render_bench,
    render_delivery_floor,
    render_delivery_scale,
    render_http_target,
    render_logcost,
    render_pg_target,
    render_pipeline,
    render_rates,
    render_reconcile,
    render_resolve,
    render_startup,
    render_sweep_explain,
    render_webhook_floor,
)
from docs.gen.reliability import (
    render_chaos,
    render_chaos_http,
    render_failover,
    render_forget,
    render_kill9,
    render_kill9_http,
    render_kill9_settled,
    render_soak,
    render_spin,
    render_spin_deep,
    render_stop_moment_run,
)

RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "accept-scale": render_accept_scale,
    "accept-scale-random": render_accept_scale,
    "accept-scale-matrix": render_accept_scale_matrix,
    "bench": render_bench,
    "batch": render_batch,
    "ingest": lambda doc: render_rates(doc, "accepted by each contender"),
    "peers": lambda doc: render_rates(doc, "delivered by each contender"),
    "reconcile": render_reconcile,
    "resolve": render_resolve,
    "logcost": render_logcost,
    "sweep-explain": render_sweep_explain,
    "pipeline": render_pipeline,
    "chaos": render_chaos,
    "chaos-http": render_chaos_http,
    "kill9": render_kill9,
    "soak": render_soak,
    "http": render_bench,
    "status": render_bench,
    "kill9-http": render_kill9_http,
    "http-target": render_http_target,
    "pg-target": render_pg_target,
    "delivery-floor": render_delivery_floor,
    "delivery-scale": render_delivery_scale,
    "webhook-floor": render_webhook_floor,
    "startup": render_startup,
    "kill9-http-target": render_kill9,
    "kill9-http-dedupe": render_kill9_settled,
    "kill9-pg-table": render_kill9_settled,
    "kill9-settle": render_kill9_settled,
    "spin": render_spin,
    "spin-deep": render_spin_deep,
    "failover": render_failover,
    "forget": render_forget,
}


def render_stop_moments(_: str) -> str:
    """Every recorded stop-moment run (before and after a change), one row each."""
    docs = all_results("stop-moments", ROOT / "bench" / "results")
    if not docs:
        raise PluginError("gen:stop-moments: no bench/results/stop-moments-*.json file")
    rows = ["| code measured | stops | store write-locked | second worker refused in < 5 s | "
            "second worker, median | source |", "|---|---|---|---|---|---|"]
    return "\n".join([provenance(docs[-1]), "", *rows,
                      *(render_stop_moment_run(d) for d in docs)])


def render_results(arg: str) -> str:
    kind, _, backend = arg.partition(" ")
    if kind not in RENDERERS:
        raise PluginError(f"gen:results: unknown kind {kind!r}")
    directory = ROOT / "bench" / "results"
    docs = [d for d in all_results(kind, directory) if not backend or d.get("backend") == backend]
    if not docs:
        return (f"!!! note \"No recorded run yet\"\n    No `bench/results/{kind}-*.json` file"
                f"{' for ' + backend if backend else ''} is in the repository yet: the "
                f"command above writes one.")
    return RENDERERS[kind](docs[-1])


def render_figure(arg: str) -> str:
    """``KIND KEY [FORMAT]``: one value of the latest ``KIND`` results file, ``KEY`` a
    dotted path into it (``spent.INSERT``), written with ``FORMAT`` (a format spec:
    ``.2f``, ``,.0f``, ``.0%``; default ``.2f``).  A missing file, key or number fails the
    build: a sentence never cites a figure that is not measured."""
    parts = arg.split()
    if len(parts) not in (2, 3):
        raise PluginError(f"gen:figure: expected KIND KEY [FORMAT], got {arg!r}")
    kind, key = parts[:2]
    spec = parts[2] if len(parts) == 3 else ".2f"
    docs = all_results(kind, ROOT / "bench" / "results")
    if not docs:
        raise PluginError(f"gen:figure: no bench/results/{kind}-*.json file")
    value: Any = docs[-1]
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise PluginError(f"gen:figure: {docs[-1]['file']} has no {key!r}")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PluginError(f"gen:figure: {docs[-1]['file']}: {key!r} is not a number")
    try:
        return format(value, spec)
    except ValueError as exc:
        raise PluginError(f"gen:figure: format {spec!r}: {exc}") from None
