"""What a soak run (``bench/soak.py``) records and how it is judged: each sample, the
ceilings no sample may pass (``CEILINGS``), the store's growth per lead, the report (the
results file's content) and its summary lines."""

from __future__ import annotations

from dataclasses import dataclass, field

#: the ceilings a sample may not pass (any sample, any worker life)
CEILINGS = {
    "rss_mib": 160.0,        # the worker's resident set
    "open_files": 64,        # its open file descriptors
    "wal_mib": 64.0,         # SQLite's -wal file
    "store_growth_kib_per_lead": 4.0,  # with retention on (see above)
}
#: the growth ceiling applies once this many leads came in after its first sample
PER_LEAD_FROM = 1000


@dataclass
class Sample:
    t: float
    life: int
    rss_mib: float
    open_files: int
    wal_mib: float
    store_mib: float
    outbox_rows: int
    leads: int
    stderr_mib: float
    pipeline_rows: int = 0


@dataclass
class Report:
    backend: str
    minutes: float
    quick: bool
    rate: float
    churn: float
    kill_every: float
    retention: bool
    started_at: str = ""
    machine: str = ""
    ceilings: dict[str, float] = field(default_factory=lambda: dict(CEILINGS))
    samples: list[Sample] = field(default_factory=list)
    kills: int = 0
    accepted: int = 0
    confirmed: int = 0
    uncertain: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    exports: int = 0
    exported_events: int = 0
    pruned_events: int = 0
    export_gaps: int = 0
    pipeline_keep: str = ""
    pipeline_prunes: int = 0
    pipeline_removed: dict[str, int] = field(default_factory=dict)
    pipeline_rows_at_end: int = 0
    pipeline_prune_seconds_max: float = 0.0
    store_kib_per_lead: float = 0.0
    store_growth_kib_per_lead: float | None = None
    pg_vacuum: bool = False
    #: PostgreSQL: each table's size at the end (MiB: heap with TOAST, its indexes; live
    #: and dead rows), to tell kept rows from bloat when the store grows
    relation_sizes: dict[str, dict[str, float]] = field(default_factory=dict)
    outbox_rows_at_end: int = 0
    outbox_last_seq: int = 0
    store_mib_at_end: float = 0.0
    stderr_mib_per_min: float = 0.0
    violations: list[str] = field(default_factory=list)
    ok: bool = False


def growth_per_lead(samples: list[Sample], after: float) -> float | None:
    """KiB of store per lead accepted between the first sample at or past ``after``
    seconds and the last one; None with fewer than ``PER_LEAD_FROM`` leads between."""
    first = next((s for s in samples if s.t >= after), None)
    last = samples[-1] if samples else None
    if first is None or last is None or last.leads - first.leads < PER_LEAD_FROM:
        return None
    return round((last.store_mib - first.store_mib) * 1024 / (last.leads - first.leads), 2)


def summary(report: Report) -> str:
    lives: dict[int, float] = {}
    for s in report.samples:
        lives[s.life] = max(lives.get(s.life, 0.0), s.rss_mib)
    first = report.samples[0] if report.samples else None
    last = report.samples[-1] if report.samples else None
    lines = [
        f"soak ({report.backend}, {report.minutes:g} min, {report.rate:g} leads/s, "
        f"{report.churn:g} status changes/s, kill -9 every {report.kill_every:g} s, "
        f"retention {'on' if report.retention else 'off'})",
        f"  accepted {report.accepted}  confirmed {report.confirmed}  uncertain "
        f"{report.uncertain}  lost {report.lost}  duplicated {report.duplicated}  "
        f"unexpected {report.unexpected}  kills {report.kills}",
        "  peak RSS per worker life (MiB): "
        + " ".join(f"{v:.0f}" for v in lives.values()),
        f"  max RSS {max((s.rss_mib for s in report.samples), default=0):.1f} MiB, "
        f"max open files {max((s.open_files for s in report.samples), default=0)}, "
        f"max WAL {max((s.wal_mib for s in report.samples), default=0):.1f} MiB",
    ]
    if first and last:
        lines.append(f"  store {first.store_mib:.1f} -> {last.store_mib:.1f} MiB; outbox rows "
                     f"{first.outbox_rows} -> {last.outbox_rows} (last seq "
                     f"{report.outbox_last_seq}); stderr {report.stderr_mib_per_min:.3f} "
                     f"MiB/min")
        if report.accepted:
            lines.append(f"  store per accepted lead: "
                         f"{last.store_mib * (1 << 20) / report.accepted / 1024:.2f} KiB; "
                         f"growth per lead after the first third: "
                         f"{report.store_growth_kib_per_lead} KiB"
                         f"{' (VACUUM after each retention pass)' if report.pg_vacuum else ''}")
    if report.retention:
        lines.append(f"  exports {report.exports} ({report.exported_events} events, "
                     f"{report.export_gaps} gaps), pruned {report.pruned_events}")
        lines.append(f"  pipeline prunes {report.pipeline_prunes} (--before "
                     f"{report.pipeline_keep}, the longest "
                     f"{report.pipeline_prune_seconds_max:.1f} s): removed "
                     f"{report.pipeline_removed}; "
                     f"pipeline rows at the end {report.pipeline_rows_at_end}")
    for name, size in list(report.relation_sizes.items())[:8]:
        lines.append(f"  {name}: heap {size['heap_mib']:.1f} MiB, indexes "
                     f"{size['index_mib']:.1f} MiB, rows {size['live_rows']:.0f} live / "
                     f"{size['dead_rows']:.0f} dead")
    lines += [f"  VIOLATION {v}" for v in report.violations]
    lines.append(f"result: {'PASS' if report.ok else 'FAIL'}")
    return "\n".join(lines)
