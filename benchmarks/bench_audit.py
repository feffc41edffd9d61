"""Wall time and ε lower bound of one-run audits (figures printed, not asserted).

1. The default heart job (Local + FedAvg + MR-MTL, ε = 1, δ = 1e-4 per hospital). m = 1000
   canaries per silo is refused: every hospital has fewer training records (98–243), and
   canaries outnumbering the patients would change q and σ beyond the job being audited.
   So each hospital gets m = n_k canaries (about half of them included: the audited job
   trains on ~1.5·n_k rows, σ calibrated for that).
2. A School run (139 schools, linear model, FedAvg + MR-MTL), m = n_k canaries per school.
Both on scratch stores (experiments, not releases)."""

from __future__ import annotations

import time
import warnings

from silofl.audit import audit
from silofl.errors import ConfigError
from silofl.experiments.config import config_from_dict

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


if __name__ == "__main__":
    main()
