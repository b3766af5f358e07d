"""Everything that touches the outside world: stores, the lock, targets, signals.

Only this package imports drivers and OS primitives (aiosqlite, asyncpg, sqlite3, fcntl).
"""
