"""Django's SQLite backend, with this process's writers queued on a lock instead of in SQLite.

SQLite lets one writer in at a time. Writers that find the database locked wait in SQLite's busy
handler, which sleeps in growing steps (1, 2, 5, 10 … 100 ms) and polls, so under concurrent
runs (each records its start, its event batches and its end) a commit waits tens of milliseconds
after the lock is free, and the time to a stream's first event grows with the number of streams.
Here every transaction this process opens (``BEGIN IMMEDIATE``, see the settings) first takes a
process-wide lock, released when it commits, rolls back or its connection closes: writers in
this process are served in turn the moment the previous one ends. Another process (a second
server, ``manage.py acp``) still meets SQLite's own locking and busy timeout, as before; if the
lock is not free within the busy timeout, the transaction goes ahead without it and SQLite
decides, as it would without this backend.
"""
from __future__ import annotations

import threading

from django.db.backends.sqlite3 import base

_WRITE_LOCK = threading.Lock()


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_write_lock = False

    def _start_transaction_under_autocommit(self) -> None:
        """Take the process's write lock, then ``BEGIN`` (one line: a framework hook)."""
        timeout = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
        self._holds_write_lock = _WRITE_LOCK.acquire(timeout=timeout)
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_write_lock()
            raise

    def _release_write_lock(self) -> None:
        if self._holds_write_lock:
            self._holds_write_lock = False
            _WRITE_LOCK.release()

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._release_write_lock()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release_write_lock()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._release_write_lock()
