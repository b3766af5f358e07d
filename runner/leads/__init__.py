"""Lead delivery's rules (SPEC part L): the scope, event and CRM record models, the state
machine with its one table of transitions, durable intake, and the CRM target port with
its failure classification.  The tasks that run them on an interval are in
``runner.tasks``; the store operations in ``runner.io.engine``.

::

    models.py   Scope, LeadEvent, CRMRecord (pydantic)
    states.py   LeadState and the allowed transitions
    intake.py   validation, canonical JSON, group commit: accept answers after the commit
    port.py     the CRM target port: CRMAdapter, CRMRecordPort, BeforeWriteError, readback
    settings.py TargetSettings: what a command line gives a --target-adapter factory
"""
