"""``manage.py serve``'s collector settings: GC_THRESHOLDS parsed, applied, and refused when bad."""
from __future__ import annotations

import gc

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agents_app.management.commands import serve


@pytest.mark.parametrize("raw, expected", [
    ("5000,20,100", (5000, 20, 100)),
    (" 700 , 10 , 10 ", (700, 10, 10)),
    ("default", None),
    ("", None),
])
def test_gc_thresholds_parse(raw, expected):
    assert serve.gc_thresholds(raw) == expected


@pytest.mark.parametrize("raw", ["1,2", "a,b,c", "1,2,3,4", "-1,10,10", "5000;20;100"])
def test_gc_thresholds_refuse_what_is_not_three_counts(raw):
    with pytest.raises(CommandError, match="GC_THRESHOLDS"):
        serve.gc_thresholds(raw)


def test_serve_refuses_bad_thresholds_before_doing_anything(settings, monkeypatch):
    settings.GC_THRESHOLDS = "many"
    monkeypatch.setattr(serve, "call_command", lambda *a, **k: pytest.fail("migrated despite a bad setting"))
    with pytest.raises(CommandError, match="GC_THRESHOLDS"):
        call_command("serve")


@pytest.mark.django_db
def test_serve_applies_the_thresholds_before_daphne_starts(settings, monkeypatch):
    settings.GC_THRESHOLDS = "4321,12,34"
    seen = {}
    before = gc.get_threshold()

    class Daphne:
        def run(self, argv):
            seen["threshold"] = gc.get_threshold()

    monkeypatch.setattr("daphne.cli.CommandLineInterface", Daphne)
    monkeypatch.setattr(serve, "_freeze_startup_heap", lambda: None)  # keep the test process's heap as it is
    try:
        call_command("serve", "--no-migrate")
    finally:
        gc.set_threshold(*before)
    assert seen["threshold"] == (4321, 12, 34)
