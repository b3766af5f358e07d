"""A Store wrapper that fails its Nth operation (issue 8.4), for the I/O error countdown.

Every domain operation of the ``Store`` protocol counts, whatever its name (so operations
added later count too).  The Nth raises ``StoreError`` — the store's own error type, as a
real I/O error would be translated — either *before* the operation reaches the store
(nothing happened) or *after* it did (it committed, but the caller sees an error: the
worst case, an acknowledgement lost on the way back).  With ``only``, only the operation
of that name counts; ``fail_at=0`` never fails (it only counts, in ``names``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from runner.errors import StoreError
from runner.io.engine.delivery import loop_dispatch_steps

#: attributes that are not operations
PLAIN = frozenset({"backend", "scope", "path", "schema_version", "aclose", "__aenter__",
                   "__aexit__"})
#: operations that are context managers or async iterators: they fail on entry
ENTERED = frozenset({"reading", "worker_lock", "iter_records"})


class InjectedIOError(StoreError):
    pass


def attach(worker: Any, store: Any) -> None:
    """Make a not-yet-open ``DurableWorker`` use ``store`` (a wrapper) instead of opening
    its own: the library's code paths, over a store the test controls."""
    from runner.leads.intake import Intake

    worker._store = store
    worker._intake = Intake(store, worker.clock, worker.scope)


class CountdownStore:
    def __init__(self, inner: Any, fail_at: int, when: Literal["before", "after"],
                 only: str | None = None) -> None:
        self.inner, self.fail_at, self.when, self.only = inner, fail_at, when, only
        self.count = 0
        self.failed: str | None = None
        self.names: list[str] = []  # every operation counted, in order

    def _tick(self, name: str) -> bool:
        if self.only is not None and name != self.only:
            return False  # counting only one operation
        self.count += 1
        self.names.append(name)
        if self.count == self.fail_at:
            self.failed = name
            return True
        return False

    def _fail(self, name: str) -> InjectedIOError:
        return InjectedIOError(f"injected I/O error at operation {self.count} ({name})")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in PLAIN or name.startswith("_") or not callable(attr):
            return attr
        if name == "iter_records":
            return self._wrap_iter(name, attr)
        if name in ENTERED:
            return self._wrap_cm(name, attr)
        if inspect.iscoroutinefunction(attr):
            return self._wrap_op(name, attr)
        return attr

    def _wrap_op(self, name: str, op: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(op)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            fail = self._tick(name)
            if fail and self.when == "before":
                raise self._fail(name)
            result = await op(*args, **kwargs)
            if fail:
                raise self._fail(name)
            return result
        return wrapped

    def _wrap_cm(self, name: str, factory: Callable[..., Any]) -> Callable[..., Any]:
        @asynccontextmanager
        async def wrapped(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            if self._tick(name):
                raise self._fail(name)
            async with factory(*args, **kwargs) as value:
                yield value
        return wrapped

    def _wrap_iter(self, name: str, factory: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapped(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            if self._tick(name):
                raise self._fail(name)
            async for item in factory(*args, **kwargs):
                yield item
        return wrapped

    def dispatch_steps(self) -> Any:
        # dispatch's blocking steps come back to this wrapper's own finish_and_mark, so
        # the operations a dispatch run makes are counted (and failed) like any other
        return loop_dispatch_steps(self)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> CountdownStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
