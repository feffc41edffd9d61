"""A simulated EHR consortium: persons with several visits, some treated at 2–3 hospitals.

Everything here is SIMULATED. No real person stands behind any row, so the data and every
statistic of them (visit counts, how many persons two hospitals share) are public by
construction and reporting them costs no privacy. On real data such overlap counts are
data-dependent and must be released privately or kept at the silos.

The model (``generator = "ehr"`` under ``[data] source = "synthetic"``; `ehr_silos`):

* Hospitals h = 0..H-1: popularity π ~ Dirichlet(3·1_H) (unequal sizes); a case mix (age
  shift, log-odds shifts of the chronic conditions); lab calibration offsets (what a
  hospital's analyser adds to creatinine, haemoglobin, glucose, temperature, blood
  pressure); a practice (baseline log-odds α_h and slopes γ_h of the visit effects). All
  hospital effects scale with `heterogeneity`: they are why a personal model helps.
* Persons p = 0..P-1 (global ids): home hospital ~ π; age ~ N(62 + 6·het·a_h, 14) clipped
  to [18, 95]; female ~ B(0.5); diabetes, heart_failure, copd, ckd ~ B(sigmoid(b_c +
  0.03·(age - 62) + het·c_hc)); an unobserved frailty u_p ~ N(0, person_effect²). All fixed
  per person.
* Visits: V_p = 1 + Poisson(mean_visits - 1). A share `multi_share` of persons (drawn
  among those with V_p ≥ 2 with probability multi_share / P(V ≥ 2), so the share is exact in
  expectation and the visit counts are untouched) are treated at 2 hospitals, or 3 (30% of
  them, when V_p ≥ 3 and H ≥ 3): the others ~ π without the home; each of their hospitals
  gets one visit, every further visit goes home with probability 1/2, else to one of the
  others. Visit days are uniform over two years.
* Each visit: an acute severity s ~ N(0, 1) drives the true vitals and labs (plus the
  person's age, sex and conditions); what the hospital records is the true value plus
  measurement noise plus its calibration offset, clipped to the declared bounds.
* Outcome (30-day readmission, binary): B(sigmoid(α_h - 2.2 + β·person features +
  γ_h·true visit values + u_p)). The frailty and the person features make a person's rows
  correlated: the reason person-level DP matters.

`ehr_silos` gives a `Federation` whose rows carry global person ids (`Silo.person_train`,
`person_test`): a person seen at two hospitals has the same id in both. The train/test split
is by person (all rows of a test person are test rows, in every hospital). Features are
recorded in raw units and declared (`column_specs`: the public centre, scale and bounds of
`REFERENCE`, no statistic of the data), so the default preprocessing maps them to
(value - centre) / scale at no cost; binary columns stay 0/1. `ehr_silos_raw` stops before
preprocessing (what ``[data]`` loads). `ehr_table` / `write_ehr_csv` give the same
simulation as a "messy" export in raw units (text patient ids, a hospital column, dates, a
few missing lab values) for the table reader; ``examples/ehr/`` holds one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from silofl.data.federation import Federation, Silo
from silofl.data.preprocess import PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.schema import ColumnSpec
from silofl.errors import ConfigError
from silofl.io import write_text_atomic

HOSPITAL_NAMES = ("northgate", "riverside", "st-anne", "lakeview", "hillcrest", "eastbrook",
                  "westfield", "southmead", "parkside", "harbour")
MIN_HOSPITALS, MAX_HOSPITALS = 3, len(HOSPITAL_NAMES)
MIN_PERSONS_PER_HOSPITAL = 20
MAX_PERSONS = 1_000_000  # the per-person loops and the rows must fit a laptop
CONDITIONS = ("diabetes", "heart_failure", "copd", "ckd")
#: baseline log-odds of each chronic condition at age 62
_CONDITION_BASE = (-1.4, -2.2, -2.0, -2.0)
#: numeric features: (reference centre, reference scale, lower, upper, unit). Public
#: constants (typical adult values and generous clinical plausibility limits), not
#: statistics of any data: declared in the silos' column specs, so the default
#: preprocessing maps a value to (value - centre) / scale at no privacy cost and private
#: preprocessing has the bounds it needs. Recorded values are clipped to [lower, upper].
REFERENCE = {
    "age": (60.0, 15.0, 18.0, 100.0, "years"),
    "sbp": (125.0, 20.0, 60.0, 240.0, "mm Hg (systolic blood pressure)"),
    "heart_rate": (80.0, 15.0, 30.0, 180.0, "beats per minute"),
    "temperature": (37.0, 0.7, 34.0, 41.0, "°C"),
    "creatinine": (1.0, 0.5, 0.2, 10.0, "mg/dl"),
    "hemoglobin": (13.5, 2.0, 5.0, 20.0, "g/dl"),
    "glucose": (110.0, 40.0, 40.0, 500.0, "mg/dl"),
    "los_days": (4.0, 3.0, 1.0, 60.0, "days (length of stay)"),
}
FEATURES = ("age", "female", *CONDITIONS, "emergency", "sbp", "heart_rate", "temperature",
            "creatinine", "hemoglobin", "glucose", "los_days")
#: measured with noise and a hospital calibration offset: (noise sd, offset sd at het = 1)
_MEASURED = {"sbp": (6.0, 4.0), "heart_rate": (4.0, 2.0), "temperature": (0.15, 0.2),
             "creatinine": (0.08, 0.12), "hemoglobin": (0.4, 0.4), "glucose": (8.0, 8.0)}
#: visit effects on the outcome (per reference unit, 1 for emergency), varied per hospital
_VISIT_EFFECTS = {"creatinine": 0.7, "hemoglobin": -0.5, "los_days": 0.6, "emergency": 0.8,
                  "heart_rate": 0.4}
#: person effects on the outcome (age per reference unit, conditions 0/1)
_PERSON_EFFECTS = {"age": 0.6, "diabetes": 0.5, "heart_failure": 1.0, "copd": 0.7,
                   "ckd": 0.7}
_BASE_LOGIT = -2.2
DAYS = 730  # visits fall in two years
_START = np.datetime64("2021-01-01")


@dataclass(frozen=True)
class EhrOptions:
    """Validated options of the simulation (see the module docstring)."""

    hospitals: int = 5
    persons: int = 4000
    mean_visits: float = 5.0
    multi_share: float = 0.2
    person_effect: float = 1.0
    heterogeneity: float = 1.0
    seed: int = 0


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_num(v: object) -> bool:
    ok = _is_int(v) or isinstance(v, (float, np.floating))
    return ok and bool(np.isfinite(float(v)))  # type: ignore[arg-type]


def check_options(hospitals: int = 5, persons: int = 4000, mean_visits: float = 5.0,
                  multi_share: float = 0.2, person_effect: float = 1.0,
                  heterogeneity: float = 1.0, seed: int = 0) -> EhrOptions:
    """Validate the simulation's options.

    Returns
    -------
    EhrOptions
        The options as given (numbers normalised to int/float).

    Raises
    ------
    ConfigError
        The first bad option, named as ``data.options.<name>``, with the allowed range.
    """
    def bad(name: str, value: object, want: str) -> ConfigError:
        return ConfigError(f"data.options.{name} = {value!r} for generator 'ehr': {want}")

    if not _is_int(hospitals) or not MIN_HOSPITALS <= hospitals <= MAX_HOSPITALS:
        raise bad("hospitals", hospitals, f"give an integer from {MIN_HOSPITALS} to "
                  f"{MAX_HOSPITALS} (the number of hospitals, i.e. silos)")
    least = MIN_PERSONS_PER_HOSPITAL * hospitals
    if not _is_int(persons) or not least <= persons <= MAX_PERSONS:
        raise bad("persons", persons, f"give an integer from {least} "
                  f"({MIN_PERSONS_PER_HOSPITAL} per hospital, so every hospital keeps "
                  f"training rows of both outcomes) to {MAX_PERSONS:,}")
    if not _is_num(mean_visits) or not 1.0 <= mean_visits <= 50.0:
        raise bad("mean_visits", mean_visits, "give a number in [1, 50] (visits per person: "
                  "1 + Poisson(mean_visits - 1))")
    if not _is_num(multi_share) or not 0.0 <= multi_share <= 1.0:
        raise bad("multi_share", multi_share, "give a share in [0, 1] (persons treated at "
                  "2-3 hospitals)")
    p2 = 1.0 - np.exp(-(float(mean_visits) - 1.0))  # P(V >= 2): only they can be shared
    if multi_share > p2 + 1e-12:
        raise bad("multi_share", multi_share, f"with mean_visits = {mean_visits} only "
                  f"{p2:.3f} of persons have 2 or more visits, and a person at 2 hospitals "
                  "needs one visit at each; lower multi_share or raise mean_visits")
    for name, v in (("person_effect", person_effect), ("heterogeneity", heterogeneity)):
        if not _is_num(v) or not 0.0 <= v <= 5.0:
            raise bad(name, v, "give a number in [0, 5] (0 switches the effect off)")
    if not _is_int(seed):
        raise bad("seed", seed, "give an integer")
    return EhrOptions(int(hospitals), int(persons), float(mean_visits), float(multi_share),
                      float(person_effect), float(heterogeneity), int(seed))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


@dataclass
class EhrSimulation:
    """One simulated consortium, row by row (R visits in all).

    Attributes
    ----------
    options : EhrOptions
        What was simulated.
    names : tuple of str
        (H,) hospital names.
    person, hospital, day : numpy.ndarray
        (R,) int64: global person id, hospital index, visit day (0..DAYS-1).
    values : dict of str to numpy.ndarray
        (R,) float64 per feature of `FEATURES`, as recorded (raw units; binary 0/1).
    y : numpy.ndarray
        (R,) int64 outcome (1 = readmitted).
    hospitals_of : list of tuple of int
        (P,) the hospitals each person was treated at, home first.
    """

    options: EhrOptions
    names: tuple[str, ...]
    person: np.ndarray
    hospital: np.ndarray
    day: np.ndarray
    values: dict[str, np.ndarray]
    y: np.ndarray
    hospitals_of: list[tuple[int, ...]]


def _hospital_effects(rng: np.random.Generator, o: EhrOptions) -> dict[str, np.ndarray]:
    H, het = o.hospitals, o.heterogeneity
    eff = {"popularity": rng.dirichlet(np.full(H, 3.0)),
           "age_shift": het * 6.0 * rng.standard_normal(H),
           "case_mix": het * 0.4 * rng.standard_normal((H, len(CONDITIONS))),
           "alpha": het * 0.5 * rng.standard_normal(H)}
    for name, (_, off) in _MEASURED.items():
        eff[f"offset_{name}"] = het * off * rng.standard_normal(H)
    base = np.array(list(_VISIT_EFFECTS.values()))
    eff["gamma"] = base + het * 0.35 * rng.standard_normal((H, len(base)))
    return eff


def _person_hospitals(rng: np.random.Generator, o: EhrOptions, home: np.ndarray,
                      visits: np.ndarray, pop: np.ndarray) -> list[tuple[int, ...]]:
    """Each person's hospitals, home first (2-3 for a share `multi_share` of persons)."""
    p2 = 1.0 - np.exp(-(o.mean_visits - 1.0))
    p_multi = o.multi_share / p2 if p2 > 0 else 0.0
    multi = (visits >= 2) & (rng.random(o.persons) < p_multi)
    three = multi & (visits >= 3) & (o.hospitals >= 3) & (rng.random(o.persons) < 0.3)
    out: list[tuple[int, ...]] = []
    for p in range(o.persons):
        h = int(home[p])
        if not multi[p]:
            out.append((h,))
            continue
        w = pop.copy()
        w[h] = 0.0
        extra = rng.choice(o.hospitals, size=2 if three[p] else 1, replace=False, p=w / w.sum())
        out.append((h, *(int(e) for e in extra)))
    return out


def _visit_hospitals(rng: np.random.Generator, visits: np.ndarray,
                     hospitals_of: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(R,) person and hospital of every visit: one visit at each of a person's hospitals,
    the rest home with probability 1/2, else at one of the others."""
    person = np.repeat(np.arange(len(visits), dtype=np.int64), visits)
    hospital = np.empty(len(person), np.int64)
    start = 0
    for p, hs in enumerate(hospitals_of):
        v = int(visits[p])
        if len(hs) == 1:
            hospital[start:start + v] = hs[0]
        else:
            rest = v - len(hs)
            home = rng.random(rest) < 0.5
            other = rng.choice(np.asarray(hs[1:]), size=rest)
            hospital[start:start + v] = rng.permutation(
                np.concatenate([np.asarray(hs), np.where(home, hs[0], other)]))
        start += v
    return person, hospital


def _persons(rng: np.random.Generator, o: EhrOptions, eff: dict[str, np.ndarray]
             ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Person-level features (P,), the frailty (P,) and the home hospital (P,)."""
    home = rng.choice(o.hospitals, size=o.persons, p=eff["popularity"])
    age = np.clip(62.0 + eff["age_shift"][home] + 14.0 * rng.standard_normal(o.persons),
                  18.0, 95.0).round()
    feats = {"age": age, "female": (rng.random(o.persons) < 0.5).astype(float)}
    for j, (c, b) in enumerate(zip(CONDITIONS, _CONDITION_BASE)):
        logit = b + 0.03 * (age - 62.0) + eff["case_mix"][home, j]
        feats[c] = (rng.random(o.persons) < _sigmoid(logit)).astype(float)
    frailty = o.person_effect * rng.standard_normal(o.persons)
    return feats, frailty, home


def _true_visit_values(rng: np.random.Generator, pf: dict[str, np.ndarray]
                       ) -> dict[str, np.ndarray]:
    """True vitals and labs of R visits from the person features `pf` (already per row)."""
    n = len(pf["age"])
    s = rng.standard_normal(n)  # acute severity
    z = rng.standard_normal
    hf, ckd, fem = pf["heart_failure"], pf["ckd"], pf["female"]
    emergency = (rng.random(n) < _sigmoid(-0.4 + 1.2 * s + 0.3 * hf)).astype(float)
    return {
        "emergency": emergency,
        "sbp": 125.0 + 0.35 * (pf["age"] - 60.0) + 6.0 * ckd - 4.0 * s + 12.0 * z(n),
        "heart_rate": 80.0 + 7.0 * s + 5.0 * hf + 9.0 * z(n),
        "temperature": 37.0 + 0.35 * s + 0.35 * z(n),
        "creatinine": (0.9 + 0.9 * ckd + 0.004 * (pf["age"] - 60.0))
        * np.exp(0.12 * s + 0.15 * z(n)),
        "hemoglobin": 14.2 - 1.3 * fem - 1.2 * ckd - 0.3 * s + 1.0 * z(n),
        "glucose": np.maximum(100.0 + 45.0 * pf["diabetes"] + 8.0 * s + 18.0 * z(n), 40.0),
        "los_days": 1.0 + rng.poisson(np.exp(0.9 + 0.35 * s + 0.25 * hf + 0.2 * emergency)),
    }


def _reference(name: str, v: np.ndarray) -> np.ndarray:
    centre, scale = REFERENCE[name][:2]
    return (v - centre) / scale


def simulate_ehr(hospitals: int = 5, persons: int = 4000, mean_visits: float = 5.0,
                 multi_share: float = 0.2, person_effect: float = 1.0,
                 heterogeneity: float = 1.0, seed: int = 0) -> EhrSimulation:
    """Simulate the consortium (the model of the module docstring), deterministic in `seed`
    (``numpy.random.default_rng([seed, 0])``).

    Returns
    -------
    EhrSimulation
        Every visit: person, hospital, day, recorded values, outcome.

    Raises
    ------
    ConfigError
        A bad option (named).
    """
    o = check_options(hospitals, persons, mean_visits, multi_share, person_effect,
                      heterogeneity, seed)
    rng = np.random.default_rng([o.seed, 0])
    eff = _hospital_effects(rng, o)
    pf, frailty, home = _persons(rng, o, eff)
    visits = 1 + rng.poisson(o.mean_visits - 1.0, size=o.persons)
    hospitals_of = _person_hospitals(rng, o, home, visits, eff["popularity"])
    person, hospital = _visit_hospitals(rng, visits, hospitals_of)
    rows = {k: v[person] for k, v in pf.items()}
    true = _true_visit_values(rng, rows)
    logit = _BASE_LOGIT + eff["alpha"][hospital] + frailty[person]
    for name, b in _PERSON_EFFECTS.items():
        logit += b * (_reference(name, rows[name]) if name in REFERENCE else rows[name])
    for j, name in enumerate(_VISIT_EFFECTS):
        x = _reference(name, true[name]) if name in REFERENCE else true[name]
        logit += eff["gamma"][hospital, j] * x
    y = (rng.random(len(person)) < _sigmoid(logit)).astype(np.int64)
    recorded = dict(true)
    for name, (noise, _) in _MEASURED.items():
        recorded[name] = (true[name] + noise * rng.standard_normal(len(person))
                          + eff[f"offset_{name}"][hospital])
    for name, (_, _, lower, upper, _) in REFERENCE.items():  # as a reader clips to bounds
        if name in recorded:
            recorded[name] = np.clip(recorded[name], lower, upper)
    values = {f: (rows[f] if f in rows else recorded[f]) for f in FEATURES}
    day = rng.integers(0, DAYS, size=len(person))
    return EhrSimulation(o, HOSPITAL_NAMES[:o.hospitals], person, hospital, day, values, y,
                         hospitals_of)


def overlap_statistics(sim: EhrSimulation) -> dict:
    """The realised overlap of a simulation (public: simulated persons).

    Returns
    -------
    dict
        ``persons``, ``rows``, ``mean_visits`` (rows per person), ``max_visits``,
        ``persons_by_hospital_count`` {k: persons at k hospitals}, ``multi_share``
        (share at ≥ 2), ``max_hospitals_per_person`` (the realised M), ``per_hospital``
        {name: {rows, persons, shared_persons (also seen elsewhere)}} and
        ``shared_pairs`` {"a|b": persons seen at both}.
    """
    k = np.array([len(hs) for hs in sim.hospitals_of])
    counts = np.bincount(sim.person, minlength=len(k))
    per = {}
    for h, name in enumerate(sim.names):
        at = np.unique(sim.person[sim.hospital == h])
        per[name] = {"rows": int((sim.hospital == h).sum()), "persons": int(len(at)),
                     "shared_persons": int((k[at] > 1).sum())}
    pairs: dict[str, int] = {}
    for hs in sim.hospitals_of:
        for i, a in enumerate(sorted(hs)):
            for b in sorted(hs)[i + 1:]:
                key = f"{sim.names[a]}|{sim.names[b]}"
                pairs[key] = pairs.get(key, 0) + 1
    return {"persons": int(len(k)), "rows": int(len(sim.person)),
            "mean_visits": float(counts.mean()), "max_visits": int(counts.max()),
            "persons_by_hospital_count": {int(j): int((k == j).sum()) for j in np.unique(k)},
            "multi_share": float((k > 1).mean()), "max_hospitals_per_person": int(k.max()),
            "per_hospital": per, "shared_pairs": dict(sorted(pairs.items()))}


def _design(sim: EhrSimulation) -> np.ndarray:
    """(R, d) recorded features in raw units (binary columns 0/1), columns in `FEATURES`."""
    return np.column_stack([sim.values[f] for f in FEATURES]).astype(np.float64)


def column_specs() -> dict[int, ColumnSpec]:
    """The declared spec of every feature column (index in `FEATURES`): numeric columns
    with the public `REFERENCE` centre/scale and bounds, binary columns 0/1.

    Returns
    -------
    dict of int to ColumnSpec
        {j: spec of FEATURES[j]}.
    """
    specs = {}
    for j, f in enumerate(FEATURES):
        if f in REFERENCE:
            centre, scale, lower, upper, unit = REFERENCE[f]
            specs[j] = ColumnSpec(f, "numeric", lower=lower, upper=upper, mean=centre,
                                  scale=scale, description=unit)
        else:
            specs[j] = ColumnSpec(f, "binary", description="0/1")
    return specs


def _meta(sim: EhrSimulation, test_fraction: float, n_test_persons: int) -> dict:
    return {
        "simulated": True,
        "generator": "ehr",
        "note": ("simulated EHR consortium (silofl.data.ehr): no real person behind any row; "
                 "the data and the overlap statistics below are public by construction, so "
                 "reporting them costs no privacy (on real data they would be private)"),
        "parameters": {**dataclasses.asdict(sim.options), "test_fraction": test_fraction},
        "overlap": overlap_statistics(sim),
        "person_split": (f"by person: {n_test_persons} of {sim.options.persons} persons "
                         "(all their rows, at every hospital) are test persons"),
        "person_ids": "global ints: a person seen at two hospitals has one id in both",
        "units": {f: REFERENCE[f][4] if f in REFERENCE else "0/1" for f in FEATURES},
        "target": "30-day readmission (simulated logistic outcome; 1 = readmitted)",
    }


def ehr_silos_raw(hospitals: int = 5, persons: int = 4000, mean_visits: float = 5.0,
                  multi_share: float = 0.2, person_effect: float = 1.0,
                  heterogeneity: float = 1.0, seed: int = 0, test_fraction: float = 0.2,
                  task: str = "binary") -> RawFederation:
    """`ehr_silos` before preprocessing: raw units, declared column specs (`column_specs`),
    ``simulated=True``. What ``[data] generator = "ehr"`` loads, so ``[data] standardize``
    (default "auto": the declared reference scaling, no cost) and "private" apply."""
    if task != "binary":
        raise ConfigError(f"data.options.task = {task!r} for generator 'ehr': the only task "
                          "is 'binary' (30-day readmission)")
    if not _is_num(test_fraction) or not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"data.options.test_fraction = {test_fraction!r} for generator "
                          "'ehr': give a share in (0, 1) of persons held out")
    sim = simulate_ehr(hospitals, persons, mean_visits, multi_share, person_effect,
                       heterogeneity, seed)
    split = np.random.default_rng([sim.options.seed, 1])
    n_test = int(round(test_fraction * sim.options.persons))
    is_test = np.zeros(sim.options.persons, bool)
    is_test[split.permutation(sim.options.persons)[:n_test]] = True
    X = _design(sim)
    silos = []
    for h, name in enumerate(sim.names):
        rows = np.flatnonzero(sim.hospital == h)
        rows = rows[split.permutation(len(rows))]  # no order by person or time
        tr, te = rows[~is_test[sim.person[rows]]], rows[is_test[sim.person[rows]]]
        silos.append(Silo(name, X[tr], sim.y[tr], X[te], sim.y[te],
                          person_train=sim.person[tr], person_test=sim.person[te]))
    return RawFederation(silos, list(FEATURES), "binary", num_classes=2,
                         specs=column_specs(), name="ehr-simulated",
                         meta=_meta(sim, float(test_fraction), n_test), simulated=True)


def ehr_silos(hospitals: int = 5, persons: int = 4000, mean_visits: float = 5.0,
              multi_share: float = 0.2, person_effect: float = 1.0,
              heterogeneity: float = 1.0, seed: int = 0, test_fraction: float = 0.2,
              task: str = "binary", standardize: str | bool = "auto") -> Federation:
    """The simulated EHR consortium as a federation: one silo per hospital, rows = visits.

    Parameters
    ----------
    hospitals : int, default 5
        Number of hospitals (silos), 3 to 10.
    persons : int, default 4000
        Number of persons (at least 20 per hospital).
    mean_visits : float, default 5
        Mean visits per person: each person has 1 + Poisson(mean_visits - 1).
    multi_share : float, default 0.2
        Share of persons treated at 2-3 hospitals (in expectation).
    person_effect : float, default 1
        Standard deviation of the unobserved person frailty on the outcome's log-odds.
    heterogeneity : float, default 1
        Scale of the hospital effects (case mix, calibration offsets, practice).
    seed : int, default 0
        Simulation from ``default_rng([seed, 0])``, the person split from
        ``default_rng([seed, 1])``.
    test_fraction : float, default 0.2
        Share of PERSONS held out (all their rows, at every hospital).
    task : {"binary"}
        The only task (readmission).
    standardize : str or bool, default "auto"
        "auto"/"declared": (value - centre) / scale with the public `REFERENCE`
        constants (no cost); "none": raw units; "uncharged": per-silo z-scores (listed
        in ``meta["uncharged"]``).

    Returns
    -------
    Federation
        Silos named after the hospitals; X (n_k, 14) float64 (`FEATURES`), y (n_k,) int64
        in {0, 1}; ``person_train`` / ``person_test`` (n_k,) int64 global person ids;
        ``meta`` says it is simulated, the parameters and the realised overlap.

    Raises
    ------
    ConfigError
        A bad option, named as ``data.options.<name>``.
    """
    raw = ehr_silos_raw(hospitals, persons, mean_visits, multi_share, person_effect,
                        heterogeneity, seed, test_fraction, task)
    return preprocess_without_budget(raw, PreprocessSpec.of(standardize, "auto"), "ehr_silos")


def ehr_table(hospitals: int = 5, persons: int = 4000, mean_visits: float = 5.0,
              multi_share: float = 0.2, person_effect: float = 1.0,
              heterogeneity: float = 1.0, seed: int = 0,
              missing_share: float = 0.02) -> pd.DataFrame:
    """The simulation as a real-looking export: one row per visit, sorted by date.

    Columns: ``patient_id`` (text "P000123", the global person id), ``hospital``,
    ``admit_date`` (YYYY-MM-DD), ``age`` (years), ``sex`` ("F"/"M"), the conditions and
    ``emergency`` (0/1), ``sbp``, ``heart_rate``, ``temperature``, ``creatinine``,
    ``hemoglobin``, ``glucose``, ``los_days`` in raw units (rounded as a record would be),
    and ``readmit_30d`` (0/1). A share `missing_share` of the lab cells (creatinine,
    hemoglobin, glucose) is left empty (missing at random, seeded).

    Returns
    -------
    pandas.DataFrame
        (R, 18) the visits.

    Raises
    ------
    ConfigError
        A bad option, named as ``data.options.<name>`` (or `missing_share`).
    """
    if not _is_num(missing_share) or not 0.0 <= missing_share < 0.5:
        raise ConfigError(f"missing_share = {missing_share!r}: give a share in [0, 0.5) of "
                          "lab values left empty")
    sim = simulate_ehr(hospitals, persons, mean_visits, multi_share, person_effect,
                       heterogeneity, seed)
    v = sim.values
    df = pd.DataFrame({
        "patient_id": [f"P{p:06d}" for p in sim.person],
        "hospital": np.asarray(sim.names)[sim.hospital],
        "admit_date": (_START + sim.day.astype("timedelta64[D]")).astype(str),
        "age": v["age"].astype(np.int64),
        "sex": np.where(v["female"] > 0, "F", "M"),
        **{c: v[c].astype(np.int64) for c in (*CONDITIONS, "emergency")},
        "sbp": v["sbp"].round().astype(np.int64),
        "heart_rate": v["heart_rate"].round().astype(np.int64),
        "temperature": v["temperature"].round(1),
        "creatinine": v["creatinine"].round(2),
        "hemoglobin": v["hemoglobin"].round(1),
        "glucose": pd.array(v["glucose"].round().astype(np.int64), dtype="Int64"),
        "los_days": v["los_days"].astype(np.int64),
        "readmit_30d": sim.y,
    })
    rng = np.random.default_rng([sim.options.seed, 2])
    for col in ("creatinine", "hemoglobin", "glucose"):
        df.loc[rng.random(len(df)) < missing_share, col] = pd.NA
    order = np.lexsort((sim.hospital, sim.day))
    return df.iloc[order].reset_index(drop=True)


def write_ehr_csv(path: str | Path, **options: object) -> Path:
    """Write `ehr_table` (**options: its keyword arguments) as a CSV, atomically.

    Returns
    -------
    pathlib.Path
        The path written.
    """
    df = ehr_table(**options)  # type: ignore[arg-type]
    write_text_atomic(path, df.to_csv(index=False), mkdir=True)
    return Path(path)


__all__ = ["EhrOptions", "EhrSimulation", "FEATURES", "REFERENCE", "HOSPITAL_NAMES",
           "check_options", "simulate_ehr", "overlap_statistics", "column_specs",
           "ehr_silos_raw", "ehr_silos", "ehr_table", "write_ehr_csv"]
