"""The kinds of failure a record keeps (``last_failure``, schema v17) and logs (issue 29):
what a failed request did, so that an operator can tell a refused connection from a 500
or a timeout.  Plain data, light to import: the store writes the kinds runner records
itself (``recovered``, ``requeued``), the port classifies an adapter's errors
(``runner.leads.port.describe_failure``)."""

from __future__ import annotations

from collections.abc import Mapping

#: what a failed request did, as kept with a record (``last_failure``) and logged
#: (``reason``): the kinds an adapter may set on a ``TargetError`` (``failure``), and the
#: ones runner itself records
FAILURES: Mapping[str, str] = {
    # nothing was sent: the record is failed_safe, due again on the backoff schedule
    "not_sent": "not sent",
    "refused": "connection refused or failed before sending",
    "rate_limited": "rate limited",
    "rejected": "rejected by the target",
    "stale_mark": "refused by the target: it holds a newer batch of this store (issue 30)",
    "foreign_mark": "refused by the target: it belongs to another store (issue 30)",
    # the request may have been applied: the record is uncertain
    "ambiguous": "may have been applied",
    "timed_out": "timed out after sending",
    "server_error": "the target answered with a server error",
    "dropped": "the connection dropped after sending",
    "malformed": "the target's answer is not what the protocol says",
    "failed": "failed",
    "unproven": "written, but the readback failed",
    "readback": "written, but the readback does not show exactly this record",
    # runner's own
    "stopped": "the worker stopped while the request was out",
    "recovered": "in flight when the worker stopped: the request may have been sent",
    "requeued": "sent again: the target deduplicates by write_id and holds no row",
    "read_failed": "the read failed",
}
