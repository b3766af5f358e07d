"""The HTTP edge (SPEC E4): signed webhook intake, Prometheus metrics, health checks.

::

    auth.py      Meta's webhook handshake and ``X-Hub-Signature-256`` check (pure)
    app.py       the ASGI application: routes, limits, status codes (no server in it)
    metrics.py   the Prometheus registry: process counters and the store's figures
    server.py    uvicorn, bound to a socket runner opened, run from the runner's task group

Served by ``runner start --listen`` (from the task group that holds the worker lock and
runs the cycles) or by ``runner serve`` (intake and endpoints without the delivery loop).
Only this package imports the server and the metrics library; they load when a command
listens, never otherwise.
"""
