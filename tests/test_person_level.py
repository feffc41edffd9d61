"""Person-level DP-SGD (`training.persons`): each sampled person adds ≤ C, whatever their
number of rows; the accounting counts persons; everything else is example-level DP-SGD."""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import pytest

from silofl.algorithms import make_algorithm
from silofl.data.federation import Federation, Silo
from silofl.errors import ConfigError
from silofl.models.glm import LinearRegression, LogisticRegression, SoftmaxRegression
from silofl.privacy import accounting
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate
from silofl.runtime.sources import training_source
from silofl.training import selection
from silofl.training.persons import PersonIndex
from silofl.training.sampling import poisson_batches


def _federation(K=3, persons=120, mean_rows=4.0, seed=0, one_row=False, d=5):
    rng = np.random.default_rng(seed)
    silos = []
    for k in range(K):
        r = np.ones(persons, int) if one_row else 1 + rng.poisson(mean_rows - 1, persons)
        ids = np.repeat(np.arange(persons) + 10_000 * k, r)
        rng.shuffle(ids)  # rows of a person need not be adjacent in the table
        X = rng.normal(size=(len(ids), d)) * 2
        y = (X[:, 0] + rng.normal(size=len(ids)) > 0).astype(float)
        silos.append(Silo(f"s{k}", X, y, X[:40], y[:40], PrivacyTarget(2.0, 1e-5),
                          person_train=ids))
    return Federation(silos, [f"x{i}" for i in range(d)], "binary")


def test_expand_reads_each_sampled_persons_rows_with_weights_summing_to_one():
    rng = np.random.default_rng(1)
    ids = [np.repeat(np.arange(50), 1 + rng.poisson(3, 50)) for _ in range(2)]
    index, orders = PersonIndex.group(ids)
    persons, mask = poisson_batches(index.n, np.full(2, 0.3), Randomness.seeded(3))
    rows, w = index.expand(np.arange(2), persons, mask, rng)
    for k in range(2):
        owner = ids[k][orders[k]]  # person of each sorted row
        sampled = set(persons[k][mask[k]].tolist())
        real = w[k] > 0
        assert set(owner[rows[k][real]].tolist()) == sampled
        assert len(set(rows[k][real].tolist())) == real.sum()  # distinct rows
        for p in sampled:  # all of p's rows, weights 1/r summing to 1
            mine = owner[rows[k][real]] == p
            assert mine.sum() == np.sum(ids[k] == p)
            assert w[k][real][mine].sum() == pytest.approx(1.0, abs=1e-12)


def test_a_cap_reads_at_most_m_distinct_rows_of_a_person():
    rng = np.random.default_rng(2)
    ids = [np.repeat(np.arange(30), 1 + rng.poisson(6, 30))]
    index, orders = PersonIndex.group(ids, cap=2)
    persons, mask = poisson_batches(index.n, np.array([0.5]), Randomness.seeded(4))
    rows, w = index.expand(np.arange(1), persons, mask, rng)
    owner = ids[0][orders[0]]
    real = w[0] > 0
    for p in set(persons[0][mask[0]].tolist()):
        mine = owner[rows[0][real]] == p
        assert 1 <= mine.sum() <= 2
        assert len(set(rows[0][real][mine].tolist())) == mine.sum()
        assert w[0][real][mine].sum() == pytest.approx(1.0)


@pytest.mark.parametrize("model", [LogisticRegression(4), LinearRegression(4),
                                   SoftmaxRegression(4, 3)])
def test_removing_all_rows_of_one_person_moves_the_clipped_sum_by_at_most_C(model):
    """The person-level sensitivity, and the broken variant (weight 1 per row) that fails."""
    rng = np.random.default_rng(5)
    C, r = 0.7, 6
    X = rng.normal(size=(1, 20, 4)) * 5  # large gradients: every row clipped
    y = rng.integers(0, 3 if model.outputs > 1 else 2, size=(1, 20)).astype(float)
    W = rng.normal(size=(1, model.num_params))
    person = np.zeros((1, 20))
    person[0, :r] = 1.0 / r
    others = np.zeros((1, 20))
    others[0, r:] = 1.0
    full = model.clipped_grad_sum(W, X, y, person + others, C)
    without = model.clipped_grad_sum(W, X, y, others, C)
    assert np.linalg.norm(full - without) <= C * (1 + 1e-9)
    broken = model.clipped_grad_sum(W, X, y, (person > 0) + others, C)  # rows weigh 1
    assert np.linalg.norm(broken - without) > 2 * C


def test_one_row_per_person_trains_exactly_as_example_level():
    fed = _federation(one_row=True)
    # rows already in person order, so both units read the same rows for the same draws
    fed = Federation([Silo(s.name, s.X_train[o], s.y_train[o], s.X_test, s.y_test, s.target,
                           person_train=s.person_train[o])
                      for s in fed.silos for o in [np.argsort(s.person_train)]],
                     fed.feature_names, fed.task)
    out = []
    for unit in ("example", "person"):
        cfg = TrainingConfig(rounds=3, batch_size=16, lr=0.5, privacy_unit=unit,
                             noise="seeded", seed=7)
        out.append(simulate(fed, LogisticRegression(5), make_algorithm("mrmtl"), cfg))
    a, b = out
    assert [p.q for p in a.plans] == [p.q for p in b.plans]
    # same draws; the weighted path rounds the float32 rows differently: agree to 1e-6
    assert np.allclose(a.params, b.params, rtol=0, atol=1e-6)
    assert b.privacy()[0]["privacy_unit"] == "person"


def test_person_plans_count_persons_and_the_ledger_holds_the_person_events():
    fed = _federation()
    cfg = TrainingConfig(rounds=4, batch_size=12, lr=0.5, privacy_unit="person",
                         noise="seeded")
    res = simulate(fed, LogisticRegression(5), make_algorithm("fedavg"), cfg)
    for s, p, led in zip(fed.silos, res.plans, res.ledgers):
        assert p.n == s.n_persons == 120
        assert p.q == pytest.approx(12 / 120)
        assert p.steps_per_pass == accounting.steps_for_epochs(120, 12, 1.0)
        # an independent PLD over the person-level Poisson-sampled Gaussian (q over persons)
        ev = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(
            p.q, dpa.GaussianDpEvent(p.noise_multiplier)), p.steps_per_pass * 4)
        eps = dpa.pld.PLDAccountant().compose(ev).get_epsilon(1e-5)
        rep = led.report()
        assert rep["epsilon_pld"] <= 2.0 + 1e-6
        assert rep["epsilon_pld"] == pytest.approx(eps, rel=0.02)  # discretisations differ
    txt = res.privacy()[0]["adjacency_text"]
    assert "all rows of one person" in txt and res.privacy()[0]["n_persons"] == 120


def test_the_estimate_is_the_mean_over_persons_of_each_persons_mean_gradient():
    """Non-private rule (no clip, no noise): E[ĝ] = (1/n_p) Σ_p mean_{i∈p} g_i."""
    fed = _federation(K=1, persons=40, seed=3)
    src = training_source(fed.silos, "person")
    model = LogisticRegression(5)
    from silofl.training.dpsgd import GradientRule
    from silofl.training.trainer import LocalTrainer
    tr = LocalTrainer(model, src, GradientRule(1.0, None), batch_size=8,
                      steps_per_round=np.array([1]), lr=0.1, l2=0.0,
                      rng=Randomness.seeded(0))
    W = np.random.default_rng(0).normal(size=(1, 6)) * 0.3
    draws = np.stack([tr.gradients(W)[0] for _ in range(3000)])
    s = fed.silos[0]
    g = model.per_example_grads(W[0], s.X_train, s.y_train)
    want = np.mean([g[s.person_train == p].mean(0) for p in np.unique(s.person_train)], 0)
    se = draws.std(0) / np.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(0) - want) < 5 * se + 1e-9)


def test_ifca_scores_a_person_once_whatever_their_rows():
    rng = np.random.default_rng(4)
    model = LogisticRegression(2)
    X = rng.normal(size=(5, 2))
    y = np.array([1.0, 1, 1, 1, 0])
    w = np.array([0.25, 0.25, 0.25, 0.25, 1.0])  # person A: 4 rows, person B: 1 row
    cand = np.array([[0, 0, 10.0]])  # predicts 1 everywhere: A right, B wrong
    assert selection.scores(model, cand, X, y, weights=w)[0] == pytest.approx(0.5)
    assert selection.scores(model, cand, X, y)[0] == pytest.approx(0.2)


def test_person_unit_refusals_name_the_fix():
    fed = _federation()
    bare = Federation([Silo(s.name, s.X_train, s.y_train, s.X_test, s.y_test, s.target)
                       for s in fed.silos], fed.feature_names, fed.task)
    cfg = TrainingConfig(rounds=2, batch_size=8, privacy_unit="person")
    with pytest.raises(ConfigError, match="person_column"):
        simulate(bare, LogisticRegression(5), make_algorithm("fedavg"), cfg)
    with pytest.raises(ConfigError, match="not available with"):
        simulate(fed, LogisticRegression(5), make_algorithm("fedavg_ldp"), cfg)
    with pytest.raises(ConfigError, match="max_rows_per_person"):
        TrainingConfig(privacy_unit="person", max_rows_per_person=-1).validate()


def test_a_person_level_job_reports_what_a_person_in_m_hospitals_is_guaranteed(tmp_path):
    """The EHR example end to end: every silo at its person-level target, and the
    consortium figure for m hospitals is the PLD composition (below m·ε, above ε)."""
    import tomllib
    from pathlib import Path

    import silofl
    from silofl.config import config_from_dict
    root = Path(__file__).resolve().parents[1] / "examples" / "ehr"
    raw = tomllib.loads((root / "ehr.toml").read_text())
    raw["data"].update(path=str(root / "visits.csv"), schema=str(root / "ehr_schema.toml"))
    raw["training"].update(rounds=3, methods=["fedavg"])
    raw["budget"] = {"scratch": True}
    raw["output"] = {"dir": ""}
    rep = silofl.run(config_from_dict(raw))
    assert all(c["within_target"] for c in rep.combined_privacy)
    p = rep.persons
    assert p is not None and p["declared_m"] == 3 and p["declared"]["m"] == 3
    eps = [r["epsilon"] for r in p["rows"]]
    one = max(c["epsilon"] for c in rep.combined_privacy)
    assert eps[0] == pytest.approx(one, rel=1e-3)
    assert one < eps[1] < eps[2] < 3 * one  # composition, not the naive sum


def test_the_guides_python_example_runs_as_printed(capsys):
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "person-level.md")
    code = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)[0]
    scope: dict = {"__name__": "guide"}
    exec(compile(code, str(page), "exec"), scope)  # noqa: S102 — our own documentation
    scope["main"]()
    first = capsys.readouterr().out.splitlines()[0].split()
    assert first[0] == "person" and int(first[1]) > 100 and float(first[2]) <= 2.0
