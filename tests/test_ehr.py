"""The simulated EHR consortium (silofl.data.ehr), its example export, and person ids for
the built-in one-row-per-person data (silofl.data.row_persons). Issue 23, "data to show it".

Tolerances are stated per test: with P persons, the realised mean of 1 + Poisson(m - 1)
visits has standard deviation sqrt((m - 1) / P), a share has sqrt(s (1 - s) / P); each
bound below is about 5 of those.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import silofl.data as D
from silofl.config import DataConfig, load_config
from silofl.data.ehr import (
    FEATURES,
    REFERENCE,
    ehr_silos,
    ehr_silos_raw,
    ehr_table,
    simulate_ehr,
    write_ehr_csv,
)
from silofl.data.preprocess import PreprocessSpec, plan_preprocessing
from silofl.data.row_persons import ONE_ROW_NOTE, one_row_per_person
from silofl.data.schema import load_schema
from silofl.errors import ConfigError
from silofl.experiments.build import load_federation, load_raw
from silofl.privacy.targets import PrivacyTarget

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ehr"


def _all_ids(fed, part: str) -> list[np.ndarray]:
    return [getattr(s, f"person_{part}") for s in fed.silos]


@pytest.mark.parametrize("mean", [5.0, 2.5])
def test_visit_counts_have_the_requested_mean(mean):
    persons = 4000
    sim = simulate_ehr(persons=persons, mean_visits=mean, seed=3)
    counts = np.bincount(sim.person, minlength=persons)
    sd = np.sqrt((mean - 1) / persons)
    assert counts.min() == 1
    assert abs(counts.mean() - mean) < 5 * sd  # 0.16 visits at mean 5
    assert counts.max() >= 2 * mean  # a few persons have many rows
    fed = ehr_silos(persons=persons, mean_visits=mean, seed=3)
    assert sum(s.n_train + s.n_test for s in fed.silos) == counts.sum()
    assert fed.meta["overlap"]["mean_visits"] == pytest.approx(counts.mean(), abs=1e-12)


@pytest.mark.parametrize("share", [0.0, 0.2, 0.5])
def test_the_multi_hospital_share_is_as_requested(share):
    persons = 4000
    fed = ehr_silos(hospitals=6, persons=persons, multi_share=share, seed=1)
    # count from the silos' own ids: the overlap is real, not only a meta figure
    seen = {}
    for ids in (np.concatenate([tr, te]) for tr, te in
                zip(_all_ids(fed, "train"), _all_ids(fed, "test"))):
        for p in np.unique(ids):
            seen[int(p)] = seen.get(int(p), 0) + 1
    k = np.array(list(seen.values()))
    assert len(seen) == persons and k.max() <= 3
    realised = float((k >= 2).mean())
    assert abs(realised - share) <= 5 * np.sqrt(share * (1 - share) / persons) + 1e-12
    assert fed.meta["overlap"]["multi_share"] == pytest.approx(realised, abs=1e-12)
    if share > 0:  # some persons at three hospitals, most shared ones at two
        assert 0 < (k == 3).sum() < (k == 2).sum()


def test_the_split_keeps_persons_whole_and_the_same_at_every_hospital():
    fed = ehr_silos(hospitals=5, persons=2000, test_fraction=0.25, seed=7)
    train = set(np.concatenate(_all_ids(fed, "train")).tolist())
    test = set(np.concatenate(_all_ids(fed, "test")).tolist())
    assert not train & test  # never trained on at one hospital and tested at another
    assert len(test) == 500 and len(train) + len(test) == 2000
    for s in fed.silos:
        assert s.person_train.dtype == np.int64 and len(s.person_train) == s.n_train
    shared = set(fed.meta["overlap"]["shared_pairs"])
    assert shared  # persons shared by two hospitals carry one id in both
    a, b = next(iter(shared)).split("|")
    ids = {s.name: set(np.concatenate([s.person_train, s.person_test]).tolist())
           for s in fed.silos}
    assert len(ids[a] & ids[b]) == fed.meta["overlap"]["shared_pairs"][f"{a}|{b}"]


def _pair_correlations(sim, seed=0):
    """(within, between): correlation of the outcomes of two rows of one person (their
    first two), and of the same rows paired with another person's."""
    order = np.argsort(sim.person, kind="stable")
    p, y = sim.person[order], sim.y[order]
    first = np.flatnonzero(np.r_[True, p[1:] != p[:-1]] & np.r_[p[1:] == p[:-1], False])
    a, b = y[first], y[first + 1]
    within = np.corrcoef(a, b)[0, 1]
    between = np.corrcoef(a, b[np.random.default_rng(seed).permutation(len(b))])[0, 1]
    return within, between


def test_outcomes_depend_on_the_person():
    # ~3900 pairs: a correlation's sd is about 0.016
    within, between = _pair_correlations(simulate_ehr(persons=4000, seed=0))
    assert within > between + 0.1 and abs(between) < 0.08
    w0, _ = _pair_correlations(simulate_ehr(persons=4000, person_effect=0.0, seed=0))
    w2, _ = _pair_correlations(simulate_ehr(persons=4000, person_effect=2.0, seed=0))
    assert w2 > w0 + 0.08  # the unobserved frailty is one source of it
    assert w0 > 0.05  # the fixed person features (age, conditions) are the other


def test_hospitals_differ_by_heterogeneity():
    """Calibration offsets and practice: hospital means of a lab (persons without kidney
    disease) and readmission rates spread with `heterogeneity` and agree without it (at
    heterogeneity 0 the spread is sampling noise: about 0.01 mg/dl and 0.03-0.05)."""
    def spreads(het):
        sim = simulate_ehr(persons=4000, heterogeneity=het, seed=0)
        ok = sim.values["ckd"] == 0
        lab = [sim.values["creatinine"][(sim.hospital == h) & ok].mean() for h in range(5)]
        rate = [sim.y[sim.hospital == h].mean() for h in range(5)]
        return np.ptp(lab), np.ptp(rate)
    lab0, rate0 = spreads(0.0)
    lab1, rate1 = spreads(1.0)
    assert lab0 < 0.03 and lab1 > 5 * lab0
    assert rate0 < 0.07 and rate1 > 2 * rate0


def test_the_generator_is_registered_and_person_ids_survive_preprocessing():
    dc = DataConfig(source="synthetic", generator="ehr",
                    options={"hospitals": 4, "persons": 800, "multi_share": 0.3})
    fed = load_federation(dc)
    assert fed.has_persons and fed.num_silos == 4 and fed.feature_names == list(FEATURES)
    assert fed.meta["uncharged"] == []  # declared reference scaling: nothing read
    assert fed.meta["simulated"] is True and "public by construction" in fed.meta["note"]
    assert fed.meta["parameters"]["multi_share"] == 0.3
    assert sorted(set(np.concatenate([s.y_train for s in fed.silos]).tolist())) == [0, 1]
    again = load_federation(dc)  # deterministic in the seed
    assert all(np.array_equal(s.person_train, t.person_train)
               for s, t in zip(fed.silos, again.silos))


def test_features_are_declared_so_default_scaling_costs_nothing():
    raw_units = ehr_silos(persons=600, standardize="none")
    scaled = ehr_silos(persons=600)
    j = FEATURES.index("creatinine")
    centre, scale, lower, upper, _ = REFERENCE["creatinine"]
    for a, b in zip(raw_units.silos, scaled.silos):
        assert np.allclose(b.X_train[:, j], (a.X_train[:, j] - centre) / scale, atol=1e-12)
        assert a.X_train[:, j].min() >= lower and a.X_train[:, j].max() <= upper
        binary = [FEATURES.index(f) for f in ("female", "ckd", "emergency")]
        assert np.array_equal(a.X_train[:, binary], b.X_train[:, binary])
    # declared bounds make private statistics possible, planned (and charged) first
    raw = ehr_silos_raw(persons=600).with_targets(PrivacyTarget(1.0, 1e-5))
    plan = plan_preprocessing(raw, PreprocessSpec.of("private", "auto"))
    assert all(plan.events[name] is not None for name in raw.names)


def test_the_example_schema_declares_the_generators_constants():
    schema = load_schema(EXAMPLE / "ehr_schema.toml")
    cols = {c.name: c for c in schema.columns}
    for name, (centre, scale, lower, upper, _) in REFERENCE.items():
        c = cols[name]
        assert (c.mean, c.scale, c.lower, c.upper) == (centre, scale, lower, upper), name
    assert {c.name for c in schema.columns} == {*FEATURES, "sex"} - {"female"}


@pytest.mark.parametrize("options, name", [
    ({"hospitals": 2}, "hospitals"), ({"hospitals": 11}, "hospitals"),
    ({"hospitals": 4.5}, "hospitals"), ({"persons": 30}, "persons"),
    ({"persons": 10**8}, "persons"),
    ({"mean_visits": 0.5}, "mean_visits"), ({"mean_visits": float("nan")}, "mean_visits"),
    ({"multi_share": -0.1}, "multi_share"), ({"multi_share": 1.5}, "multi_share"),
    ({"mean_visits": 1, "multi_share": 0.2}, "multi_share"),
    ({"person_effect": -1}, "person_effect"), ({"heterogeneity": "high"}, "heterogeneity"),
    ({"task": "regression"}, "task"), ({"test_fraction": 1.0}, "test_fraction"),
])
def test_bad_options_name_the_option(options, name):
    dc = DataConfig(source="synthetic", generator="ehr", options=options)
    with pytest.raises(ConfigError, match=rf"data\.options\.{name}\b"):
        load_raw(dc)


def test_a_misspelt_option_gets_a_hint():
    with pytest.raises(ConfigError, match="did you mean 'multi_share'"):
        load_raw(DataConfig(source="synthetic", generator="ehr", options={"multishare": 0.2}))


def test_the_example_export_is_small_messy_and_what_its_comment_says():
    path = EXAMPLE / "visits.csv"
    assert path.stat().st_size <= 300_000
    df = pd.read_csv(path, dtype={"patient_id": str})
    assert df["patient_id"].map(lambda v: bool(re.fullmatch(r"P\d{6}", v))).all()
    assert pd.to_datetime(df["admit_date"], format="%Y-%m-%d").notna().all()
    per = df.groupby("patient_id")["hospital"].nunique()
    assert 0.1 < (per >= 2).mean() < 0.3 and per.max() <= 3
    assert 0 < df[["creatinine", "hemoglobin", "glucose"]].isna().sum().sum() < 0.05 * len(df) * 3
    # the file is the generator's output (ehr.toml names the call); values within rounding
    fresh = ehr_table(hospitals=5, persons=600, seed=0)
    assert list(df.columns) == list(fresh.columns) and len(df) == len(fresh)
    assert (df["patient_id"] == fresh["patient_id"]).all()
    assert (df["hospital"] == fresh["hospital"]).all()
    for col in ("age", "sbp", "creatinine", "glucose", "readmit_30d"):
        a, b = df[col].to_numpy(float), fresh[col].to_numpy(float, na_value=np.nan)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], atol=1e-6)


def test_the_csv_writer_refuses_a_bad_missing_share(tmp_path):
    with pytest.raises(ConfigError, match="missing_share"):
        write_ehr_csv(tmp_path / "x.csv", persons=200, missing_share=0.7)
    assert not (tmp_path / "x.csv").exists()
    out = write_ehr_csv(tmp_path / "x.csv", hospitals=3, persons=200, seed=2)
    assert pd.read_csv(out)["hospital"].nunique() == 3


def test_the_example_config_loads_without_person_ids_as_features():
    cfg = load_config(EXAMPLE / "ehr.toml")
    assert cfg.privacy.unit == "person" and cfg.data.person_column == "patient_id"
    fed = load_federation(cfg.data)
    assert fed.num_silos == 5 and "patient_id" not in fed.feature_names
    assert not any(n.startswith("admit_date") for n in fed.feature_names)
    assert fed.meta["uncharged"] == []  # declared schema: preprocessing costs nothing


def test_the_example_config_gives_person_ids_split_by_person():
    fed = load_federation(load_config(EXAMPLE / "ehr.toml").data)
    assert fed.has_persons
    train = set(np.concatenate(_all_ids(fed, "train")).tolist())
    test = set(np.concatenate(_all_ids(fed, "test")).tolist())
    assert not train & test
    ids = [set(np.concatenate([s.person_train, s.person_test]).tolist()) for s in fed.silos]
    assert any(ids[i] & ids[j] for i in range(len(ids)) for j in range(i + 1, len(ids)))


@pytest.mark.parametrize("loader, rows", [(D.load_heart_disease, 920), (D.load_school, 15362)])
def test_one_row_per_person_data_gets_row_ids_as_person_ids(loader, rows):
    plain = loader()
    assert not plain.has_persons and "persons" not in plain.meta
    fed = loader(persons=True)
    assert fed.has_persons and fed.meta["persons"] == ONE_ROW_NOTE
    ids = np.concatenate([np.concatenate([s.person_train, s.person_test]) for s in fed.silos])
    assert len(ids) == rows and len(np.unique(ids)) == rows
    assert [s.n_persons for s in fed.silos] == [s.n_train for s in fed.silos]
    for s, t in zip(plain.silos, fed.silos):  # only ids were added
        assert np.array_equal(s.X_train, t.X_train) and np.array_equal(s.y_test, t.y_test)


def test_one_row_per_person_works_on_raw_federations():
    raw = one_row_per_person(D.load_heart_disease_raw())
    assert raw.has_persons and raw.meta["persons"] == ONE_ROW_NOTE
    assert raw.silos[1].person_train[0] == raw.silos[0].n_train + raw.silos[0].n_test
