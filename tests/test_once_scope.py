"""``once`` and ``start`` check their scope against the store's pin without validating a
scope equal to it again (``runner.storedata.GivenScope``): the pinned scope was validated
when it was pinned.  Every other scope is judged as before: an invalid one is refused as
invalid (exit 65) before it is compared, another valid one is refused as another scope
(exit 78), and neither changes the store nor, for a store not made yet, creates one."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import DurableWorker
from runner.errors import BadInputError
from runner.storedata import GivenScope
from tests.helpers import (
    SCOPE,
    dump_store,
    event,
    last_json,
    run_main,
    store_exists,
    write_json,
)


def once(db: str, scope: Path, target: Path) -> tuple[int, str, str]:
    proc = run_main("once", "--db", db, "--scope", scope, "--target", target)
    return proc.returncode, proc.stdout, proc.stderr


def _accepted(workdir: Path, db: str, scope_file: Path) -> None:
    rec = write_json(workdir / "e.json", event(1))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec
                    ).returncode == 0


def test_the_pinned_scope_in_another_key_order_delivers(
        workdir: Path, db_location: str, scope_file: Path) -> None:
    _accepted(workdir, db_location, scope_file)
    reordered = write_json(workdir / "reordered.json", dict(reversed(list(SCOPE.items()))))
    code, out, err = once(db_location, reordered, workdir / "t.db")
    assert code == 0, err
    assert last_json(out)["confirmed"] == 1


@pytest.mark.parametrize(("change", "code", "words"), [
    ({"form_id": ""}, 65, "invalid scope"),
    ({"form_id": 7}, 65, "invalid scope"),
    ({"extra": "x"}, 65, "invalid scope"),
    ({"page_id": "page-\u0000"}, 65, "invalid scope"),
    ({"page_id": "page-2"}, 78, "pinned to another scope"),
])
def test_a_scope_other_than_the_pinned_one_is_judged_as_before(
        workdir: Path, db_location: str, scope_file: Path,
        change: dict[str, object], code: int, words: str) -> None:
    _accepted(workdir, db_location, scope_file)
    before = dump_store(db_location)
    other = write_json(workdir / "other.json", {**SCOPE, **change})
    got, out, err = once(db_location, other, workdir / "t.db")
    assert got == code, err
    assert words in err
    if code == 65:
        assert last_json(out)["reason"] == "invalid_scope"
    assert dump_store(db_location) == before


def test_an_invalid_scope_creates_no_store(workdir: Path, missing_location: str) -> None:
    bad = write_json(workdir / "bad.json", {**SCOPE, "form_id": ""})
    code, _, err = once(missing_location, bad, workdir / "t.db")
    assert code == 65, err
    assert not store_exists(missing_location)


async def test_a_given_scope_is_validated_before_it_is_pinned(workdir: Path) -> None:
    db = str(workdir / "new.db")
    with pytest.raises(BadInputError) as info:
        async with DurableWorker(db, GivenScope({**SCOPE, "form_id": ""})):
            pass
    assert info.value.reason == "invalid_scope"
    async with DurableWorker(db, GivenScope(dict(SCOPE))) as worker:
        assert (await worker.store.summary()).scope == SCOPE
        assert worker.scope.model_dump() == SCOPE
        result = await worker.accept(event(1))
    assert result.result == "accepted"
