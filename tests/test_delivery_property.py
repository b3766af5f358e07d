"""Property (issue 3 point 10): whatever the target does on each send, across many records
and cycles, no key ever gets two target rows and no record ends in an illegal state."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner import DurableWorker
from runner.leads.states import LeadState
from tests import pg
from tests.fakes import BEHAVIOURS, ScriptedAdapter, sheet_rows
from tests.helpers import SCOPE, event, worker_records

#: examples per backend: a PostgreSQL example pays for a schema of its own (create,
#: migrate, drop), and the delivery logic under test is the same on both
EXAMPLES = {"sqlite": 40, "postgres": 20}  # (the README command's four minutes)


def test_never_two_rows_and_only_legal_states(backend: str) -> None:
    @settings(max_examples=EXAMPLES[backend], deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(
        n_records=st.integers(min_value=1, max_value=12),
        cycles=st.integers(min_value=1, max_value=5),
        behaviours=st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=80),
        read_failures=st.lists(st.booleans(), min_size=1, max_size=6),
    )
    def check(
        n_records: int, cycles: int, behaviours: list[str], read_failures: list[bool]
    ) -> None:
        schema = pg.new_schema()
        try:
            _scenario(backend, schema, n_records, cycles, behaviours, read_failures)
        finally:
            if backend == "postgres":
                pg.drop_later([schema])

    check()


def _scenario(
    backend: str, schema: str,
    n_records: int, cycles: int, behaviours: list[str], read_failures: list[bool]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o700)
        target = work / "target.db"
        script = iter(behaviours)
        adapter = ScriptedAdapter(target, lambda _w: next(script, "ok"))

        async def scenario() -> dict[str, dict]:
            db = str(work / "queue.db") if backend == "sqlite" else pg.location(schema)
            async with DurableWorker(db, SCOPE, adapter) as worker:
                for i in range(n_records):
                    await worker.accept(event(i))
                for c in range(cycles):
                    adapter.read_fails = read_failures[c % len(read_failures)]
                    await worker.run_cycle()
                return {r["source_lead_id"]: r for r in await worker_records(worker)}

        records = anyio.run(scenario)
        rows = Counter(r[4] for r in sheet_rows(target))

    assert len(records) == n_records  # nothing lost
    assert all(count == 1 for count in rows.values()), rows  # never two rows for a key
    for key, rec in records.items():
        state = LeadState(rec["state"])
        assert state is not LeadState.IN_FLIGHT  # every send's outcome was recorded
        if rows[key]:
            assert state in (LeadState.CONFIRMED, LeadState.UNCERTAIN), (key, state)
        if state is LeadState.CONFIRMED:
            assert rows[key] == 1
        if state is LeadState.PREPARED:
            assert rec["attempts"] == 0
    writes = Counter(adapter.writes)
    for rec in records.values():
        assert writes[rec["write_id"]] == rec["attempts"]  # every send was counted first
