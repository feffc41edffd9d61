"""The guarantee a pandemic model states is the one it delivers: secure noise by default
(seeded runs flagged), lifetime budgets that compose across runs and are reserved before
any record is read, the node+edges adjacency (2S − 1 affected examples), and
preprocessing that is declared or charged — uncharged only when asked, and then listed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from silofl.cli import app
from silofl.errors import BudgetExceeded, DataError
from silofl.pandemic import constants as pandemic_constants
from silofl.pandemic import features as FT
from silofl.pandemic import pipeline as P
from silofl.pandemic import read_dataset
from silofl.pandemic import regions as pandemic_regions
from silofl.pandemic import tables as TB
from silofl.pandemic.challenge import write_predictions
from silofl.pandemic.charges import (
    UNCHARGED_ITEMS,
    planned_charges,
    preprocess_event,
    reserve_regions,
    round_event,
)
from silofl.pandemic.constants import release_vectors
from silofl.pandemic.features import NeighbourhoodFeatures, build_neighbourhood_features
from silofl.pandemic.regions import region_groups
from silofl.privacy import accounting, events
from silofl.privacy.budget import SCRATCH_NOTE, BudgetStore, PlannedCharge
from silofl.privacy.ledger import Ledger
from silofl.privacy.node_level import NodeLevelDpEvent, affected_examples
from silofl.privacy.randomness import Randomness
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import Job
from silofl.runtime.plan import SEEDED_NOTE
from silofl.training import sampling as TS
from silofl.training.node_sampling import UniformBatches, uniform_integers
from silofl.training.trainer import LocalTrainer

runner = CliRunner()
CFG = dict(rounds=2, batch_size=64, epsilon=8.0)


@pytest.fixture(scope="module")
def data(small_outbreak):
    return read_dataset(small_outbreak, with_target=True)


def _no_statistics(monkeypatch):
    """Make every uncharged statistic of the data fail if anything computes it."""
    def refuse(*a, **k):
        raise AssertionError("an uncharged statistic of the data was computed")
    monkeypatch.setattr(FT, "fitted_constants", refuse)
    monkeypatch.setattr(FT, "contact_stats", refuse)
    monkeypatch.setattr(TB, "contact_stats", refuse)
    monkeypatch.setattr(TB, "boxcox_lambda", refuse)
    monkeypatch.setattr(pandemic_regions, "fit_input_scaling", refuse)


# --- noise -------------------------------------------------------------------------------

def test_default_noise_is_secure_and_seeded_runs_are_flagged(data, monkeypatch, tmp_path):
    made = []
    real = TS.secure_randomness

    def counting():
        made.append(real())
        return made[-1]
    # the core trainer's node-level streams (`training.sampling.node_streams`)
    monkeypatch.setattr(TS, "secure_randomness", counting)

    def no_seeded_streams(*a, **k):
        raise AssertionError("a secure run used the seeded streams")
    monkeypatch.setattr(TS, "seeded_streams", no_seeded_streams)
    cfg = P.PandemicConfig(**CFG)
    assert cfg.noise == "secure"
    a, b = P.train(data, cfg), P.train(data, cfg)
    assert not np.array_equal(a.weights, b.weights)  # fresh OS entropy every run
    assert len(made) == 2 * CFG["rounds"] * data.num_regions  # one stream per region-round
    assert all(r.mode == "secure" for r in made)
    for pm in (a, b):
        assert SEEDED_NOTE not in pm.notes
        assert all(p["noise"] == "secure" and SEEDED_NOTE not in p["notes"] for p in pm.privacy)
    monkeypatch.undo()

    seeded = P.PandemicConfig(**CFG, noise="seeded", seed=5)
    c, d = P.train(data, seeded), P.train(data, seeded)
    assert np.array_equal(c.weights, d.weights)  # reproducible: whoever knows the seed...
    assert SEEDED_NOTE in c.notes and all(SEEDED_NOTE in p["notes"] for p in c.privacy)
    c.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert SEEDED_NOTE in meta["notes"] and meta["config"]["noise"] == "seeded"
    assert all(SEEDED_NOTE in p["notes"] for p in meta["privacy"])


def test_secure_rounds_draw_everything_from_their_stream(data, monkeypatch):
    """Batches and noise of a secure round come only from the round's Randomness: with a
    fixed stand-in stream two runs agree, with another stand-in they do not."""
    cfg = P.PandemicConfig(**CFG)
    runs = []
    for seeds in ([1, 2, 3], [1, 2, 3], [4, 5, 6]):
        counter = iter(range(10**6))
        monkeypatch.setattr(TS, "secure_randomness",
                            lambda it=counter, s=seeds: Randomness.seeded(
                                [*s, next(it)]))
        runs.append(P.train(data, cfg).weights)
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])


@pytest.mark.statistical
def test_uniform_batches_are_exact_and_uniform():
    class Fixed(Randomness):
        def __init__(self, ks):
            self.ks = list(ks)

        def uniform(self, shape):
            return np.array([(self.ks.pop(0) + 1) * 2.0 ** -53 for _ in range(int(shape))])
    top = 2 ** 53 - 1  # 2⁵³ mod 3 = 2: the last two values of k must be rejected
    assert uniform_integers(Fixed([top, top - 1, 7]), np.array([3]))[0] == 7 % 3
    assert uniform_integers(Fixed([top - 2]), np.array([3]))[0] == (top - 2) % 3
    # all 20 ordered pairs of 5 equally often, every batch without repeats
    draws = UniformBatches(5, Randomness.seeded(0))
    counts: dict = {}
    for _ in range(20_000):
        b = draws.draw(2)
        assert b[0] != b[1]
        counts[tuple(b)] = counts.get(tuple(b), 0) + 1
    assert len(counts) == 20
    chi2 = sum((c - 1000) ** 2 / 1000 for c in counts.values())
    assert chi2 < 50  # 19 degrees of freedom: P(χ² > 50) ≈ 1e-4
    b = UniformBatches(1000, Randomness.secure()).draw(1000)
    assert np.array_equal(np.sort(b), np.arange(1000))


# --- the lifetime budget store ------------------------------------------------------------

def _count_reads(monkeypatch) -> list:
    reads = []
    orig = NeighbourhoodFeatures.gather
    build = build_neighbourhood_features

    def gather(self, *a, **k):
        reads.append("gather")
        return orig(self, *a, **k)

    def building(*a, **k):
        reads.append("features")
        return build(*a, **k)
    monkeypatch.setattr(NeighbourhoodFeatures, "gather", gather)
    monkeypatch.setattr(pandemic_regions, "build_neighbourhood_features", building)
    return reads


def test_second_train_on_the_same_store_is_refused_before_any_record_is_read(
        data, monkeypatch, tmp_path):
    with BudgetStore(tmp_path / "budget.sqlite") as store:
        first = P.train(data, P.PandemicConfig(**CFG), store=store)
        before = {n: store.spent(n)["epsilon"] for n in first.regions}
        reads = _count_reads(monkeypatch)
        with pytest.raises(BudgetExceeded, match="lifetime"):
            P.train(data, P.PandemicConfig(**CFG), store=store)
        assert reads == []  # refused before features were built or any example gathered
        assert {n: store.spent(n)["epsilon"] for n in first.regions} == before
        assert all(store.spent(n)["unfinished_runs"] == 0 for n in first.regions)


def test_runs_compose_in_the_lifetime_store(data, tmp_path):
    with BudgetStore(tmp_path / "budget.sqlite") as store:
        cfg = P.PandemicConfig(**{**CFG, "epsilon": 4.0})
        regions = region_groups(data, cfg)
        store.register({r.name: PrivacyTarget(6.5, 1.0 / r.n) for r in regions})
        a = P.train(data, cfg, store=store)
        b = P.train(data, cfg, store=store)
        for pa, pb in zip(a.privacy, b.privacy):
            both = events.compose(Counter_of(pa) + Counter_of(pb))
            composed = accounting.epsilon(both, pa["delta"], "rdp")
            assert pb["lifetime_epsilon_spent"] == pytest.approx(composed, rel=1e-9)
            assert store.spent(pa["region"])["epsilon"] == pytest.approx(composed, rel=1e-9)
            assert pa["lifetime_epsilon_spent"] == pytest.approx(pa["epsilon_spent"], rel=1e-9)
            assert 4.0 < composed < 8.0  # composes: more than one run, less than the sum
            assert pb["lifetime_target_epsilon"] == 6.5
        with pytest.raises(BudgetExceeded):
            P.train(data, cfg, store=store)


def Counter_of(entry):
    """The base events a privacy entry's run charged: its rounds (as in its ledger)."""
    from collections import Counter
    ev = NodeLevelDpEvent(entry["n"], entry["S"], entry["batch_size"],
                            entry["noise_multiplier"], entry["steps"] // CFG["rounds"],
                            entry["adjacency"])
    return Counter({ev: CFG["rounds"]})


def test_reservation_covers_preprocessing_and_rounds_and_settles_to_executed(
        data, monkeypatch, tmp_path):
    cfg = P.PandemicConfig(**{**CFG, "rounds": 3}, preprocessing="private")
    log = []
    store = BudgetStore(tmp_path / "budget.sqlite")
    current = [store]  # the store of the run under way
    real_reserve, real_release = BudgetStore.reserve, release_vectors
    real_gather = NeighbourhoodFeatures.gather

    def reserve(self, run_id, planned, **kw):
        log.append(("reserve", [(p.silo, p.label, p.count) for p in planned]))
        return real_reserve(self, run_id, planned, **kw)

    def release(*a, **k):  # the private statistic reads the data: it must be reserved
        st = current[0]
        assert all(c["status"] == "reserved" for n in st.silos() for c in st.charges(n))
        log.append(("read",))
        return real_release(*a, **k)

    def gather(self, *a, **k):
        if k.get("labels", True):
            log.append(("read",))
        return real_gather(self, *a, **k)
    settled, real_settle = [], Job.settle

    def settle(self, status="finished"):  # the one budget path: a runtime.job.Job
        settled.append(status)
        return real_settle(self, status)
    monkeypatch.setattr(BudgetStore, "reserve", reserve)
    monkeypatch.setattr(pandemic_constants, "release_vectors", release)
    monkeypatch.setattr(NeighbourhoodFeatures, "gather", gather)
    monkeypatch.setattr(Job, "settle", settle)
    pm = P.train(data, cfg, store=store)
    assert settled == ["finished"]
    assert log[0][0] == "reserve" and [x[0] for x in log].count("reserve") == 1
    want = sorted((r, label, k) for r in pm.regions
                  for label, k in (("preprocess", 1), ("node-dpsgd", 3)))
    assert sorted(log[0][1]) == want  # everything, reserved before the first read
    regions = {r.name: r for r in region_groups(data, cfg)}
    P.plan_regions(list(regions.values()), cfg)
    for name in pm.regions:
        charges = store.charges(name)
        assert {c["status"] for c in charges} == {"charged"} and {c["run_status"] for c in
                                                                  charges} == {"finished"}
        got = {(c["label"], c["count"]): events.from_json(c["event"]) for c in charges}
        r = regions[name]
        assert got == {("preprocess", 1): preprocess_event(r, cfg),
                       ("node-dpsgd", 3): round_event(r, cfg)}
    # a run that fails in round 2 is settled to what it executed: preprocessing, round 1
    store2 = current[0] = BudgetStore(tmp_path / "budget2.sqlite")
    real_run = LocalTrainer.run

    def failing(self, *a, round=0, **k):  # the core trainer's local pass
        if round == 2:
            raise RuntimeError("crash")
        return real_run(self, *a, round=round, **k)
    monkeypatch.setattr(LocalTrainer, "run", failing)
    with pytest.raises(RuntimeError):
        P.train(data, cfg, store=store2)
    assert settled == ["finished", "failed"]
    for name in pm.regions:
        charges = store2.charges(name)
        assert sorted((c["label"], c["count"], c["status"]) for c in charges) == [
            ("node-dpsgd", 1, "charged"), ("preprocess", 1, "charged")]
        assert {c["run_status"] for c in charges} == {"failed"}
        assert store2.spent(name)["epsilon"] < store.spent(name)["epsilon"]
    store.close()
    store2.close()


# --- one budget path: runtime.job reserves and settles the regions ------------------------

def _planned(data, cfg):
    """Regions planned from public facts only (sizes): no record is read."""
    regions = region_groups(data, cfg)
    return regions, P.plan_regions(regions, cfg)


def test_regions_reserve_through_runtime_job_exactly_what_they_may_spend(data):
    cfg = P.PandemicConfig(**{**CFG, "rounds": 3}, preprocessing="private")
    regions, plans = _planned(data, cfg)
    store = BudgetStore(None)
    job = reserve_regions(store, regions, cfg, plans, command="test")
    assert isinstance(job, Job) and store.run_status(job.run_id) == "reserved"
    ledgers = job.ledgers(cfg.method)  # simulate asks again: the same ledgers, no new allowance
    assert all(a is r.ledger for a, r in zip(ledgers, regions))
    with pytest.raises(ValueError, match="already handed out"):
        job.ledgers(cfg.method, restored={})
    r = regions[0]
    ev = round_event(r, cfg)  # one object every round, as the core trainer charges
    r.ledger.charge(preprocess_event(r, cfg), round=0, label="preprocess")
    for t in (1, 2, 3):
        r.ledger.charge(ev, round=t, label="node-dpsgd")
    with pytest.raises(BudgetExceeded, match="not covered by what this run reserved"):
        r.ledger.charge(round_event(r, cfg), round=4, label="node-dpsgd")
    with pytest.raises(BudgetExceeded, match="not covered"):  # one release, not two
        r.ledger.charge(preprocess_event(r, cfg), round=0, label="preprocess")
    job.settle()
    assert store.run_status(job.run_id) == "finished"
    assert [(c["label"], c["count"], c["status"]) for c in store.charges(r.name)] == [
        ("preprocess", 1, "charged"), ("node-dpsgd", 3, "charged")]
    for other in regions[1:]:  # settled to what executed: nothing
        assert store.charges(other.name) == [] and store.spent(other.name)["epsilon"] == 0
    assert store.spent(r.name)["epsilon"] == pytest.approx(r.ledger.epsilon("rdp"), rel=1e-9)


def test_a_reservation_short_of_the_plan_is_refused_before_the_store_is_touched(data):
    cfg = P.PandemicConfig(**CFG)
    regions, plans = _planned(data, cfg)
    store = BudgetStore(None)
    short = {r.name: planned_charges(r, cfg, rounds=[1]) for r in regions}
    with pytest.raises(ValueError, match="do not cover its plan"):
        reserve_regions(store, regions, cfg, plans, command="t", charges=short)
    other = {r.name: [PlannedCharge(r.name, "fedavg", c.label, c.event, c.count)
                      for c in planned_charges(r, cfg)] for r in regions}
    with pytest.raises(ValueError, match="is not one of method 'mrmtl'"):
        reserve_regions(store, regions, cfg, plans, command="t", charges=other)
    assert store.silos() == []  # nothing registered, nothing reserved


def test_cli_second_train_is_refused_with_exit_2_and_writes_nothing(small_outbreak, tmp_path):
    store = tmp_path / "budget.sqlite"
    args = ["pandemic", "train", "--data", str(small_outbreak), "--rounds", "1", "--batch",
            "64", "--epsilon", "6", "--store", str(store)]
    r = runner.invoke(app, args + ["--model", str(tmp_path / "m1")])
    assert r.exit_code == 0, r.output
    assert SCRATCH_NOTE not in r.output
    r = runner.invoke(app, args + ["--model", str(tmp_path / "m2")])
    assert r.exit_code == 2 and "lifetime" in r.output
    assert not (tmp_path / "m2").exists()
    # a scratch store is an experiment: it does not remember, and says so
    for name in ("s1", "s2"):
        r = runner.invoke(app, args[:-2] + ["--scratch", "--noise", "seeded", "--model",
                                            str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        flat = " ".join(r.output.split())
        assert SCRATCH_NOTE in flat and SEEDED_NOTE in flat
        meta = json.loads((tmp_path / name / "model.json").read_text())
        assert SCRATCH_NOTE in meta["notes"] and SEEDED_NOTE in meta["notes"]


# --- preprocessing ----------------------------------------------------------------------

def test_default_preprocessing_computes_no_statistic_of_the_data(data, monkeypatch, tmp_path):
    _no_statistics(monkeypatch)
    pm = P.train(data, P.PandemicConfig(**CFG))
    assert pm.config.preprocessing == "declared" and P.predict(data, pm).std() > 0
    assert not any("uncharged" in n for n in pm.notes)
    for p in pm.privacy:
        assert p["preprocessing"]["uncharged"] == [] and p["preprocessing"]["mode"] == "declared"
    assert all(c["source"] == "declared" for c in pm.constants.values())


def test_uncharged_preprocessing_is_listed_by_name(data, small_outbreak, tmp_path):
    pm = P.train(data, P.PandemicConfig(**CFG, preprocessing="uncharged"))
    for item in UNCHARGED_ITEMS:
        assert f"uncharged: {item}" in pm.notes
        assert all(item in p["preprocessing"]["uncharged"] for p in pm.privacy)
    assert pm.constants == {}  # the uncharged statistics are not published in the model
    r = runner.invoke(app, ["pandemic", "train", "--data", str(small_outbreak), "--rounds", "1",
                            "--batch", "64", "--scratch", "--preprocessing", "uncharged",
                            "--model", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "uncharged: model-input standardization" in flat
    assert "uncharged: household-size Box-Cox" in flat


def test_private_preprocessing_is_charged_before_it_reads_and_leaves_nothing_uncharged(
        data, monkeypatch):
    _no_statistics(monkeypatch)
    log = []
    real_charge, real_release = Ledger.charge, release_vectors

    def charge(self, event, *, round=-1, label="dpsgd"):
        log.append(("charge", self.silo, label))
        return real_charge(self, event, round=round, label=label)

    def release(*a, **k):
        log.append(("read",))
        return real_release(*a, **k)
    monkeypatch.setattr(Ledger, "charge", charge)
    monkeypatch.setattr(pandemic_constants, "release_vectors", release)
    cfg = P.PandemicConfig(**CFG, preprocessing="private")
    pm = P.train(data, cfg)
    reads = [i for i, x in enumerate(log) if x == ("read",)]
    assert len(reads) == data.num_regions
    for i in reads:  # every release right after its region's preprocessing charge
        assert log[i - 1][0] == "charge" and log[i - 1][2] == "preprocess"
    assert not any("uncharged" in n for n in pm.notes)
    decl = TB.DECLARED_CONSTANTS
    for name, p in zip(pm.regions, pm.privacy):
        pre = p["preprocessing"]
        assert pre["mode"] == "private" and pre["uncharged"] == []
        assert pre["items"]["feature constants"] == "private"
        assert pre["items"]["model-input standardization"] == "private"
        c = pm.constants[name]
        assert c["source"] == "private" and c["age_mean"] != decl.age_mean
        assert (c["lon_mean"], c["lat_mean"]) == (decl.lon_mean, decl.lat_mean)  # places
        # the ledger composed the release with the rounds, within the target
        rounds_only = NodeLevelDpEvent(p["n"], p["S"], 64, p["noise_multiplier"],
                                         p["steps"] // 2, "node+edges")
        alone = accounting.epsilon(events.compose({rounds_only: 2}), p["delta"], "rdp")
        assert alone < p["epsilon_spent"] <= 8.0
        assert 0 < pre["epsilon_alone"] <= 0.1 * 8.0
    # prediction reuses the released constants: no second release
    monkeypatch.setattr(pandemic_constants, "release_vectors", lambda *a, **k: pytest.fail("released again"))
    assert np.isfinite(P.predict(data, pm)).all()


def _toy_region(n=120, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, 150).astype(np.int32)
    dst = rng.integers(0, n, 150).astype(np.int32)
    states = np.zeros((n, 57), np.int8)
    sick = rng.choice(n, 30, replace=False)
    for i, d in zip(sick, rng.integers(5, 50, 30)):
        states[i, d:] = 1
        states[i, min(57, d + 6):] = 2
    return dict(src=src, dst=dst, num_nodes=n,
                start_time=rng.integers(0, 86400, 150).astype(np.int32),
                duration=rng.integers(60, 40000, 150).astype(np.int32),
                lid=rng.integers(0, 10, 150).astype(np.int32),
                age=rng.integers(0, 95, n), sex=rng.integers(1, 3, n),
                household_size=rng.integers(1, 7, n),
                activities=rng.integers(0, 2, (n, 6)).astype(np.uint8),
                frac_out_of_home=rng.random(n).astype(np.float32), states=states,
                location_ids=np.arange(10), location_flags=rng.integers(0, 2, (10, 6)),
                longitude=rng.normal(-78, 1, 10), latitude=rng.normal(38, 1, 10))


@pytest.mark.parametrize("adjacency", ["node", "node+edges"])
def test_replacing_one_person_moves_at_most_the_affected_release_vectors(adjacency):
    """The private release's sensitivity: ≤ S (node) or 2S − 1 (node+edges) vectors
    change, each by ≤ 2C = ‖widths‖ (on graphs the pruning leaves alone)."""
    region = _toy_region()
    n, p = region["num_nodes"], 7
    new = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in region.items()}
    new["age"][p], new["household_size"][p] = 99, 15
    new["states"][p] = 0
    new["states"][p, 40:] = 1
    if adjacency == "node+edges":  # p now meets other people
        mine = (new["src"] == p) | (new["dst"] == p)
        others = np.setdiff1d(np.arange(n), np.r_[p, new["src"][mine], new["dst"][mine]])[:4]
        rows = np.flatnonzero(mine)[:4]
        new["src"][rows], new["dst"][rows] = p, others[:rows.size]
    deg = lambda r: np.bincount(np.r_[r["src"], r["dst"]], minlength=n).max()  # noqa: E731
    S = int(max(deg(region), deg(new))) + 2  # no person loses an edge to pruning
    vecs = []
    for r in (region, new):
        F = build_neighbourhood_features(**r, S=S)
        assert F.index.num_edges == len({(min(a, b), max(a, b)) for a, b in
                                         zip(r["src"], r["dst"]) if a != b})
        windows = F.sample_windows(np.random.default_rng(1), n)
        V, widths = release_vectors(F, np.arange(n), age=r["age"],
                                      household_size=r["household_size"], windows=windows,
                                      pooling="summary", standardize=True)
        vecs.append(V)
    moved = np.linalg.norm(vecs[1] - vecs[0], axis=1)
    changed = set(np.flatnonzero(moved > 1e-12).tolist())

    def contacts(r):
        return set(r["dst"][r["src"] == p].tolist()) | set(r["src"][r["dst"] == p].tolist())
    # exactly the examples that contain p: their own, and their old and new neighbours'
    assert p in changed and changed <= {p} | contacts(region) | contacts(new)
    assert len(changed) <= affected_examples(n, S, adjacency)
    if adjacency == "node+edges":
        assert changed & (contacts(new) - contacts(region))  # new neighbours changed too
    assert moved.max() <= np.linalg.norm(widths) + 1e-9  # each by ≤ 2C


# --- crashes print no record values --------------------------------------------------------

def test_errors_quote_no_record_values(data, small_outbreak, tmp_path):
    region = _toy_region()
    bad = dict(region, sex=np.full(region["num_nodes"], 7))
    with pytest.raises(DataError) as e:
        build_neighbourhood_features(**bad, S=5)
    assert "7" not in str(e.value)
    bad = dict(region, states=np.full((region["num_nodes"], 57), 9, np.int8))
    with pytest.raises(DataError) as e:
        build_neighbourhood_features(**bad, S=5)
    assert "9" not in str(e.value)
    fmt = tmp_path / "fmt.csv"
    pd.DataFrame({"pid": [987654321], "score": [0.0]}).to_csv(fmt, index=False)
    with pytest.raises(Exception) as e:
        write_predictions(data.pid_index, np.zeros(data.num_persons), fmt, tmp_path / "o.csv")
    assert "987654321" not in str(e.value)
    with pytest.raises(KeyError) as e:
        data.pid_index[987654321]
    assert "987654321" not in str(e.value)
    # a malformed CSV row: pyarrow's message quotes it, ours does not
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(small_outbreak, d)
    path = d / "va_household.csv"
    lines = path.read_text().split("\n")
    original = lines[3]
    lines[3] = "424242,7,1,extra,fields"
    path.write_text("\n".join(lines))
    with pytest.raises(DataError) as e:
        read_dataset(d)
    assert "424242" not in str(e.value) and e.value.__cause__ is None
    lines[3] = original
    path.write_text("\n".join(lines))  # an implausible value: named by line, not by value
    pe = d / "va_person.csv"
    rows = pe.read_text().split("\n")
    f = rows[5].split(",")
    f[3] = "187"
    rows[5] = ",".join(f)
    pe.write_text("\n".join(rows))
    with pytest.raises(DataError, match=r"va_person\.csv line 6: age is implausible") as e:
        read_dataset(d)
    assert "187" not in str(e.value)


def test_models_saved_before_these_fields_load_as_they_were_trained(data, tmp_path):
    """An older model.json has no noise/adjacency/preprocessing: it was trained with seeded
    noise, node adjacency and uncharged constants, and loads (and predicts) as such."""
    pm = P.train(data, P.PandemicConfig(**CFG, private=False, preprocessing="uncharged"))
    pm.save(tmp_path)
    meta = json.loads((tmp_path / "model.json").read_text())
    for k in ("noise", "adjacency", "preprocessing", "preprocessing_share", "declared"):
        del meta["config"][k]
    del meta["notes"], meta["constants"]
    (tmp_path / "model.json").write_text(json.dumps(meta))
    old = P.PandemicModel.load(tmp_path)
    assert (old.config.noise, old.config.adjacency, old.config.preprocessing) == (
        "seeded", "node", "uncharged")
    assert np.array_equal(P.predict(data, old), P.predict(data, pm))


def test_an_injected_crash_in_pandemic_training_prints_no_record(small_outbreak, tmp_path,
                                                                monkeypatch, capsys):
    """Through the real entry point (`silofl.cli.main`): an exception quoting a person's
    record inside training reaches the terminal as its type only."""
    import sys

    import silofl.cli as cli

    leaked = []

    def boom(self, *a, **kw):  # the core trainer's node-level pass, reading graph data
        r = self.data.regions[0]
        pid = int(r.persons[0])
        leaked.append(f"person-{pid}-age")
        raise RuntimeError(f"person-{pid}-age {r.features.num_nodes}")
    monkeypatch.setattr(LocalTrainer, "_run_node", boom)
    monkeypatch.setenv("SILOFL_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(sys, "argv", [
        "silofl", "pandemic", "train", "--data", str(small_outbreak), "--model",
        str(tmp_path / "m"), "--rounds", "1", "--store", str(tmp_path / "b.sqlite")])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    assert ex.value.code == 1
    text = "".join(capsys.readouterr())
    assert leaked and leaked[0] not in text and "RuntimeError" in text
    assert leaked[0] not in next((tmp_path / "logs").glob("crash-*.log")).read_text()
    assert not (tmp_path / "m").exists()
