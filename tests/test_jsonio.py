from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.errors import BadInputError
from runner.jsonio import MAX_DOCUMENT_BYTES, canonical, parse_json, parse_object
from tests.helpers import event, last_json, run_main, write_json


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{", "invalid_json"),
        (b"", "invalid_json"),
        (b'{"a": 1, "a": 2}', "invalid_json"),
        (b'{"a": NaN}', "invalid_json"),
        (b'{"a": Infinity}', "invalid_json"),
        (b'{"a": 1e400}', "invalid_json"),  # overflows to infinity
        (b'{"a": -1e400}', "invalid_json"),
        (b'{"a": ' + b"1" * 5000 + b"}", "invalid_json"),  # past Python's int limit
        (b'{"a": "\xff"}', "invalid_json"),
        (b'{"a": "\\ud800"}', "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b'"text"', "not_an_object"),
        (b"null", "not_an_object"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "invalid_json"),
        (b'{"a": "' + b"x" * MAX_DOCUMENT_BYTES + b'"}', "too_large"),
    ],
)
def test_strict_parse_rejects(data: bytes, reason: str) -> None:
    with pytest.raises(BadInputError) as info:
        parse_object(data)
    assert info.value.reason == reason


def test_canonical_is_sorted_compact_utf8() -> None:
    assert canonical({"b": 1, "a": "é", "c": True}) == '{"a":"é","b":1,"c":true}'
    assert canonical(parse_json(b'{ "b" : 1,\n "a": "\\u00e9" , "c": true }')) == (
        '{"a":"é","b":1,"c":true}'
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_canonical_round_trips(value: object) -> None:
    text = canonical(value)
    assert canonical(parse_json(text.encode("utf-8", "surrogatepass"))) == text


def test_out_of_range_numbers_are_rejected_through_the_cli_without_a_traceback(
    workdir: Path, scope_file: Path
) -> None:
    """Found by the issue 8 fuzz: these used to escape as a raw ValueError (exit 1)."""
    db, target = workdir / "q.db", workdir / "t.db"
    huge = workdir / "huge.json"
    huge.write_bytes(b'{"source_lead_id": ' + b"9" * 5000 + b"}")
    proc = run_main("accept", "--db", db, "--scope", scope_file, "--record", huge)
    assert proc.returncode == 65 and "Traceback" not in proc.stderr
    assert last_json(proc.stdout)["reason"] == "invalid_json" and not db.exists()
    rec = write_json(workdir / "e.json", event(1))
    assert run_main("accept", "--db", db, "--scope", scope_file, "--record", rec).returncode == 0
    assert run_main("once", "--db", db, "--scope", scope_file, "--target", target
                   ).returncode == 0
    snap = workdir / "snap.json"
    snap.write_bytes(b'{"status": 1e400}')
    proc = run_main("observe", "--db", db, "--scope", scope_file, "--record", rec,
                   "--snapshot", snap)
    assert proc.returncode == 65, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
