"""No Python module of ours (``tests/ours.py``: ``runner/``, ``bench/``, ``harness/``,
``tests/``, ``model/``, ``docs/``, ``run.py``) is over 500 lines (issue 31, point 4): a
module that long holds more than one thing, and the remedy is to move a cohesive part
into a module of its own, not to squeeze lines."""

from __future__ import annotations

from pathlib import Path

from tests.ours import ROOT, our_modules

MAX_LINES = 500


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_no_module_of_ours_is_over_500_lines() -> None:
    long = sorted(((_lines(path), path.relative_to(ROOT).as_posix())
                   for path in our_modules().values()), reverse=True)
    over = [f"  {name}: {n} lines" for n, name in long if n > MAX_LINES]
    assert not over, (f"{len(over)} module(s) over {MAX_LINES} lines; split each along a "
                      "seam (a cohesive part into a module of its own):\n" + "\n".join(over))


def test_lines_are_counted_as_a_reader_sees_them(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_bytes(b"a = 1\n\nb = 2\n")
    assert _lines(source) == 3
    source.write_bytes(b"a = 1\nb = 2")  # no newline at the end: still two lines (wc -l: 1)
    assert _lines(source) == 2
