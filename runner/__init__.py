"""runner: a crash-safe foreground worker whose external writes never happen twice.

The public library API (SPEC L14)::

    from runner import DurableWorker, Scope

Names are imported lazily so that ``runner status`` does not pay for what it does not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.lazy import reexport

__version__ = "0.1.0"

__all__ = [
    "AcceptResult",
    "BeforeWriteError",
    "CRMAdapter",
    "CRMRecord",
    "CRMRecordPort",
    "DurableWorker",
    "LeadEvent",
    "LeadState",
    "Missing",
    "ReadFailure",
    "RunnerError",
    "Scope",
    "Snapshot",
    "TargetRow",
]

if TYPE_CHECKING:
    from runner.errors import RunnerError
    from runner.intake import AcceptResult
    from runner.models import CRMRecord, LeadEvent, Scope
    from runner.port import (
        BeforeWriteError,
        CRMAdapter,
        CRMRecordPort,
        Missing,
        ReadFailure,
        Snapshot,
        TargetRow,
    )
    from runner.states import LeadState
    from runner.worker import DurableWorker

_WHERE = {
    "AcceptResult": "runner.intake",
    "BeforeWriteError": "runner.port",
    "CRMAdapter": "runner.port",
    "CRMRecord": "runner.models",
    "CRMRecordPort": "runner.port",
    "Missing": "runner.port",
    "ReadFailure": "runner.port",
    "Snapshot": "runner.port",
    "TargetRow": "runner.port",
    "DurableWorker": "runner.worker",
    "LeadEvent": "runner.models",
    "LeadState": "runner.states",
    "RunnerError": "runner.errors",
    "Scope": "runner.models",
}


__getattr__ = reexport(__name__, _WHERE)
