"""Persons linked across silos from the config and the CLI (`experiments.linkage`,
`silofl persons`): the overlap histogram is reserved with the training, charged once per
silo before any person id is read, composed into σ, and only its noisy counts reach an
output; a bad key spends nothing; linked ULDP weights come from keyed pseudonyms."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.data.pseudonyms import KEY_ENV, LinkageKey, pseudonymize
from silofl.errors import ConfigError
from silofl.experiments import linkage
from silofl.experiments import run as run_mod
from silofl.privacy import events, overlap
from silofl.privacy.budget import BudgetStore
from silofl.privacy.ledger import tightest
from silofl.runtime import job as job_mod

ROOT = Path(__file__).resolve().parents[1] / "examples" / "ehr"
KEY = "0123456789abcdef0123456789abcdef"  # 32 bytes: a test key, never a real one


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)


def _raw(tmp_path: Path, key: bool = True, **privacy) -> dict:
    raw = tomllib.loads((ROOT / "ehr.toml").read_text())
    raw["data"].update(path=str(ROOT / "visits.csv"), schema=str(ROOT / "ehr_schema.toml"))
    raw["training"].update(rounds=2, methods=["fedavg"], seed=3)
    raw["privacy"].update(noise="seeded", persons_in_silos=2, **privacy)
    if key:
        (tmp_path / "link.key").write_text(KEY + "\n")
        raw["privacy"]["linkage_key_file"] = str(tmp_path / "link.key")
    raw["budget"] = {"store": str(tmp_path / "store.sqlite")}
    raw["output"] = {"dir": str(tmp_path / "runs")}
    return raw


def _exact(cfg) -> np.ndarray:
    """The exact histogram, computed here only to check that it never leaks."""
    raw = run_mod.build.apply_privacy(run_mod.build.load_raw(cfg.data), cfg)
    key = LinkageKey(KEY.encode())
    return overlap.histogram({s.name: pseudonymize(key, s.person_train) for s in raw.silos})


def test_the_release_is_reserved_first_and_charged_once_per_silo_before_ids_are_read(
        tmp_path, monkeypatch):
    order: list[tuple] = []
    ledgers: list = []
    reserve, spend = BudgetStore.reserve, job_mod.Job.spend_extra
    pseud, rel = linkage.pseudonymize, linkage.release_overlap

    def spy_reserve(self, run_id, planned, **kw):
        order.append(("reserve", sorted((c.silo, c.label) for c in planned)))
        return reserve(self, run_id, planned, **kw)

    def spy_spend(self, silo, label):
        order.append(("spend", silo, label))
        return spend(self, silo, label)

    def spy_pseud(key, ids):
        order.append(("read ids",))
        return pseud(key, ids)

    def spy_release(sets, leds, *a, **kw):
        ledgers.extend(leds)
        return rel(sets, leds, *a, **kw)
    monkeypatch.setattr(BudgetStore, "reserve", spy_reserve)
    monkeypatch.setattr(job_mod.Job, "spend_extra", spy_spend)
    monkeypatch.setattr(linkage, "pseudonymize", spy_pseud)
    monkeypatch.setattr(linkage, "release_overlap", spy_release)
    rep = run_mod.run(config_from_dict(_raw(tmp_path)))
    silos = rep.results[0].silos
    assert order[0][0] == "reserve"
    assert sorted((s, "overlap") for s in silos) == [x for x in order[0][1] if x[1] == "overlap"]
    first_read = order.index(("read ids",))
    spends = [o for o in order if o[0] == "spend"]
    assert sorted(o[1] for o in spends) == sorted(silos) and len(spends) == len(silos)
    assert all(order.index(o) < first_read for o in spends)  # every silo paid first
    assert sorted(led.silo for led in ledgers) == sorted(silos)
    for led in ledgers:  # ledger: exactly one overlap entry, the reserved Gaussian
        assert [e.label for e in led.entries] == ["overlap"]
        ev = led.entries[0].event
        assert ev.noise_multiplier == rep.linkage["overlap"]["noise_multiplier"]
    with BudgetStore(tmp_path / "store.sqlite") as st:
        for s in silos:
            got = [c for c in st.charges(s) if c["label"] == "overlap"]
            assert len(got) == 1 and got[0]["count"] == 1 and got[0]["status"] == "charged"


def test_training_sigma_is_calibrated_with_the_release_composed_in(tmp_path):
    with_key = run_mod._prepare(config_from_dict(_raw(tmp_path, overlap_epsilon=0.2)))
    without = run_mod._prepare(config_from_dict(_raw(tmp_path, key=False)))
    ev = overlap.overlap_event(with_key.link.noise_multiplier)
    for p, q in zip(with_key.plans[0], without.plans[0]):
        assert p.noise_multiplier > q.noise_multiplier  # the release costs training noise
        assert "overlap histogram" in p.calibrated_for
        job = events.compose(events.flatten(p.declared) + events.flatten(ev))
        eps = tightest(job, p.target.delta)[0]
        assert eps <= p.target.epsilon  # the whole job within the silo's target
        assert eps > 0.97 * p.target.epsilon  # ... and not wasted
    alone = tightest(ev, with_key.link.delta)[0]
    assert alone == pytest.approx(0.2, rel=0.02)  # the configured share


def test_the_noisy_column_appears_and_the_exact_counts_never_do(tmp_path):
    raw = _raw(tmp_path)
    cfg = config_from_dict(raw)
    cfg_file = tmp_path / "job.toml"
    cfg_file.write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["run", "-c", str(cfg_file), "-q"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "(noisy)" in out  # the column "persons (noisy)", folded by the terminal width
    run_dir = next((tmp_path / "runs").iterdir())
    report = json.loads((run_dir / "privacy_report.json").read_text())
    noisy = [r["persons_noisy"] for r in report["persons_across_silos"]["rows"]]
    exact = _exact(cfg)
    assert len(noisy) == len(exact) and not np.allclose(noisy, exact, atol=0.5)
    assert report["linkage"]["overlap"]["release"]["persons_in_exactly_m_silos"] == noisy
    key = LinkageKey(KEY.encode())
    some_ids = np.unique(run_mod.build.load_raw(cfg.data).silos[0].person_train)[:20]
    texts = [res.output] + [f.read_text() for f in run_dir.rglob("*")
                            if f.is_file() and f.suffix in (".json", ".toml", ".jsonl", ".md")]
    blob = "\n".join(texts)
    assert KEY not in blob
    assert not any(key.pseudonym(i) in blob for i in some_ids.tolist())
    differ = [int(c) for c, n in zip(exact, noisy) if round(n) != c]
    assert differ, "the seed must give noisy counts that differ from the exact ones"
    assert json.dumps([int(c) for c in exact]) not in blob.replace("\n", "")
    for c in differ:  # neither as the table's figure nor as a JSON count
        assert f"{c}.0 " not in out and f'"persons_in_exactly_m_silos": [{c},' not in blob
    numbers: list[float] = []

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            numbers.append(x)
    walk([report["linkage"], report["persons_across_silos"]])
    big = [c for c in differ if c >= 10]  # small counts coincide with m, M and the like
    assert big and not any(n == c for n in numbers for c in big)


@pytest.mark.parametrize("how", ["short file", "missing file", "short env"])
def test_a_bad_key_exits_2_and_charges_nothing(tmp_path, monkeypatch, how):
    raw = _raw(tmp_path)
    if how == "short file":
        (tmp_path / "link.key").write_text("too short\n")
    elif how == "missing file":
        raw["privacy"]["linkage_key_file"] = str(tmp_path / "nope.key")
    else:
        raw["privacy"].pop("linkage_key_file")
        monkeypatch.setenv(KEY_ENV, "sEcReT9")
    cfg_file = tmp_path / "job.toml"
    cfg_file.write_text(tomli_w.dumps(raw))
    for cmd in (["run", "-q"], ["persons"]):
        res = CliRunner().invoke(app, [*cmd, "-c", str(cfg_file)])
        assert res.exit_code == 2, res.output
        flat = " ".join(res.output.split())
        assert "linkage" in flat and ("16 required" in flat or "cannot read" in flat)
        assert "sEcReT9" not in flat and "too short" not in flat  # never quoted
    assert not (tmp_path / "store.sqlite").exists()
    assert not (tmp_path / "runs").exists()


def test_silofl_persons_without_a_key_releases_and_charges_nothing(tmp_path):
    raw = _raw(tmp_path, key=False)
    cfg_file = tmp_path / "job.toml"
    cfg_file.write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["persons", "-c", str(cfg_file)])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "A person seen by m hospitals" in flat and "◀ M" in flat
    assert "Nothing released, nothing charged" in flat and "persons (noisy)" not in flat
    assert not (tmp_path / "store.sqlite").exists()


def test_silofl_persons_with_a_key_releases_once_and_charges_every_silo(tmp_path):
    raw = _raw(tmp_path)
    cfg_file = tmp_path / "job.toml"
    cfg_file.write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["persons", "-c", str(cfg_file), "--json"])
    assert res.exit_code == 0, res.output
    look = json.loads(res.stdout)  # warnings (a shared machine's registry) go to stderr
    assert look["charged"] and look["run_id"]
    rows = look["persons_across_silos"]["rows"]
    assert all("persons_noisy" in r for r in rows)
    assert rows[0]["epsilon"] <= raw["privacy"]["epsilon"]  # the job's plans, within target
    with BudgetStore(tmp_path / "store.sqlite") as st:
        silos = st.silos()
        assert len(silos) == len(rows)
        for s in silos:
            got = st.charges(s)
            assert [(c["label"], c["command"], c["count"]) for c in got] == [
                ("overlap", "silofl persons", 1)]
    exact = _exact(config_from_dict(raw))
    noisy = [r["persons_noisy"] for r in rows]
    assert not np.allclose(noisy, exact, atol=0.5)
    assert json.dumps([int(c) for c in exact]) not in res.output.replace("\n", "")


def test_linked_uldp_weights_come_from_pseudonyms_and_need_a_key(tmp_path, monkeypatch):
    raw = _raw(tmp_path)
    raw["training"].update(methods=["uldp"], uldp_weighting="linked", uldp_sample_rate=0.5)
    called = []
    real = linkage.pseudonymize
    monkeypatch.setattr(linkage, "pseudonymize",
                        lambda key, ids: called.append(len(ids)) or real(key, ids))
    p = run_mod._prepare(config_from_dict(raw))
    alg = p.algorithms[0]
    assert alg.weighting == "linked" and alg.sample_rate == 0.5 and alg.given is not None
    assert called and p.link.events == {}  # uldp: no overlap release composed into σ
    from silofl.algorithms.uldp import person_totals, record_proportion_weights
    ids = [np.asarray(s.person_train) for s in p.raw.silos]
    for got, want in zip(alg.given, record_proportion_weights(ids)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert person_totals(ids, alg.given).max() == pytest.approx(1.0, abs=1e-9)
    assert any(linkage.LINKED_NOTE == n for n in linkage.describe(p.link)["notes"])
    raw["privacy"].pop("linkage_key_file")
    with pytest.raises(ConfigError, match="uldp_weighting"):
        run_mod._prepare(config_from_dict(raw))
    raw["privacy"]["linkage_key_file"] = str(tmp_path / "link.key")
    raw["privacy"]["overlap_epsilon"] = 0.1
    with pytest.raises(ConfigError, match="overlap_epsilon"):
        run_mod._prepare(config_from_dict(raw))


def test_overlap_epsilon_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="overlap_epsilon"):
        config_from_dict(_raw(tmp_path, overlap_epsilon=5.0))
    with pytest.raises(ConfigError, match="overlap_epsilon"):
        config_from_dict(_raw(tmp_path, overlap_epsilon=-0.1))
    p = run_mod._prepare(config_from_dict(_raw(tmp_path, overlap_epsilon=0.0)))
    assert p.link is not None and p.link.events == {} and not linkage.charges(p.link)


def test_a_release_above_the_declared_m_is_flagged(tmp_path):
    """Declared M = 1 while a fifth of the patients are at 2-3 hospitals: with a release
    precise enough (ε = 1 of 2), the report flags m = 2 from the noisy counts alone."""
    raw = _raw(tmp_path, overlap_epsilon=1.0)
    raw["privacy"]["persons_in_silos"] = 1
    raw["budget"] = {"scratch": True}
    raw["output"] = {"dir": ""}
    rep = run_mod.run(config_from_dict(raw))
    assert 2 in rep.persons["overlap_above_declared"]
    assert rep.persons["declared_m"] == 1
    std = rep.linkage["overlap"]["noise_std_persons"]
    assert std < 10  # persons per bin
    from rich.console import Console

    from silofl.experiments.person_report import person_table
    con = Console(record=True, width=200)
    con.print(person_table(rep.persons))
    assert "more than the declared M = 1" in " ".join(con.export_text().split())


def test_a_resumed_run_keeps_the_release_charged_once_and_its_sigma(tmp_path):
    """Interrupted after the release: the resume plans the same σ (the release composed
    in), charges no second release, and says its table has no noisy column."""
    from silofl.experiments.resume import resume_run
    raw = _raw(tmp_path)
    raw["training"]["rounds"] = 4
    raw["output"]["name"] = "job"
    raw["budget"]["epsilon"] = 4.0  # a resume re-reads the rounds after its checkpoint

    def stop(label, t, total, pooled):
        if t == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_mod.run(config_from_dict(raw), on_progress=stop)
    rep = resume_run(tmp_path / "runs" / "job")
    assert all(c["within_target"] for c in rep.combined_privacy)
    assert "overlap histogram" in rep.results[0].plans[0].calibrated_for
    assert all("persons_noisy" not in r for r in rep.persons["rows"])
    assert any("not redone on resume" in n for n in rep.notes())
    with BudgetStore(tmp_path / "store.sqlite") as st:
        for s in st.silos():
            got = [c for c in st.charges(s) if c["label"] == "overlap"]
            assert len(got) == 1 and got[0]["count"] == 1
