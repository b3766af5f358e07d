"""The raw retriever's hot configuration (SPEC P7, P10).

The retriever re-reads its config file before every batch: an edit takes effect at the
next batch, without a restart.  A file that cannot be read, is not JSON or does not
validate leaves the *effective* configuration as it was and records the error; the
*desired* configuration is what the file says (``null`` when it is not even JSON).
``status`` shows the three, from the store, for whichever process runs the retriever.

The file is a JSON object, every field optional::

    {"batch_size": 100, "kinds": ["accepted", "state_changed", "status_changed"],
     "poll_interval": 1.0}
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from runner.errors import BadInputError
from runner.jsonio import MAX_DOCUMENT_BYTES, parse_object
from runner.leads.models import describe_validation_error
from runner.pipeline.model import WorkerConfigView
from runner.pipeline.stages.raw_ingestion import LEAD_KINDS, WORKER, IngestSettings

Kind = Annotated[StrictStr, Field(min_length=1, max_length=64)]


class RetrieverConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    batch_size: Annotated[int, Field(ge=1, le=10_000)] = 100
    kinds: Annotated[tuple[Kind, ...], Field(min_length=1, max_length=32)] = LEAD_KINDS
    poll_interval: Annotated[float, Field(gt=0, le=3600)] = 1.0

    @property
    def ingest(self) -> IngestSettings:
        return IngestSettings(self.batch_size, tuple(self.kinds))


def validate(doc: dict[str, Any], base: RetrieverConfig) -> RetrieverConfig:
    """``doc`` over ``base``; raises BadInputError with a one-line reason."""
    if isinstance(doc.get("kinds"), list):  # JSON has no tuples
        doc = {**doc, "kinds": tuple(doc["kinds"])}
    try:
        return RetrieverConfig.model_validate({**base.model_dump(), **doc})
    except ValidationError as exc:
        detail = describe_validation_error(exc)
        raise BadInputError(f"invalid retriever config: {detail}",
                            reason="invalid_config") from None


def read_bounded(path: str) -> bytes:
    """At most ``MAX_DOCUMENT_BYTES + 1`` bytes of a regular file (one byte more than a
    config may have, so that a larger one is refused as too large without being held in
    memory).  A device or a FIFO (``/dev/zero``, a pipe with no writer) is refused
    without blocking on it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return handle.read(MAX_DOCUMENT_BYTES + 1)


class HotConfig:
    """The desired and effective configuration of one raw retriever."""

    def __init__(self, path: str | None, base: RetrieverConfig) -> None:
        self.path = path
        self.base = base
        self.effective = base
        self.desired: Any = None
        self.error: str | None = None
        self._seen: bytes | None = None

    def reload(self) -> bool:
        """Re-read the file; True when what ``status`` shows changed."""
        if self.path is None:
            first = self._seen is None
            self._seen = b""
            return first
        try:
            data = read_bounded(self.path)
        except OSError as exc:
            return self._fail(b"", None, f"cannot read {self.path!r}: "
                                         f"{exc.strerror or exc}")
        if data == self._seen:
            return False
        try:
            doc = parse_object(data, what="retriever config")
        except BadInputError as exc:
            return self._fail(data, None, exc.message)
        try:
            config = validate(doc, self.base)
        except BadInputError as exc:
            return self._fail(data, doc, exc.message)
        self._seen, self.desired, self.effective, self.error = data, doc, config, None
        return True

    def _fail(self, data: bytes, desired: Any, error: str) -> bool:
        changed = (self._seen != data or self.error != error) or self._seen is None
        self._seen, self.desired, self.error = data, desired, error
        return changed

    def view(self, at: str) -> WorkerConfigView:
        return WorkerConfigView(WORKER, self.desired, self.effective.model_dump(mode="json"),
                                self.error, at)
