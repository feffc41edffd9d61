"""Wall time and ε lower bound of one-run audits (figures printed, not asserted).

1. The default heart job (Local + FedAvg + MR-MTL, ε = 1, δ = 1e-4 per hospital). m = 1000
   canaries per silo is refused: every hospital has fewer training records (98–243), and
   canaries outnumbering the patients would change q and σ beyond the job being audited.
   So each hospital gets m = n_k canaries (about half of them included: the audited job
   trains on ~1.5·n_k rows, σ calibrated for that).
2. A School run (139 schools, linear model, FedAvg + MR-MTL), m = n_k canaries per school.
3. The node-level pandemic pipeline (`silofl pandemic audit`): a synthetic outbreak of 10k
   persons in 4 regions (seed 3), the default recipe (MR-MTL, S = 20, b = 512, 2 rounds,
   ε = 5), m = 1000 canary persons in the largest region under each adjacency; then the
   multi-run audit with 50 + 50 jobs (node+edges).
All on scratch stores (experiments, not releases)."""

from __future__ import annotations

import time
import warnings

from silofl.audit import audit
from silofl.config import config_from_dict
from silofl.errors import ConfigError

warnings.simplefilter("ignore")


def show(title, rep):
    print(f"\n{title}: {rep.seconds:.2f} s wall, {rep.kind}, {rep.confidence:.0%} confidence")
    # acc: share of correct guesses when guessing every canary (k = m/2 each side), per
    # score: 0.5 is chance; the bound needs far more than chance on few guesses
    print(f"{'silo':<16}{'m':>6}{'in':>6}{'acc black':>11}{'acc white':>11}"
          f"{'claimed ε':>11}{'lower bound':>13}")
    for r in rep.rows[:8]:
        d = r.details
        acc = {t["score"]: t["correct"] / t["guesses"] for t in d["tries"]}  # last k wins
        print(f"{r.silo:<16}{d['canaries']:>6}{d['included']:>6}{acc['black-box']:>11.3f}"
              f"{acc['white-box']:>11.3f}{r.claimed_epsilon:>11.3f}{r.lower_bound:>13.3f}")
    if len(rep.rows) > 8:
        lbs = [r.lower_bound for r in rep.rows]
        print(f"... {len(rep.rows)} silos: max lower bound {max(lbs):.3f}, "
              f"violations {len(rep.violations)}")


def main():
    heart = config_from_dict({"budget": {"scratch": True}, "output": {"dir": ""}})
    try:
        audit(heart, canaries=1000)
    except ConfigError as e:
        print(f"m = 1000 on heart: refused ({e})")
    t = time.perf_counter()
    show("heart, default job, m = n_k per hospital", audit(heart))
    print(f"(total {time.perf_counter() - t:.2f} s)")
    school = config_from_dict({"data": {"source": "school"}, "model": {"name": "linear"},
                               "training": {"methods": ["fedavg", "mrmtl"], "rounds": 30},
                               "budget": {"scratch": True}, "output": {"dir": ""}})
    show("School, FedAvg + MR-MTL, m = n_k per school", audit(school))
    pandemic()


def pandemic():
    from silofl.pandemic.audit import audit_pandemic
    from silofl.pandemic.pipeline import PandemicConfig
    from silofl.pandemic.regions import region_groups
    from silofl.pandemic.synth import generate_outbreak
    data = generate_outbreak(persons=10_000, regions=4, seed=3).to_pandemic_data()
    big = max(region_groups(data, PandemicConfig()), key=lambda g: g.n)
    for adjacency in ("node+edges", "node"):
        rep = audit_pandemic(data, PandemicConfig(adjacency=adjacency), region=big.name,
                             canaries=min(1000, big.n))
        r, d = rep.rows[0], rep.rows[0].details
        acc = {t["k"]: t["correct"] / t["guesses"] for t in d["tries"]}
        print(f"\npandemic one-run ({adjacency}), {r.silo}: {rep.seconds:.2f} s, m = "
              f"{d['canaries']} ({d['included']} in), accuracy guessing all "
              f"{acc[max(acc)]:.3f}, claimed ε {r.claimed_epsilon:.3f}, lower bound "
              f"{r.lower_bound:.3f}")
    rep = audit_pandemic(data, PandemicConfig(), region=big.name, kind="multi-run", runs=50)
    r = rep.rows[0]
    print(f"pandemic multi-run (node+edges, 50 + 50 jobs), {r.silo}: {rep.seconds:.1f} s, "
          f"claimed ε {r.claimed_epsilon:.3f}, lower bound {r.lower_bound:.3f} "
          f"({r.details['statistic']})")


if __name__ == "__main__":
    import sys
    pandemic() if sys.argv[1:] == ["pandemic"] else main()
