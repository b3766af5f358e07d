"""MkDocs hook: the parts of the documentation that are generated at build time.

Why: a reference typed by hand drifts from the code, and a figure typed by hand drifts
from the measurement.  A page holds a placeholder, ``<!-- gen:NAME -->`` or
``<!-- gen:NAME ARG -->``, and this hook replaces it while the site is built:

* ``cli-commands``, ``cli COMMAND [SUBCOMMAND]``: from the argparse parsers
  (``runner.cli.build_parser``); the build fails if a command has no section;
* ``exit-codes``: from the error classes of ``runner/errors.py``;
* ``crash-points``: from ``runner/crashpoints.py``;
* ``lead-transitions``, ``candidate-transitions``: from the transition tables;
* ``outbox-kinds``: from the SQLite schema's outbox triggers;
* ``results KIND``: the latest machine-written results file ``bench/results/KIND-*.json``
  (``bench``, ``batch``, ``chaos``, ``pg-target`` …);
* ``figure KIND KEY [FORMAT]``: one number of that file (a dotted key, a format spec), for
  a sentence that cites a measurement;
* ``api DOTTED.NAME``: a class's signature, docstring and public methods;
* ``include FILE``: a file of the repository (the changelog);
* ``model-properties``, ``model-steps``: the SPIN model's named properties (from
  ``model/delivery.pml``) and its model-to-code table (``model/steps.toml``).

An unknown placeholder fails the build (``mkdocs build --strict`` fails on any error).
The generators are the package ``docs/gen/`` (``reference``: from the code; ``results``,
``performance``, ``reliability``: the measured figures); this hook maps each placeholder
to one.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the generators, imported now that the repository is on sys.path
from docs.gen import reference  # noqa: E402
from docs.gen.reference import (  # noqa: E402
    render_api,
    render_candidate_transitions,
    render_cli,
    render_cli_commands,
    render_crash_points,
    render_exit_codes,
    render_include,
    render_lead_transitions,
    render_model_properties,
    render_model_steps,
    render_outbox_kinds,
)
from docs.gen.results import render_figure, render_results, render_stop_moments  # noqa: E402

PLACEHOLDER = re.compile(r"<!-- gen:([\w-]+)(?: ([^>]*?))? -->")

GENERATORS: dict[str, Callable[[str], str]] = {
    "cli": render_cli,
    "cli-commands": render_cli_commands,
    "exit-codes": render_exit_codes,
    "crash-points": render_crash_points,
    "lead-transitions": render_lead_transitions,
    "candidate-transitions": render_candidate_transitions,
    "outbox-kinds": render_outbox_kinds,
    "results": render_results,
    "figure": render_figure,
    "stop-moments": render_stop_moments,
    "include": render_include,
    "api": render_api,
    "model-properties": render_model_properties,
    "model-steps": render_model_steps,
}


# -- MkDocs events ---------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        name, arg = match.group(1), (match.group(2) or "").strip()
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_path}: unknown placeholder gen:{name}")
        return GENERATORS[name](arg)

    shown = SKIP.sub(_shown_skip, PLACEHOLDER.sub(replace, markdown))
    return SAVE.sub(lambda m: f"*Save the next block as `{m.group(1)}`:*\n", shown)


#: a python or toml block the docs test saves as a file (``tests/docrun.py``): shown on the page
SAVE = re.compile(r"^<!-- save: ([\w.-]+) -->$", re.MULTILINE)
#: a block the docs test does not run (``tests/docrun.py``), and why: shown on the page
SKIP = re.compile(r'^<!-- skip: next "([^"]+)" -->$', re.MULTILINE)


def _shown_skip(match: re.Match[str]) -> str:
    return f"*(The docs test does not run the next block: {match.group(1)}.)*\n"


def on_post_build(config: Any) -> None:
    reference.check_cli_sections()
