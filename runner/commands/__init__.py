"""Command handlers, one module per concern; each module has ``register(sub)``.

Handlers parse files, open the store, call the library and print one JSON line; they
return an exit code and raise ``RunnerError`` for ``runner.cli.main`` to map.
"""
