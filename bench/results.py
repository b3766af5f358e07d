"""Machine-written figures: each full benchmark or reliability campaign writes one dated
JSON file here, and the documentation renders the latest file of each kind
(``docs/hooks.py``), so no figure on a page is ever typed by hand.

    bench/results/bench-<UTC>.json     python -m bench            (not with --quick)
    bench/results/batch-<UTC>.json     python -m bench batch      (not with --quick)
    bench/results/reconcile-<UTC>.json python -m bench reconcile  (not with --quick)
    bench/results/status-<UTC>.json    python -m bench status     (not with --quick)
    bench/results/resolve-<UTC>.json   python -m bench resolve    (not with --quick)
    bench/results/accept-scale[-matrix|-random]-<UTC>.json  python -m bench accept-scale
                                       [--matrix|--random-keys] (not with --quick)
    bench/results/sweep-explain-<UTC>.json  python bench/sweep.py --explain   (not --quick)
    bench/results/pipeline-<UTC>.json  python bench/pipeline.py   (not with --quick)
    bench/results/chaos-<UTC>.json     python bench/chaos.py ... --record
    bench/results/kill9-<UTC>.json     python bench/kill9.py ... --record
    bench/results/forget-<UTC>.json    python -m bench forget     (not with --quick)
    bench/results/delivery-floor-<UTC>.json  python -m bench delivery-floor (not --quick)
    bench/results/webhook-floor-<UTC>.json   python -m bench webhook-floor  (not --quick)
    bench/results/startup-<UTC>.json   python -m bench startup    (not with --quick)

Every file carries ``kind``, ``date`` (UTC), the ``command`` that wrote it, and
``machine`` (CPUs, CPU model, Python, SQLite, platform, load average at the end).
Quick runs (CI) never write here: their sizes say nothing worth keeping.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """What the figures were measured on (they mean little without it)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def record(kind: str, payload: dict[str, Any], *, script: str,
           argv: Sequence[str] | None) -> Path:
    """Write ``payload`` as ``bench/results/<kind>-<UTC timestamp>.json``; returns the path."""
    now = datetime.now(UTC)
    args = list(sys.argv[1:] if argv is None else argv)
    doc = {"kind": kind, "date": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
           "command": " ".join(["python", script, *args]), "machine": machine_info(),
           **payload}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{kind}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"figures written to {path.relative_to(RESULTS.parent.parent)}", file=sys.stderr)
    return path


def latest(kind: str, directory: Path = RESULTS) -> dict[str, Any] | None:
    """The newest results file of ``kind`` (by the timestamp in its name), or None."""
    files = sorted(directory.glob(f"{kind}-2*.json"))
    if not files:
        return None
    doc: dict[str, Any] = json.loads(files[-1].read_text(encoding="utf-8"))
    doc["file"] = f"bench/results/{files[-1].name}"
    return doc
