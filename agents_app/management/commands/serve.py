"""``manage.py serve``: migrate, load the default agents, ensure workspaces, run daphne."""
import gc
import os
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Migrate, load default agents and serve HTTP + WebSocket with daphne (default 127.0.0.1:8000)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-migrate", action="store_true")

    def handle(self, *args, host, port, no_migrate, **options):
        thresholds = gc_thresholds(settings.GC_THRESHOLDS)  # a bad value stops here, before any work
        if not no_migrate:
            call_command("migrate", interactive=False, verbosity=0)
            call_command("load_default_agents")
            call_command("load_providers", if_exists=True)
        # Runs left unfinished by a server that stopped execute nowhere: end them, expire their
        # pending confirmations (runs of other live servers keep their leases and are left alone).
        from asgiref.sync import async_to_sync

        from chat_app.services import run_reap_orphans

        reaped = async_to_sync(run_reap_orphans)()
        if reaped:
            self.stdout.write(f"Ended {reaped} run(s) left unfinished by a stopped server.")
        settings.WORKSPACES_ROOT.mkdir(parents=True, exist_ok=True)
        # The server opens connections per burst and closes them; this start-up one would stay
        # open for the life of the process (and keep SQLite from releasing closed ones' files).
        from django.db import connections

        connections.close_all()
        _freeze_startup_heap()
        if thresholds is not None:
            gc.set_threshold(*thresholds)
        from daphne.cli import CommandLineInterface

        self.stdout.write(f"Serving on http://{host}:{port}/ (HTTP + WebSocket, daphne)")
        sys.stdout.flush()
        CommandLineInterface().run(["-b", host, "-p", str(port), "--proxy-headers", settings.ASGI_APPLICATION.replace(".application", ":application")])


def _freeze_startup_heap() -> None:
    """Import what serving loads, then move every object alive now out of the collector's sight.

    Django, DRF, the SDKs and the project leave a few hundred thousand long-lived objects that
    every full collection would traverse again; under fifty concurrent streams those collections
    were ~20% of the server's GIL time (py-spy: time charged to whatever allocated when the
    collector ran). ``gc.freeze`` (CPython's advice for forking and long-running servers) keeps
    them out of collections; objects made later are collected as usual.
    """
    import importlib

    if os.environ.get("ORCH_GC_FREEZE", "1") == "0":
        return
    importlib.import_module(settings.ASGI_APPLICATION.rsplit(".", 1)[0])
    from agents_app.engines import engine_names, get_engine
    from chat_app.transports import dialect_names

    for name in engine_names():
        get_engine(name)
    dialect_names()
    gc.collect()
    gc.freeze()


def gc_thresholds(raw: str) -> tuple[int, int, int] | None:
    """``GC_THRESHOLDS`` as three non-negative integers (None: keep CPython's)."""
    text = (raw or "").strip().lower()
    if text in ("", "default"):
        return None
    parts = [part.strip() for part in text.split(",")]
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0:
        raise CommandError(f"GC_THRESHOLDS must be three non-negative integers like 5000,20,100 or 'default', not {raw!r}")
    return values  # type: ignore[return-value]
