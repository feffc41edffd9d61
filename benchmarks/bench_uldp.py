"""ULDP-FL weighting (method "uldp") on a small synthetic EHR-like federation: accuracy of
uniform (declared M) and linked (record-proportion) weights against person-level FedAvg,
and what each run guarantees a person treated at several hospitals (figures printed, not
asserted; issue 23).

Data: `--persons` persons, `--silos` hospitals; 20% of persons are treated at 2–3 of them;
each (person, hospital) pair has 1 + Poisson(4) visits (mean 5); a visit's features are the
person's own vector plus noise, its binary outcome depends on the person's vector (logistic).
Test rows: fresh persons per hospital. Every silo has the same target (ε, δ = 1e-5).

The last variant samples persons at q = 0.25 per round, the same in every silo (keyed PRF).

Guarantees printed, per run, for a person in M = 3 silos (the most any person is in here):
* uldp: the aggregate's R Gaussian rounds (`privacy.uldp`), whatever M — and each silo's
  own figure if SecAgg+ fails (noise σ/√K);
* fedavg at person level: each silo's own guarantee ε_k, and the consortium-wide one, the
  PLD composition of the M silos' ledgers (a person in 3 silos is in 3 mechanisms).

Run: .venv/bin/python benchmarks/bench_uldp.py [--persons 3000] [--silos 5] [--rounds 40]
     [--epsilon 1,4] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import time

import dp_accounting as dpa
import numpy as np

from silofl.algorithms import make_algorithm
from silofl.data.federation import Federation, Silo
from silofl.models import make_model
from silofl.privacy.ledger import tightest
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.plan import TrainingConfig
from silofl.runtime.simulator import simulate

DIM = 20
DELTA = 1e-5


def ehr_like(persons: int, silos: int, seed: int, eps: float) -> Federation:
    """The federation described in the module docstring."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=DIM) / np.sqrt(DIM) * 2.5
    parts: dict[int, list] = {k: [] for k in range(silos)}
    for p in range(persons):
        z = rng.normal(size=DIM)
        m = int(rng.choice([2, 3])) if rng.random() < 0.2 else 1
        for k in rng.choice(silos, size=m, replace=False):
            r = 1 + rng.poisson(4)
            X = z + 0.5 * rng.normal(size=(r, DIM))
            y = (rng.random(r) < 1 / (1 + np.exp(-X @ beta))).astype(int)
            parts[k].append((X, y, np.full(r, p)))
    out = []
    for k, rows in parts.items():
        X = np.concatenate([r[0] for r in rows])
        y = np.concatenate([r[1] for r in rows])
        ids = np.concatenate([r[2] for r in rows])
        Xt = rng.normal(size=(1000, DIM)) * np.sqrt(1.25)
        yt = (rng.random(1000) < 1 / (1 + np.exp(-Xt @ beta))).astype(int)
        out.append(Silo(f"h{k}", X, y, Xt, yt, PrivacyTarget(eps, DELTA), person_train=ids,
                        person_test=np.arange(1000) + 10 ** 7))
    return Federation(out, [f"x{i}" for i in range(DIM)], "binary", 2)


def run_one(fed: Federation, method: str, eps: float, rounds: int, seed: int,
            **kw) -> dict:
    """One run; its accuracy and guarantees."""
    alg = make_algorithm(method, **kw)
    uldp = method == "uldp"
    cfg = TrainingConfig(rounds=rounds, batch_size=64, lr=2.0 if uldp else 0.5, clip=1.0,
                         seed=seed, noise="seeded", privacy_unit="person",
                         private=eps > 0, local_epochs=1.0)
    t0 = time.perf_counter()
    res = simulate(fed, make_model("logistic", DIM), alg, cfg)
    out = {"acc": res.final_pooled, "s": time.perf_counter() - t0}
    if eps <= 0:
        return out
    if uldp:
        rep = res.plans[0].consortium
        out.update(sigma=rep["aggregate_noise_multiplier"], eps_person=rep["consortium_epsilon"],
                   eps_share=rep["share_epsilon"])
    else:  # a person in 3 silos: the composition of the 3 largest ledgers
        spent = sorted((led.spent_event for led in res.ledgers),
                       key=lambda e: tightest(e, DELTA)[0])[-3:]
        out.update(sigma=res.plans[0].noise_multiplier,
                   eps_silo=max(led.epsilon() for led in res.ledgers),
                   eps_person=tightest(dpa.ComposedDpEvent(spent), DELTA)[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persons", type=int, default=3000)
    ap.add_argument("--silos", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--epsilon", default="1,4")
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args()
    variants = [("fedavg", {}), ("uldp", {"uldp_weighting": "uniform", "persons_in_silos": 3}),
                ("uldp", {"uldp_weighting": "uniform"}),
                ("uldp", {"uldp_weighting": "linked"}),
                ("uldp", {"uldp_weighting": "linked", "uldp_sample_rate": 0.25})]
    for eps in [0.0] + [float(e) for e in a.epsilon.split(",")]:
        for method, kw in variants:
            rows = []
            for seed in [int(s) for s in a.seeds.split(",")]:
                fed = ehr_like(a.persons, a.silos, seed, eps if eps > 0 else 1.0)
                rows.append(run_one(fed, method, eps, a.rounds, seed, **kw))
            acc = np.array([r["acc"] for r in rows])
            name = method + ("" if not kw else "[" + ", ".join(
                f"{k.replace('uldp_', '')}={v}" for k, v in kw.items()) + "]")
            extra = {k: np.mean([r[k] for r in rows]) for k in rows[0] if k not in ("acc", "s")}
            print(f"ε={eps:g} {name:22s} acc {acc.mean():.3f} ± {acc.std():.3f} "
                  + " ".join(f"{k} {v:.3g}" for k, v in extra.items())
                  + f"  ({np.mean([r['s'] for r in rows]):.1f} s/run)", flush=True)


if __name__ == "__main__":
    main()
