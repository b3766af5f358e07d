from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runner.models import Scope
from runner.store import Store, open_store
from tests.helpers import SCOPE, write_json


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A private (0700) directory, as runner expects for its store."""
    d = tmp_path / "work"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    return d


@pytest.fixture
def scope() -> Scope:
    return Scope.model_validate(SCOPE)


@pytest.fixture
def scope_file(workdir: Path) -> Path:
    return write_json(workdir / "scope.json", SCOPE)


@pytest.fixture(params=["sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_location(backend: str, workdir: Path) -> str:
    """Where a fresh store lives, for each backend."""
    return str(workdir / "queue.db")


@pytest.fixture
async def store(db_location: str, scope: Scope) -> AsyncIterator[Store]:
    async with await open_store(db_location, scope=scope) as opened:
        yield opened
