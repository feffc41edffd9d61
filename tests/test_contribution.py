"""The contribution report: Shapley values (exact and Monte Carlo) on games with known
answers; on a real DP Weight Erosion run, the reconstruction reproduces the executed steps
and a label-flipped silo is valued lowest; `silofl contrib` rebuilds the report from the
run directory without training or charging anything, and fails clearly on bad input."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math

import numpy as np
import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.errors import ConfigError, DataError
from silofl.experiments import contribution as C
from silofl.experiments import erosion
from silofl.privacy.budget import BudgetStore

logging.getLogger("absl").setLevel(logging.ERROR)

SILOS = ("a", "b", "c", "d", "flip")
ROUNDS = 8


# --- games with known answers -----------------------------------------------------------------

# v over 3 players (bit j = player j): by hand, with weights 1/3, 1/6, 1/6, 1/3,
# φ_0 = 1/3·1 + 1/6·2 + 1/6·1 + 1/3·3 = 11/6; φ_1 = 1/3·2 + 1/6·3 + 1/6·3 + 1/3·5 = 10/3;
# φ_2 = 1/3·0 + 1/6·0 + 1/6·1 + 1/3·2 = 5/6 (sum 6 = v(all) − v(∅))
HAND = {0b000: 0, 0b001: 1, 0b010: 2, 0b100: 0, 0b011: 4, 0b101: 1, 0b110: 3, 0b111: 6}


def test_exact_shapley_and_loo_equal_hand_computed_values():
    phi, per = C.shapley_exact(3, HAND.__getitem__)
    np.testing.assert_allclose(phi, [11 / 6, 10 / 3, 5 / 6], rtol=1e-12)
    np.testing.assert_allclose(per, phi[None, :])  # one component
    np.testing.assert_allclose(C.leave_one_out(3, HAND.__getitem__), [3, 5, 2])


def _random_game(n: int, rounds: int, seed: int):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(2 ** n, rounds)) + np.array(
        [bin(m).count("1") for m in range(2 ** n)])[:, None]  # super-additive-ish
    return lambda m: table[m]


def _definition(n: int, v) -> np.ndarray:
    """Shapley by its permutation definition: mean marginal over all n! orders."""
    out = np.zeros(n)
    for order in itertools.permutations(range(n)):
        mask = 0
        for j in order:
            out[j] += np.sum(v(mask | 1 << j) - v(mask))
            mask |= 1 << j
    return out / math.factorial(n)


def test_exact_shapley_is_efficient_and_matches_the_definition():
    v = _random_game(5, rounds=3, seed=1)
    phi, per = C.shapley_exact(5, v)
    assert per.shape == (3, 5)
    np.testing.assert_allclose(per.sum(0), phi)
    assert phi.sum() == pytest.approx(np.sum(v(0b11111) - v(0)), abs=1e-10)
    np.testing.assert_allclose(phi, _definition(5, v), atol=1e-10)


def test_permutation_monte_carlo_agrees_with_exact_within_its_standard_error():
    v = _random_game(7, rounds=2, seed=2)
    exact, _ = C.shapley_exact(7, v)
    mc, se, per = C.shapley_permutation(7, v, permutations=400, seed=3)
    assert np.all(se > 0)
    assert np.all(np.abs(mc - exact) <= 4 * se), (mc - exact) / se
    # every order's marginals telescope: the estimate is efficient exactly
    assert mc.sum() == pytest.approx(np.sum(v(2 ** 7 - 1) - v(0)), abs=1e-9)
    np.testing.assert_allclose(per.sum(0), mc)
    # more orders, smaller error (√T scaling, within noise)
    _, se4, _ = C.shapley_permutation(7, v, permutations=1600, seed=3)
    assert np.all(se4 < se * 0.7)
    with pytest.raises(ConfigError, match="permutations must be"):
        C.shapley_permutation(7, v, permutations=1)


# --- a real DP Weight Erosion run -------------------------------------------------------------

def _table(path, n=300, seed=0):
    """Binary labels from one linear rule; silo `flip` has every label flipped."""
    rng = np.random.default_rng(seed)
    w = np.array([1.5, -1.0, 0.5])
    parts = []
    for name in SILOS:
        X = rng.standard_normal((n, 3))
        y = (X @ w + 0.3 * rng.standard_normal(n) > 0).astype(int)
        parts.append(pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2],
                                   "label": 1 - y if name == "flip" else y, "site": name}))
    pd.concat(parts).to_csv(path, index=False)
    return path


def _cfg(csv, out, store):
    return {"data": {"source": "table", "path": str(csv), "silo_column": "site",
                     "label_column": "label", "test_fraction": 0.3, "standardize": "uncharged"},
            "training": {"rounds": ROUNDS, "lr": 0.3, "seed": 0, "we_p_d": 0.05},
            "privacy": {"epsilon": 4.0, "noise": "seeded"},
            "budget": {"store": str(store)}, "output": {"dir": str(out)}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`silofl erosion` for users a and flip, DP on, with a real budget store file."""
    tmp = tmp_path_factory.mktemp("contrib")
    csv = _table(tmp / "sites.csv")
    cfg = tmp / "run.toml"
    cfg.write_text(tomli_w.dumps(_cfg(csv, tmp / "out", tmp / "budget.sqlite")))
    res = CliRunner().invoke(app, ["erosion", "--config", str(cfg), "--user", "a",
                                   "--user", "flip"])
    assert res.exit_code == 0, res.output
    (run_dir,) = (tmp / "out").iterdir()
    return {"tmp": tmp, "csv": csv, "cfg": cfg, "dir": run_dir,
            "store": tmp / "budget.sqlite"}


def test_erosion_writes_the_report_and_flipped_silo_is_valued_lowest(run):
    d = run["dir"]
    data = json.loads((d / "contribution.json").read_text())
    assert set(data["per_user"]) == {"a", "flip"}
    a = data["per_user"]["a"]
    assert a["method"] == "exact" and a["others"] == ["b", "c", "d", "flip"]
    rows = {r["silo"]: r for r in a["rows"]}
    for key in ("shapley", "loo"):
        low = min(rows, key=lambda s: rows[s][key])
        assert low == "flip", (key, rows)
        assert rows["flip"][key] < 0 < min(rows[s][key] for s in ("b", "c", "d")), key
    # efficiency: the values add up to V(all) − V(user alone)
    assert sum(r["shapley"] for r in a["rows"]) == pytest.approx(a["v_all"] - a["v_user_alone"])
    assert abs(a["efficiency_gap"]) < 1e-9
    # α over rounds from the run, final α in the rows
    assert np.array(a["alpha"]).shape == (ROUNDS, len(SILOS))
    assert rows["flip"]["final_alpha"] == pytest.approx(a["alpha"][-1][SILOS.index("flip")])
    assert rows["flip"]["final_alpha"] < min(rows[s]["final_alpha"] for s in "bcd")
    assert any("not privatized" in n for n in a["notes"])
    assert any("zero privacy cost" in n for n in a["notes"])
    assert "reproducible noise — not a privacy guarantee" in data["notes"]  # DP caveats
    page = (d / "contribution.html").read_text()
    assert "not privatized" in page and "How it is computed" in page
    assert page.count("data:image/png;base64,") == 4  # α + bars, two users
    for png in d.glob("contribution_*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.stem.split("-")[0] for p in (d / C.ROUND_LOGS).glob("*.npz")) == \
        ["a", "flip"]


def _game(run, user="a"):
    from silofl.data.preprocess import apply_preprocessing
    from silofl.experiments import build
    cfg = config_from_dict(_cfg(run["csv"], run["tmp"] / "x", run["store"]))
    raw = build.load_raw(cfg.data)
    model = build.build_model(cfg, raw)
    log, meta = C.load_round_log(next((run["dir"] / C.ROUND_LOGS).glob(f"{user}-*.npz")))
    assert meta["constants"] is None  # no private preprocessing: no statistic saved
    fed = apply_preprocessing(raw, build.plan_data(cfg.data, raw, None))
    return model, log, meta, fed.silo(user).X_test, fed.silo(user).y_test


def test_full_coalition_reproduces_the_executed_steps(run):
    model, log, meta, X, y = _game(run)
    game = C.ReconstructionGame(model, log, SILOS.index("a"), X, y)
    w = game.weights  # every silo received (no NaN rows in this run)
    assert log.present.all() and log.params.shape == (ROUNDS, model.num_params)
    for t in range(ROUNDS - 1):
        step = log.params[t] - log.lr[t] * (w[t] @ log.grads[t]) / w[t].sum()
        np.testing.assert_allclose(step, log.params[t + 1], rtol=0, atol=1e-12)
    full = game((1 << 4) - 1)
    losses = np.array([game.loss(p) for p in log.params])
    np.testing.assert_allclose(full[:-1], losses[:-1] - losses[1:], atol=1e-12)


def test_missing_updates_are_null_players_and_monte_carlo_agrees_on_real_data(run):
    model, log, meta, X, y = _game(run)
    names = list(SILOS)
    exact = C.contribution(model, log, names, "a", X, y)
    mc = C.contribution(model, log, names, "a", X, y, max_exact=2, permutations=300, seed=1)
    assert mc.method == "permutation" and mc.permutations == 300
    assert np.all(np.abs(mc.shapley - exact.shapley) <= 4 * mc.shapley_se + 1e-12)
    assert mc.shapley.sum() == pytest.approx(exact.shapley.sum(), abs=1e-12)
    np.testing.assert_allclose(mc.loo, exact.loo)
    # silo c's updates never received (NaN rows, as the algorithm logs a dropped update):
    # it is a null player; the round logs without a `present` key are read the same way
    k = names.index("c")
    grads = log.grads.copy()
    grads[:, k] = np.nan
    rounds = [{"params": log.params[t], "grads": grads[t], "alpha": log.alpha[t],
               "lr": log.lr[t]} for t in range(ROUNDS)]
    cut = C.contribution(model, C.RoundLog.from_rounds(rounds), names, "a", X, y)
    j = cut.others.index("c")
    assert cut.shapley[j] == 0 and cut.loo[j] == 0
    assert not cut.per_round[:, j].any()


def _digest(path):
    return {p.relative_to(path): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_contrib_cli_rebuilds_the_report_without_training_or_charging(run, tmp_path,
                                                                      monkeypatch):
    from silofl.experiments.ndoye import rank_silos
    from silofl.training import trainer
    rank = rank_silos(config_from_dict(_cfg(run["csv"], tmp_path / "rank",
                                            tmp_path / "rank.sqlite")), "a")
    ledgers = _digest(run["dir"] / "ledgers")
    store = BudgetStore(run["store"])
    spent = {s: store.spent(s)["epsilon"] for s in SILOS}
    store_bytes = run["store"].read_bytes()

    def no_training(*a, **k):
        raise AssertionError("the contribution report must not train or read silo data")
    for name in ("__init__", "gradients", "run"):
        monkeypatch.setattr(trainer.LocalTrainer, name, no_training)
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["contrib", str(run["dir"]), "--ranking",
                                   str(rank.run_dir), "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "contribution to user a" in text and "Ndoye rank" in text
    assert "not privatized" in text and "zero privacy cost" in text
    # nothing read through the trainer, nothing charged, no ledger touched
    assert _digest(run["dir"] / "ledgers") == ledgers
    assert run["store"].read_bytes() == store_bytes
    assert {s: BudgetStore(run["store"]).spent(s)["epsilon"] for s in SILOS} == spent
    # the same values as the report `silofl erosion` made in memory, plus the Ndoye ranks
    old = json.loads((run["dir"] / "contribution.json").read_text())["per_user"]
    new = json.loads((out / "contribution.json").read_text())["per_user"]
    for u in ("a", "flip"):
        for r0, r1 in zip(old[u]["rows"], new[u]["rows"]):
            assert r1["shapley"] == pytest.approx(r0["shapley"], abs=1e-12)
            assert r1["loo"] == pytest.approx(r0["loo"], abs=1e-12)
    ranks = {r["silo"]: r["ndoye_rank"] for r in new["a"]["rows"]}
    assert ranks == {r["silo"]: r["rank"] for r in rank.rows()}
    assert new["a"]["ndoye_source"] == "silofl rank --user a"
    assert "transfer matrix" in new["flip"]["ndoye_source"]  # another user's row
    assert sorted(ranks.values()) == [1, 2, 3, 4]
    assert (out / "contribution.html").is_file()


def test_contrib_cli_fails_clearly_on_a_missing_or_corrupt_directory(run, tmp_path):
    import shutil
    out = tmp_path / "report"

    def contrib(*args):
        res = CliRunner().invoke(app, ["contrib", *map(str, args), "--out", str(out)])
        assert res.exit_code == 2, res.output
        return " ".join(res.output.split())
    assert "is not a directory" in contrib(tmp_path / "nowhere")
    assert "not a `silofl erosion` run directory" in contrib(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(run["dir"], broken)
    log = next((broken / C.ROUND_LOGS).glob("a-*.npz"))
    log.write_bytes(b"not an npz")
    assert "not a readable round log" in contrib(broken)
    log.unlink()
    assert "no round log for user 'a'" in contrib(broken)
    assert "no ranking.json" in contrib(run["dir"], "--ranking", tmp_path)
    assert "permutations must be an integer ≥ 2" in contrib(run["dir"], "--permutations", 1)
    assert "max_exact must be an integer in 1..20" in contrib(run["dir"], "--max-exact", 0)
    assert not out.exists()  # nothing half-written


def test_python_api_refuses_bad_input(run):
    model, log, meta, X, y = _game(run)
    with pytest.raises(ConfigError, match="unknown user silo 'zz'"):
        C.contribution(model, log, list(SILOS), "zz", X, y)
    with pytest.raises(DataError, match="no held-out rows"):
        C.contribution(model, log, list(SILOS), "a", X[:0], y[:0])
    with pytest.raises(DataError, match="does not belong to this run"):
        C.contribution(model, log, list(SILOS[:4]), "a", X, y)
    with pytest.raises(ConfigError, match="rank the same federation"):
        C.ndoye_ranks({"silos": ["x", "y"], "user": "x", "ranking": []}, "a", list(SILOS))


def test_private_preprocessing_constants_travel_with_the_log(tmp_path):
    """With private standardization/imputation the user's rows are rebuilt from the DP
    constants saved with the round log (drawing them again would cost budget)."""
    cfg = config_from_dict({"data": {"source": "heart", "standardize": "private",
                                     "impute": "private"},
                            "training": {"rounds": 3, "seed": 0},
                            "privacy": {"epsilon": 2.0, "noise": "seeded"},
                            "budget": {"scratch": True}, "output": {"dir": str(tmp_path)}})
    rep = erosion.erosion_for_users(cfg, ["Cleveland"])
    _, meta = C.load_round_log(next((rep.run_dir / C.ROUND_LOGS).glob("*.npz")))
    assert meta["private_preprocessing"] and meta["constants"]["standardize"]
    again = C.from_erosion_dir(rep.run_dir)["Cleveland"]
    before = rep.contributions["Cleveland"]
    np.testing.assert_allclose(again.shapley, before.shapley, rtol=0, atol=1e-12)
    np.testing.assert_allclose(again.loo, before.loo, rtol=0, atol=1e-12)
    assert again.others == ["Hungary", "Switzerland", "VA Long Beach"]
