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
    "TargetSettings",
]

if TYPE_CHECKING:
    from runner.errors import RunnerError
    from runner.leads.intake import AcceptResult
    from runner.leads.models import CRMRecord, LeadEvent, Scope
    from runner.leads.port import (
        BeforeWriteError,
        CRMAdapter,
        CRMRecordPort,
        Missing,
        ReadFailure,
        Snapshot,
        TargetRow,
    )
    from runner.leads.settings import TargetSettings
    from runner.leads.states import LeadState
    from runner.worker import DurableWorker

_WHERE = {
    "AcceptResult": "runner.leads.intake",
    "BeforeWriteError": "runner.leads.port",
    "CRMAdapter": "runner.leads.port",
    "CRMRecord": "runner.leads.models",
    "CRMRecordPort": "runner.leads.port",
    "Missing": "runner.leads.port",
    "ReadFailure": "runner.leads.port",
    "Snapshot": "runner.leads.port",
    "TargetRow": "runner.leads.port",
    "TargetSettings": "runner.leads.settings",
    "DurableWorker": "runner.worker",
    "LeadEvent": "runner.leads.models",
    "LeadState": "runner.leads.states",
    "RunnerError": "runner.errors",
    "Scope": "runner.leads.models",
}


__getattr__ = reexport(__name__, _WHERE)
