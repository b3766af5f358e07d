"""Bounds and defaults that commands check before any heavy module is imported."""

DEFAULT_POLL_LIMIT = 100

#: the SQLite page cache of a background task's own store connection (each pipeline
#: worker and the sweep open one), in KiB.  The lead cycle's connection keeps the
#: adapter's larger default (32 MiB, for the random write_id index of a large inbox); a
#: page cache fills as the store grows and is never given back, so with four pipeline
#: workers at the default a long run's worker held up to 6 x 32 MiB of cached pages.
#: Bounded so: 32 MiB (lead cycle) + 5 x 4 MiB (background) + 2 MiB (dispatch thread).
BACKGROUND_CACHE_KIB = 4 * 1024
POLL_LIMIT_RANGE = (1, 1000)

#: records per target request in a dispatch (issue 16); 1 sends one record per request
#: (the behaviour before batching).  The default is chosen from ``python -m bench batch``
#: (docs/explanation/batching.md says how); the largest is the reference server's
#: (``runner.io.targets.server.MAX_ROWS``, a test keeps them equal)
DEFAULT_BATCH_SIZE = 1000
BATCH_SIZE_RANGE = (1, 5000)

#: the longest reason a failed_safe record keeps (``last_error``, v13: the target's reason
#: for refusing its write, HTTP 400/422), in characters; longer ones are cut
MAX_LAST_ERROR = 300

#: how many uncertain records ``status`` shows, oldest (first accepted) first, and the most
#: a caller may ask for: the document stays small whatever the store's size (issue 21);
#: every record is ``status --records``
UNCERTAIN_SHOWN = 100
MAX_SHOWN = 10_000

#: seconds ``start``, ``worker`` and ``job`` wait for a lost store before they give up
#: (``--reconnect-max``; issue 30: ``runner.tasks.reconnect``)
DEFAULT_RECONNECT_MAX = 300.0
