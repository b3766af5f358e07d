"""The synthetic CRM target (SPEC L9): a SQLite file that behaves like a spreadsheet.

One sheet, exactly ``sheet(row_id INTEGER PRIMARY KEY, write_id, tenant, source,
source_lead_id, is_test, contact_alias, status TEXT NOT NULL DEFAULT 'new')``.  Like a
spreadsheet it does not deduplicate: appending the same record twice makes two rows.
Preventing that is the worker's job, and the tests count rows here to prove it.

Beside the sheet, ``target_meta`` holds the target's identity: a random ``target_id``
written once, in the transaction that creates the target.  A store pins it (like its
scope) and refuses any other target later (``runner.tasks.target``).  A sheet made before
identities existed gets one the first time a delivery run opens it for writes.

What may change a file, and when:

* reads (``read_back``, ``observe_status``, ``target_id``) never create or change a
  target: an absent or empty file is ``TargetAbsent``, and reads fail;
* only a write path (``prepare_writes(create=True)``, ``write``) creates a new target, in
  a private (0600) file made with ``O_EXCL``;
* a file that is not a target (not SQLite, or SQLite without a sheet of the target's
  shape) is refused *before* anything is opened for writing: it is only read, through a
  read-only connection (or ``immutable=1`` for a WAL file with no pending ``-wal``, so
  not even side files appear), and is left byte for byte as it was
  (``runner.io.synthetic_sheet``: the file's schema and ``inspect_target``).

Errors are translated at this edge.  A write is ``BeforeWriteError`` (nothing was sent)
when the target cannot be opened, or when its write lock cannot be taken: each write takes
the lock first (``BEGIN IMMEDIATE``), and until it holds it nothing of the row exists, so
a target that stays locked longer than the busy timeout is "not sent".  A failure after
the lock is taken (the insert, the commit) is ambiguous.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from runner import crashpoints
from runner.errors import (
    RunnerError,
    StoreError,
    TargetAbsent,
    TargetUnavailable,
)
from runner.io import fsguard
from runner.io.synthetic_sheet import (
    BUSY_TIMEOUT,
    MARK,
    META,
    SHEET,
    SHEET_INDEX,
    SHEET_KEY_INDEX,
    inspect_target,
    is_target,
    read_id,
)
from runner.leads.marks import NO_MARK, BatchMark, TargetMark, judge
from runner.leads.port import (
    AmbiguousWriteError,
    BeforeWriteError,
    Observation,
    TargetReadError,
    TargetRow,
    observe_rows,
)

if TYPE_CHECKING:
    from runner.leads.models import CRMRecord


def _as_bool(value: Any) -> Any:
    # SQLite has no boolean: 0/1 are the sheet's false/true; anything else stays as is,
    # so it can never compare equal to a mapped record by accident
    return bool(value) if value in (0, 1) and not isinstance(value, str) else value


_READ = ("SELECT write_id, tenant, source, source_lead_id, is_test, contact_alias, status "
         "FROM sheet")


def _row(row: Sequence[Any]) -> TargetRow:
    # the FIELDS, in order, as a literal: a batch's readback builds one per record
    return TargetRow(row[0], {"tenant": row[1], "source": row[2], "source_lead_id": row[3],
                              "is_test": _as_bool(row[4]), "contact_alias": row[5]}, row[6])


def _among(
    conn: sqlite3.Connection, select: str, write_ids: Sequence[str]
) -> Iterator[Sequence[Any]]:
    """The rows of ``select`` whose write_id is one of ``write_ids``, in sheet order
    within chunks of 500 (SQLite's bound on parameters)."""
    for start in range(0, len(write_ids), 500):
        chunk = list(write_ids[start : start + 500])
        marks = ",".join("?" * len(chunk))
        yield from conn.execute(f"{select} WHERE write_id IN ({marks}) ORDER BY row_id", chunk)


_INSERT = ("INSERT INTO sheet (write_id, tenant, source, source_lead_id, is_test, "
           "contact_alias)")
#: rows per multi-row insert (six parameters each: well within SQLite's bound)
_INSERT_CHUNK = 500


def _fresh(values: list[tuple[Any, ...]], held: set[str]) -> list[tuple[Any, ...]]:
    """The rows of ``values`` whose write_id (first column) is not held, the first of
    each write_id only."""
    fresh = []
    for row in values:
        if row[0] not in held:
            held.add(row[0])
            fresh.append(row)
    return fresh


def _insert_returning(conn: sqlite3.Connection, values: list[tuple[Any, ...]]
                      ) -> list[TargetRow]:
    """Insert ``values``, returning the rows as stored (``RETURNING``: SQLite 3.35+)."""
    made: list[TargetRow] = []
    for start in range(0, len(values), _INSERT_CHUNK):
        chunk = values[start : start + _INSERT_CHUNK]
        marks = ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
        made += [_row(row) for row in conn.execute(
            f"{_INSERT} VALUES {marks} RETURNING write_id, tenant, source, source_lead_id, "
            "is_test, contact_alias, status", [v for row in chunk for v in row])]
    return made


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, RunnerError) else str(exc)


def _held_mark(conn: sqlite3.Connection) -> TargetMark:
    has_mark = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                            "AND name = 'target_mark'").fetchone()
    if not has_mark:
        return NO_MARK
    row = conn.execute("SELECT owner, seq FROM target_mark").fetchone()
    return NO_MARK if row is None else TargetMark(str(row[0]), int(row[1]))


def _keep_mark(conn: sqlite3.Connection, mark: BatchMark, replaces: str | None
               ) -> TargetMark:
    """Judge ``mark`` against the mark held and keep it, inside the caller's write
    transaction; a refusal (or a failure) rolls it back: nothing of the request applied,
    so it is BeforeWriteError (StaleMark, ForeignMark, or a plain one)."""
    try:
        held = _held_mark(conn)
        judge(held, mark, replaces)
        if held is NO_MARK:
            conn.execute(MARK)
            conn.execute(SHEET_KEY_INDEX)
        conn.execute("INSERT OR REPLACE INTO target_mark (only_row, owner, seq) "
                     "VALUES (1, ?, ?)", (mark.store_id, mark.seq))
        return held
    except BeforeWriteError:
        _rollback_quietly(conn)
        raise
    except sqlite3.Error as exc:
        _rollback_quietly(conn)
        raise BeforeWriteError(f"target not written (its mark: {exc})") from None


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        # the transaction may be gone already; the original error is what matters
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


class SyntheticTarget:
    """A CRM adapter over a local SQLite file (blocking; runner calls it in a thread).

    ``busy_timeout`` (seconds) bounds every wait for the target's lock."""

    #: it keeps batch marks (SPEC E8): a store that forgot what it sent is caught here
    marks_batches = True

    def __init__(self, path: str, *, busy_timeout: float = BUSY_TIMEOUT) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._id: str | None = None
        self._mutex = threading.Lock()

    # -- opening ----------------------------------------------------------------------

    def _open(self, create: bool) -> sqlite3.Connection:
        """The connection; on first use, check the file before anything may change it.
        Without ``create`` nothing is created: an absent or empty file is TargetAbsent."""
        if self._conn is not None:
            return self._conn
        path = fsguard.check_target_path(self.path)
        found = inspect_target(path, self.busy_timeout)
        if found.kind != "target" and not create:
            what = "no target" if found.kind == "absent" else "an empty file, not a target"
            raise TargetAbsent(f"{what} at {self.path!r} (a target is never created here)")
        if found.kind == "absent":
            try:
                fsguard.create_private_file(path)
            except StoreError as exc:  # cannot create it (a read-only directory, …)
                raise TargetUnavailable(f"cannot create the target: {exc.message}") from None
        try:
            conn = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True,
                                   isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise TargetUnavailable(f"cannot open the target {self.path!r}: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # committed rows survive the death of any process (they are in the WAL file);
            # the synthetic target does not pay an fsync per row, as a remote CRM's
            # durability is not ours to pay for
            conn.execute("PRAGMA synchronous = NORMAL")
            self._id = read_id(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise TargetUnavailable(f"cannot open the target {self.path!r}: {exc}") from None
        self._conn = conn
        return conn

    def _ensure_identity(self, conn: sqlite3.Connection) -> None:
        """Make the sheet and the identity, once, in one transaction (two processes
        creating a target at once end with one identity)."""
        if self._id is not None:
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            shape = is_target(conn)
            if shape is False:  # changed under us since it was inspected
                raise TargetUnavailable(f"{self.path!r} is a SQLite database but not a target")
            conn.execute(SHEET)
            conn.execute(SHEET_INDEX)
            conn.execute(META)
            conn.execute("INSERT OR IGNORE INTO target_meta (key, value) "
                         "VALUES ('target_id', ?)", (uuid.uuid4().hex,))
            found = read_id(conn)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback_quietly(conn)
            raise TargetUnavailable(f"cannot set up the target {self.path!r}: {exc}") from None
        except BaseException:
            _rollback_quietly(conn)
            raise
        self._id = found

    def _connect(self, create: bool = True) -> sqlite3.Connection:
        """Open for writes: the target exists (created with ``create``) and has its
        identity.  Raises RunnerErrors (TargetAbsent, TargetUnavailable, UnsafeLocation)."""
        conn = self._open(create)
        self._ensure_identity(conn)
        return conn

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._id = None

    # -- the optional port methods: identity and the check before writes ----------------

    def target_id(self) -> str:
        """The target's identity, read without creating or changing anything."""
        with self._mutex:
            self._open(create=False)
            if self._id is None:
                raise TargetUnavailable(
                    f"the target {self.path!r} has no identity yet (it was made before "
                    "targets were pinned); a delivery run (once, start) gives it one")
            return self._id

    def prepare_writes(self, create: bool) -> None:
        """Check that writes can start: the target opens (created only with ``create``),
        has its identity, and can be written: its write lock is tried without waiting and
        released at once.  A lock that another writer holds right now is no reason to stop
        (a send then waits for it, and is "not sent" if it cannot take it in time); a
        target that refuses writes (a read-only file or filesystem) is."""
        with self._mutex:
            conn = self._connect(create)
            try:
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("ROLLBACK")
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            except sqlite3.OperationalError as exc:
                _rollback_quietly(conn)
                if "locked" in str(exc) or "busy" in str(exc):
                    return  # writable, busy now: the sends wait for it
                raise TargetUnavailable(f"the target {self.path!r} cannot be written: "
                                        f"{exc}") from None
            except sqlite3.Error as exc:
                _rollback_quietly(conn)
                raise TargetUnavailable(f"the target {self.path!r} cannot be written: "
                                        f"{exc}") from None

    # -- the port ---------------------------------------------------------------------

    def write(self, record: CRMRecord, write_id: str) -> None:
        with self._mutex:
            self._append([(record, write_id)])

    def write_batch(self, items: Sequence[tuple[CRMRecord, str]], *,
                    mark: BatchMark | None = None) -> None:
        """Append every row in one transaction: all of them or none (issue 16); with a
        ``mark``, only if the mark may apply (``runner.leads.marks.judge``: else
        StaleMark or ForeignMark, nothing applied), keeping it in the same transaction."""
        with self._mutex:
            self._append(items, mark=mark)
            crashpoints.hit("dispatch.batch-applied")

    # -- batch marks (SPEC E8, issue 30) ------------------------------------------------

    def read_mark(self) -> TargetMark:
        """The mark the target keeps (``NO_MARK`` before the first marked write)."""
        with self._mutex:
            try:
                return _held_mark(self._open(create=False))
            except (RunnerError, sqlite3.Error, OSError) as exc:
                raise TargetReadError(f"target mark read failed: {_message(exc)}") from None

    def raise_mark(self, mark: BatchMark, replaces: str | None = None) -> TargetMark:
        """The fence alone: keep ``mark`` if it may apply (an owner equal to ``replaces``
        is replaced), applying no row; the mark it replaced."""
        with self._mutex:
            return self._append([], mark=mark, replaces=replaces)[2]

    def read_by_keys(self, keys: Sequence[tuple[str, str]]) -> Sequence[TargetRow]:
        """Every row whose (tenant, source_lead_id) is one of ``keys``, whatever its
        write_id."""
        found: list[TargetRow] = []
        with self._mutex:
            try:
                conn = self._open(create=False)
                for start in range(0, len(keys), 400):
                    chunk = keys[start : start + 400]
                    pairs = ",".join(["(?, ?)"] * len(chunk))
                    found += [_row(row) for row in conn.execute(
                        f"{_READ} WHERE (tenant, source_lead_id) IN (VALUES {pairs}) "
                        "ORDER BY row_id", [v for key in chunk for v in key])]
            except (RunnerError, sqlite3.Error, OSError) as exc:
                raise TargetReadError(f"target read by key failed: {_message(exc)}") from None
        return found

    def write_batch_once(self, items: Sequence[tuple[CRMRecord, str]]
                         ) -> tuple[int, list[TargetRow]]:
        """Deduplicating by write_id (``runner target-serve --dedupe``, issue 29): append,
        in one transaction, only the rows whose write_id the sheet does not hold yet (the
        first of repeats within ``items``); returns how many rows it made, and every row
        the sheet holds for the write_ids of ``items`` once applied, as stored (the rows
        it held, read in the transaction, and the rows it made, as the insert returns
        them).  The transaction holds the sheet's write lock from the look-up to the
        commit, so concurrent calls (threads or processes) never both append one
        write_id.  Not the synthetic target's port: a spreadsheet does not deduplicate."""
        with self._mutex:
            made, rows, _ = self._append(items, once=True)
            return made, rows

    def _append(self, items: Sequence[tuple[CRMRecord, str]], *, once: bool = False,
                mark: BatchMark | None = None, replaces: str | None = None,
                ) -> tuple[int, list[TargetRow], TargetMark]:
        try:
            conn = self._connect()
        except (RunnerError, sqlite3.Error, OSError) as exc:
            raise BeforeWriteError(f"target unavailable: {_message(exc)}") from None
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            # the write lock was not taken: nothing of these rows reached the sheet
            _rollback_quietly(conn)
            raise BeforeWriteError(f"target not written (its lock: {exc})") from None
        # in this transaction; refused: nothing applied
        held = NO_MARK if mark is None else _keep_mark(conn, mark, replaces)
        try:
            values = [(write_id, record.tenant, record.source, record.source_lead_id,
                       int(record.is_test), record.contact_alias) for record, write_id in items]
            rows: list[TargetRow] = []
            if once:
                rows = [_row(row) for row in _among(
                    conn, _READ, list(dict.fromkeys(write_id for _, write_id in items)))]
                values = _fresh(values, {row.write_id for row in rows})
                rows += _insert_returning(conn, values)
            else:
                conn.executemany(f"{_INSERT} VALUES (?, ?, ?, ?, ?, ?)", values)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback_quietly(conn)
            raise AmbiguousWriteError(f"target write failed: {exc}") from None
        return len(values), rows, held

    def read_back(self, write_id: str) -> Sequence[TargetRow]:
        with self._mutex:
            try:
                rows = self._open(create=False).execute(
                    f"{_READ} WHERE write_id = ? ORDER BY row_id", (write_id,)).fetchall()
            except (RunnerError, sqlite3.Error, OSError) as exc:
                raise TargetReadError(f"target readback failed: {_message(exc)}") from None
        return [_row(row) for row in rows]

    def read_back_many(self, write_ids: Sequence[str]) -> Sequence[TargetRow]:
        """The rows of all these write_ids, in one call (a batch's exact readback)."""
        found: list[TargetRow] = []
        with self._mutex:
            try:
                for row in _among(self._open(create=False), _READ, write_ids):
                    found.append(_row(row))
                    if len(found) == 1 and len(write_ids) > 1:
                        crashpoints.hit("dispatch.batch-mid-readback")
            except (RunnerError, sqlite3.Error, OSError) as exc:
                raise TargetReadError(f"target readback failed: {_message(exc)}") from None
        return found

    def observe_status(self, write_ids: Sequence[str]) -> Mapping[str, Observation]:
        found: dict[str, list[str]] = {w: [] for w in write_ids}
        with self._mutex:
            try:
                for write_id, status in _among(self._open(create=False),
                                               "SELECT write_id, status FROM sheet", write_ids):
                    found[write_id].append(status)
            except (RunnerError, sqlite3.Error, OSError) as exc:
                raise TargetReadError(f"target status read failed: {_message(exc)}") from None
        return {write_id: observe_rows(statuses) for write_id, statuses in found.items()}
