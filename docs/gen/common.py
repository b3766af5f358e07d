"""What the generated parts of the documentation share: the repository's root, a table
cell's escaping, a number as the pages show it, where a measured figure comes from, and
the results files of a kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


def num(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def provenance(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    load = ", ".join(str(x) for x in m.get("load_average", []))
    return (f"Measured {doc['date']} by `{doc['command']}` on {m['cpus']} CPUs "
            f"({m['cpu_model'] or 'unknown model'}), Python {m['python']}, SQLite "
            f"{m['sqlite']}; load average at the end {load}. Source: `{doc['file']}`.")


def all_results(kind: str, directory: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(f"{kind}-2*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["file"] = f"bench/results/{path.name}"
        out.append(doc)
    return out
