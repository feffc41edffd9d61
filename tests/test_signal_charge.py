"""A signal never splits a charge (privacy/critical.py): SIGTERM / SIGINT raised INSIDE a
charge — between two silos' ledger-file appends, between the ledgers and the store — is
raised only after the whole charge is recorded, so the store and the ledger files agree.
Deterministic: the signal is sent by the process to itself from a patched step of the
charge; no sleeps, no timing."""

from __future__ import annotations

import os
import signal
import threading
import traceback

import dp_accounting as dpa
import pytest

from silofl.experiments.signals import Terminated, terminate_as_interrupt
from silofl.privacy import critical
from silofl.privacy import ledger as ledger_mod
from silofl.privacy.budget import BudgetStore
from silofl.privacy.critical import deferred_signals
from silofl.privacy.ledger import charge_all
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import open_job
from silofl.runtime.plan import SiloPlan
from silofl.training import histograms

SILOS = ["A", "B", "C"]
STEP = dpa.GaussianDpEvent(5.0)


@pytest.fixture
def job(tmp_path):
    """A reserved job of 10 rounds on 3 silos, with ledger files, in a store on disk."""
    store = BudgetStore(tmp_path / "budget.sqlite")
    t = PrivacyTarget(50.0, 1e-5)
    plans = {"local": [SiloPlan(n, 100, 0.1, 1, t, 5.0,
                                declared=dpa.SelfComposedDpEvent(STEP, 10)) for n in SILOS]}
    j = open_job(store, plans, lifetime={n: t for n in SILOS}, command="test",
                 noise="seeded", accountant="rdp")
    leds = j.ledgers("local", tmp_path / "ledgers")
    yield j, leds
    store.close()


def _lines(leds) -> dict[str, int]:
    return {led.silo: len(led.path.read_text().splitlines()) if led.path.exists() else 0
            for led in leds}


def _progress(j) -> dict[str, int]:
    out = dict.fromkeys(SILOS, 0)
    for c in j.store.progress(j.run_id):
        out[c.silo] += c.count
    return out


def _charged(j) -> dict[str, int]:
    """Per silo, what the store settled the run to (after `settle`)."""
    return {n: sum(c["count"] for c in j.store.charges(n) if c["run"] == j.run_id)
            for n in SILOS}


def _raised_at_section_end(exc: BaseException) -> bool:
    """Was `exc` raised by the outermost section's exit (the deferred delivery)?"""
    return any(fr.name == "__exit__" and fr.filename.endswith("critical.py")
               for fr in traceback.extract_tb(exc.__traceback__))


def _kill_self(signum: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), signum)


def test_sigterm_between_two_silos_ledger_appends_waits_for_the_round(job, monkeypatch):
    j, leds = job
    charge_all(leds, [STEP] * 3, round=0, label="dpsgd")
    appends = []
    real_open = open

    def open_and_kill_after_the_first_append(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if mode == "a":
            appends.append(path)
            if len(appends) == 1:  # silo A's line is being written, B's and C's not yet
                _kill_self()
        return f
    monkeypatch.setattr(ledger_mod, "open", open_and_kill_after_the_first_append,
                        raising=False)
    with terminate_as_interrupt(), pytest.raises(Terminated) as ei:
        charge_all(leds, [STEP] * 3, round=1, label="dpsgd")
    assert len(appends) == 3  # every silo's append ran before the exception
    assert _raised_at_section_end(ei.value)
    assert _lines(leds) == _progress(j) == dict.fromkeys(SILOS, 2)
    j.settle("interrupted")  # what the job's `except KeyboardInterrupt` does
    assert _charged(j) == _lines(leds) == dict.fromkeys(SILOS, 2)


def test_sigterm_between_the_ledgers_and_the_store_waits_for_the_store(job, monkeypatch):
    j, leds = job
    real = j.store.record_progress

    def kill_then_record(run_id, rows):
        _kill_self()  # the ledgers hold the round, the store not yet
        real(run_id, rows)
    monkeypatch.setattr(j.store, "record_progress", kill_then_record)
    with terminate_as_interrupt(), pytest.raises(Terminated) as ei:
        charge_all(leds, [STEP] * 3, round=0, label="dpsgd")
    assert _raised_at_section_end(ei.value)
    assert _lines(leds) == _progress(j) == dict.fromkeys(SILOS, 1)
    j.settle("interrupted")
    assert _charged(j) == _lines(leds) == dict.fromkeys(SILOS, 1)


def test_one_ledgers_own_charge_is_whole_store_memory_and_file(job, monkeypatch):
    """`Ledger.charge` alone (its hook records the store first, then the file)."""
    j, leds = job
    real = j.store.record_progress

    def record_then_kill(run_id, rows):
        real(run_id, rows)
        _kill_self()  # the store holds the charge, the ledger file not yet
    monkeypatch.setattr(j.store, "record_progress", record_then_kill)
    with terminate_as_interrupt(), pytest.raises(Terminated):
        leds[1].charge(STEP, round=0, label="dpsgd")
    assert _lines(leds) == _progress(j) == {"A": 0, "B": 1, "C": 0}
    assert len(leds[1].entries) == 1


def test_the_gbdt_charge_of_all_silos_is_one_section(job, monkeypatch):
    """`training.histograms.charge_all` (one ledger after another): SIGTERM after the first
    silo's charge still lets the others be charged, then raises."""
    j, leds = job
    real = j.store.record_progress
    calls = []

    def record_and_kill_once(run_id, rows):
        real(run_id, rows)
        calls.append(rows)
        if len(calls) == 1:
            _kill_self()
    monkeypatch.setattr(j.store, "record_progress", record_and_kill_once)
    with terminate_as_interrupt(), pytest.raises(Terminated) as ei:
        histograms.charge_all(leds, [STEP] * 3, round=0, label="tree")
    assert _raised_at_section_end(ei.value)
    assert len(calls) == 3 and _lines(leds) == _progress(j) == dict.fromkeys(SILOS, 1)


def test_sigint_is_deferred_too_and_nested_sections_deliver_at_the_outermost():
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is handled by the test runner here")
    done = []
    with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt) as ei:
        with deferred_signals():
            with deferred_signals():
                _kill_self(signal.SIGINT)
                done.append("inner body")
            done.append("after the inner section")
            assert critical.active()
        done.append("after the outer section")  # never: the interrupt is raised at its end
    assert type(ei.value) is KeyboardInterrupt and _raised_at_section_end(ei.value)
    assert done == ["inner body", "after the inner section"]
    assert not critical.active()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_outside_a_section_the_signal_acts_at_once_and_leaves_nothing_pending():
    with terminate_as_interrupt():
        with pytest.raises(Terminated) as ei:
            _kill_self()
            for _ in range(1000):  # the handler runs at the next bytecode boundary
                pass
        assert not _raised_at_section_end(ei.value)
        with deferred_signals():  # nothing older is delivered here
            pass


def test_an_error_inside_a_section_does_not_lose_the_deferred_signal():
    with terminate_as_interrupt(), pytest.raises(Terminated) as ei:
        with deferred_signals():
            _kill_self()
            raise ValueError("the charge failed")
    assert isinstance(ei.value.__context__, ValueError)


def test_a_section_in_another_thread_defers_nothing():
    seen = []

    def body():
        with deferred_signals():
            seen.append(critical.active())  # the main thread is not in a section
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [False] and not critical.active()
