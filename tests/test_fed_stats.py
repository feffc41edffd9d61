"""`silofl stats` (issue 24, item 2): private per-silo statistics of declared columns,
charged to each silo's lifetime store before the rows are read; pooled figures are
post-processing of the silos' noisy releases."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import load_config
from silofl.data import fed_stats
from silofl.errors import BudgetExceeded, ConfigError
from silofl.experiments import stats as stats_mod
from silofl.privacy import accounting
from silofl.privacy.budget import BudgetStore
from silofl.privacy.randomness import Randomness
from silofl.runtime import job as job_mod

ROOT = Path(__file__).resolve().parents[1] / "examples" / "ehr"
COLS = "age,sbp,diabetes"


def _cfg_file(tmp_path: Path, unit: str = "example", schema: Path | None = None,
              **budget) -> Path:
    raw = tomllib.loads((ROOT / "ehr.toml").read_text())
    raw["data"].update(path=str(ROOT / "visits.csv"),
                       schema=str(schema or ROOT / "ehr_schema.toml"))
    raw["privacy"].update(noise="seeded", unit=unit, epsilon=2.0)
    if unit == "example":  # the person-only keys of the example config
        for key in ("max_rows_per_person", "persons_in_silos"):
            raw["privacy"].pop(key)
    raw["budget"] = {"store": str(tmp_path / "store.sqlite"), **budget}
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


def _stats_charges(tmp_path: Path) -> list[dict]:
    path = tmp_path / "store.sqlite"
    if not path.exists():
        return []
    with BudgetStore(path) as st:
        return [c for n in st.silos() for c in st.charges(n)]


# --- the mechanism ----------------------------------------------------------------------

def test_one_record_moves_the_release_by_at_most_the_declared_sensitivity():
    rng = np.random.default_rng(0)
    d, bins = 3, 10
    lo, hi = np.zeros(d), np.full(d, 10.0)
    X = rng.uniform(-2, 12, (50, d))
    X[rng.random((50, d)) < 0.2] = np.nan
    base = fed_stats.noiseless_statistics(X, lo, hi, bins)
    worst = 0.0
    extremes = np.array([[0.0, 5.0, 10.0]])  # u ∈ {-1, 0, 1}: attains √(3d)
    for rec in [*rng.uniform(-5, 15, (200, d)), *extremes]:
        more = fed_stats.noiseless_statistics(np.vstack([X, rec]), lo, hi, bins)
        worst = max(worst, float(np.linalg.norm(more - base)))
    assert worst <= fed_stats.sensitivity(d) + 1e-9
    assert worst == pytest.approx(fed_stats.sensitivity(d), rel=1e-9)


def test_removing_a_person_moves_the_release_by_at_most_the_sensitivity():
    rng = np.random.default_rng(1)
    d, bins = 2, 8
    lo, hi = np.zeros(d), np.ones(d)
    X = rng.uniform(0, 1, (60, d))
    persons = np.repeat(np.arange(12), 5).astype(str)
    X[:5] = [[0.0, 1.0]] * 5  # person "0": five extreme rows
    full = fed_stats.noiseless_statistics(X, lo, hi, bins, persons)
    keep = persons != "0"
    less = fed_stats.noiseless_statistics(X[keep], lo, hi, bins, persons[keep])
    assert np.linalg.norm(full - less) <= fed_stats.sensitivity(d) + 1e-9
    assert full[:, 0].sum() == pytest.approx(2 * 12)  # counts are of persons


def test_the_noise_has_the_declared_std_over_many_draws():
    X = np.random.default_rng(2).uniform(0, 1, (40, 2))
    lo, hi = np.zeros(2), np.ones(2)
    clean = fed_stats.noiseless_statistics(X, lo, hi, 20)
    rng = Randomness.for_mode("seeded", [7, 7])
    noise_std = 3.5
    draws = np.stack([fed_stats.release(X, lo, hi, 20, noise_std, rng) - clean
                      for _ in range(500)])  # 500 × 46 coordinates
    assert abs(draws.mean()) < 0.05 * noise_std
    assert draws.std() == pytest.approx(noise_std, rel=0.03)  # 23 000 draws: ~0.5% s.e.


def test_quantiles_at_epsilon_one_are_within_one_unit_on_a_known_distribution():
    """N(50, 10²) in declared bounds [0, 100], 20 000 rows, 50 bins, ε = 1 at δ = 1e-5:
    quartiles within 1.0 (1 % of the range, half a bin) of the true ones, on 5 seeds."""
    sigma = accounting.calibrate(lambda s: dpa.GaussianDpEvent(s), 1.0, 1e-5)
    lo, hi = np.array([0.0]), np.array([100.0])
    for seed in range(5):
        x = np.random.default_rng(seed).normal(50, 10, (20_000, 1))
        rel = fed_stats.release(x, lo, hi, 50, sigma * fed_stats.sensitivity(1),
                                Randomness.for_mode("seeded", [seed, 1]))
        got = fed_stats.summarize(rel, lo, hi, len(x))[0]
        true = np.quantile(np.clip(x, 0, 100), [0.25, 0.5, 0.75])
        assert np.allclose(list(got["quantiles"].values()), true, atol=1.0)
        assert got["mean"] == pytest.approx(float(x.mean()), abs=0.2)
        assert got["std"] == pytest.approx(float(x.std()), abs=0.3)  # no floor


def test_quantiles_of_an_empty_or_negative_histogram_stay_in_bounds():
    assert fed_stats.quantiles_from_histogram(np.array([-3.0, -1.0]), 0, 10, [0.5]) == [5.0]
    q = fed_stats.quantiles_from_histogram(np.array([0.0, 10.0, 0.0, 0.0]), 0, 4, [0, 0.5, 1])
    assert q == pytest.approx([1.0, 1.5, 2.0])


# --- the job: charged first, bad input, pooled ------------------------------------------

def test_every_silo_is_charged_in_the_store_before_its_rows_are_read(tmp_path, monkeypatch):
    cfg = load_config(_cfg_file(tmp_path))
    order: list[tuple[str, int]] = []
    store = BudgetStore(tmp_path / "store.sqlite")
    real_spend, real_release = job_mod.Job.spend_extra, fed_stats.release

    def spend(self, silo, label):
        real_spend(self, silo, label)
        order.append(("charged", len([c for c in store.charges(silo) if c["label"] == "stats"])))

    def release(X, *a, **k):
        order.append(("read", len(X)))
        return real_release(X, *a, **k)

    monkeypatch.setattr(job_mod.Job, "spend_extra", spend)
    monkeypatch.setattr(fed_stats, "release", release)
    rep = stats_mod.federated_stats(cfg, COLS.split(","), epsilon=0.5, store=store)
    assert [o[0] for o in order] == ["charged", "read"] * len(rep.silos)
    assert all(n == 1 for what, n in order if what == "charged")


@pytest.mark.filterwarnings("ignore:NEW budget store")
def test_a_store_without_room_refuses_and_nothing_is_read_or_charged(tmp_path, monkeypatch):
    cfg = load_config(_cfg_file(tmp_path, epsilon=0.1, delta=1e-4))  # lifetime ε = 0.1
    monkeypatch.setattr(fed_stats, "release", lambda *a, **k: pytest.fail("rows were read"))
    with pytest.raises(BudgetExceeded):
        stats_mod.federated_stats(cfg, ["age"], epsilon=0.5)
    with BudgetStore(tmp_path / "store.sqlite") as st:
        assert all(st.spent(n)["epsilon"] == 0 for n in st.silos())
        assert [c for n in st.silos() for c in st.charges(n)] == []
    res = CliRunner().invoke(app, ["stats", "-c", str(_cfg_file(tmp_path, epsilon=0.1,
                                                                    delta=1e-4)),
                                   "--columns", "age", "--epsilon", "0.5"])
    assert res.exit_code == 2, res.output


def test_the_charge_is_the_planned_gaussian_and_pooled_costs_nothing_more(tmp_path,
                                                                         monkeypatch):
    cfg = load_config(_cfg_file(tmp_path))
    seen: dict[int, np.ndarray] = {}
    real = fed_stats.release

    def release(*a, **k):
        out = real(*a, **k)
        seen[len(seen)] = out
        return out

    monkeypatch.setattr(fed_stats, "release", release)
    store = BudgetStore(tmp_path / "store.sqlite")
    rep = stats_mod.federated_stats(cfg, COLS.split(","), epsilon=0.5, store=store)
    for name, silo in rep.silos.items():
        charges = store.charges(name)
        assert [(c["label"], c["count"]) for c in charges] == [("stats", 1)]
        eps = dpa.pld.PLDAccountant().compose(dpa.GaussianDpEvent(silo["sigma"])) \
            .get_epsilon(silo["delta"])
        assert eps == pytest.approx(0.5, rel=0.01)  # an independent composition
        assert store.spent(name)["epsilon"] == pytest.approx(0.5, rel=0.01)
    total = sum(seen.values())
    again = fed_stats.summarize(total, rep.plan.lower, rep.plan.upper, rep.pooled["n"])
    assert [rep.pooled["columns"][c] for c in rep.plan.columns] == again
    assert rep.pooled["epsilon_charged"] == 0.0
    assert rep.pooled["noise_std"] == pytest.approx(
        math.sqrt(sum(s["noise_std"] ** 2 for s in rep.silos.values())))


def test_person_level_counts_persons_and_json_parses_from_stdout(tmp_path):
    res = CliRunner().invoke(app, ["stats", "-c", str(_cfg_file(tmp_path, unit="person")),
                                   "--columns", "age", "--epsilon", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["unit"] == "person" and out["columns"] == ["age"]
    assert sum(s["n"] for s in out["silos"].values()) == out["pooled"]["n"]
    assert out["pooled"]["n"] < 3016  # persons, not visits (a person may be in 2-3 silos)
    assert out["sensitivity"] == pytest.approx(math.sqrt(3))
    assert [c["label"] for c in _stats_charges(tmp_path)] == ["stats"] * len(out["silos"])


@pytest.mark.parametrize("args, words", [
    (["--columns", "sex"], "categorical"),
    (["--columns", "agee"], "did you mean 'age'"),
    (["--columns", "sbp"], "no declared lower/upper bounds"),
    (["--columns", "age", "--epsilon", "-1"], "--epsilon must be a positive"),
    (["--columns", ","], "--columns is empty"),
    (["--bins", "1"], "bins must be"),
    (["--set", "privacy.enabled=false"], "keep [privacy] enabled"),
])
def test_bad_input_exits_2_and_charges_nothing(tmp_path, args, words):
    schema = tmp_path / "schema.toml"
    text = (ROOT / "ehr_schema.toml").read_text().replace("lower = 60\n", "")
    schema.write_text(text.replace("upper = 240\n", ""))  # sbp: no declared bounds
    res = CliRunner().invoke(app, ["stats", "-c", str(_cfg_file(tmp_path, schema=schema)),
                                   *args])
    assert res.exit_code == 2, res.output
    assert words in " ".join(res.output.split())
    assert _stats_charges(tmp_path) == []


def test_person_unit_without_person_column_is_refused(tmp_path):
    cfg = load_config(_cfg_file(tmp_path, unit="person"))
    cfg.data.person_column = None
    with pytest.raises(ConfigError):
        stats_mod.federated_stats(cfg, ["age"], epsilon=1.0)
    assert _stats_charges(tmp_path) == []
