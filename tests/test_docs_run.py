"""Every shell block of the README, the tutorials and the how-to pages runs, in order, in
a private directory, and prints what the page shows (issue 31; the rules of comparison
are in ``tests.docrun``).  A page that drifts from the program fails here."""

from __future__ import annotations

import pytest
from sybil.example import SybilFailure

from tests.docrun import run_page

pytestmark = pytest.mark.timeout(120)

#: the pages whose blocks run, and the few blocks each may leave out (with the reason
#: the page gives in its ``skip`` directive)
PAGES = {
    "README.md": 3,
    "docs/tutorial/sqlite.md": 1,
    "docs/tutorial/postgresql.md": 1,
    "docs/how-to/candidates.md": 0,
    "docs/how-to/uncertain.md": 0,
    "docs/how-to/pipeline.md": 1,
    "docs/how-to/serve.md": 1,
    "docs/how-to/target-adapter.md": 1,
    "docs/how-to/postgresql-target.md": 2,
    "docs/how-to/high-availability.md": 1,
    "docs/how-to/operate.md": 1,
    "docs/how-to/postgresql.md": 3,
    "docs/reference/configuration.md": 0,
}
#: the page a reader follows first, where a page goes on from another: its set-up blocks
#: only (True), or all of it (False: the state it leaves is where the page starts)
AFTER = {"docs/tutorial/postgresql.md": ("docs/tutorial/sqlite.md", True),
         "docs/how-to/postgresql-target.md": ("docs/tutorial/sqlite.md", True),
         "docs/how-to/high-availability.md": ("docs/tutorial/sqlite.md", True),
         "docs/how-to/uncertain.md": ("docs/tutorial/sqlite.md", False),
         "docs/how-to/pipeline.md": ("docs/tutorial/sqlite.md", False)}
#: the pages that need the PostgreSQL server (``tests.pg``), and the schema each uses
PG_PAGES = {"docs/tutorial/postgresql.md": "tutorial",
            "docs/how-to/postgresql-target.md": "howto_target"}


# every page in the default run (the README's test command): a drifting page fails there
@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_block_of_the_page_prints_what_the_page_shows(page: str) -> None:
    if page in PG_PAGES:
        from tests import pg

        pg.require()
        pg.execute(f"DROP SCHEMA IF EXISTS {PG_PAGES[page]} CASCADE")  # a failed run's
    after, setup_only = AFTER.get(page, (None, True))
    try:
        skipped = run_page(page, after, setup_only=setup_only)
    except SybilFailure as failure:  # the page, the command and both outputs: no traceback
        pytest.fail(str(failure), pytrace=False)
    assert len(skipped) == PAGES[page], skipped
