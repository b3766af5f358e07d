"""The parts of the documentation generated at build time (``docs/hooks.py`` replaces each
page's placeholder with one):

* ``reference``: from the code: the CLI, exit codes, crash points, transition tables,
  outbox kinds, the API, included files, the SPIN model's properties and steps;
* ``results``: the latest results file of a kind (``gen:results KIND``), rendered by
  ``performance`` (the benchmarks) or ``reliability`` (the campaigns, the model check);
* ``common``: what they share (table cells, numbers, where a figure comes from).
"""
