"""Audits with teeth: what each audit mode certifies, flags and costs (figures printed and
written as JSON; the statistical guarantees are tested in tests/test_audit_server.py).

1. The default heart job (Local + FedAvg + MR-MTL, ε = 1, δ = 1e-4 per hospital):
   one training run (median of 3) beside
   - the server-view (white-box) one-run audit, default m: per hospital the rigorous
     bound, the estimate (95% lower end – point) and its ratio to the claim, the smallest
     true ε it detects, the one-run f-DP bound; wall time and its ratio to one run;
   - the model-view (black-box) one-run audit with canary records (the old default);
   - the self-test: the same server-view audit against noise ×½, ×¼, clipping off and
     replayed noise, which it must flag (true ε ≥ 2× the claim);
   - with --false N: N server-view audits of the real mechanism (m = 10,000), the number
     flagged at 95% (expected ≤ 5%).
2. School (139 schools, linear, FedAvg + MR-MTL, 30 rounds): the server-view audit.
3. `pandemic`: the node-level pandemic audits.
All on scratch stores (experiments, not releases).

Run:  .venv/bin/python benchmarks/bench_audit.py [--false 100] [--json audit.json]
      .venv/bin/python benchmarks/bench_audit.py pandemic
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

from silofl.audit import audit
from silofl.audit.selftest import self_test
from silofl.config import config_from_dict
from silofl.experiments.run import run
from silofl.io import json_safe

warnings.simplefilter("ignore")


def _f(x) -> str:
    return "—" if x is None else "inf" if x == float("inf") else f"{x:.3f}"


def server_rows(rep) -> list[dict]:
    out = []
    for r in rep.rows:
        d = r.details
        out.append({"silo": r.silo, "claimed": r.claimed_epsilon, "rigorous": r.lower_bound,
                    "estimate_low": d["estimate"]["epsilon_lower"],
                    "estimate": d["estimate"]["epsilon"],
                    "certified_share": d["estimate"]["epsilon_lower"] / r.claimed_epsilon,
                    "detects": d["detectable_epsilon"],
                    "one_run_fdp": d["one_run"]["gdp"]["epsilon"],
                    "one_run_dp": d["one_run"]["epsilon"], "violation": r.violation,
                    "canaries": d["canaries"]})
    return out


def show_server(title: str, rep, train_s: float | None = None) -> list[dict]:
    rows = server_rows(rep)
    ratio = f", {rep.seconds / train_s:.1f}x one training run" if train_s else ""
    print(f"\n{title}: {rep.seconds:.1f} s{ratio}; m = {rows[0]['canaries']} per silo")
    print(f"{'silo':<16}{'claimed':>9}{'rigorous':>10}{'est. low':>10}{'estimate':>10}"
          f"{'low/claim':>11}{'detects':>9}{'1-run f-DP':>12}{'flag':>6}")
    for r in rows[:8]:
        print(f"{r['silo']:<16}{r['claimed']:>9.3f}{r['rigorous']:>10.3f}"
              f"{_f(r['estimate_low']):>10}{_f(r['estimate']):>10}"
              f"{r['certified_share']:>11.2f}{_f(r['detects']):>9}{r['one_run_fdp']:>12.3f}"
              f"{'yes' if r['violation'] else 'no':>6}")
    if len(rows) > 8:
        print(f"... {len(rows)} silos: estimate low / claim min "
              f"{min(r['certified_share'] for r in rows):.2f} median "
              f"{statistics.median(r['certified_share'] for r in rows):.2f}; violations "
              f"{sum(r['violation'] for r in rows)}")
    return rows


def heart(false_runs: int) -> dict:
    cfg = config_from_dict({"budget": {"scratch": True}, "output": {"dir": ""}})
    times = []
    for _ in range(3):
        t = time.perf_counter()
        run(cfg)
        times.append(time.perf_counter() - t)
    train = statistics.median(times)
    print(f"heart default job, one training run (median of 3): {train:.2f} s")
    out: dict = {"training_seconds": train}
    rep = audit(cfg)
    out["server_one_run"] = {"seconds": rep.seconds,
                             "rows": show_server("server view (white box), one run", rep,
                                                 train)}
    rep = audit(cfg, view="model")
    print(f"\nmodel view (black box, canary records), one run: {rep.seconds:.1f} s; "
          "bounds " + ", ".join(f"{r.silo} {r.lower_bound:.3f}" for r in rep.rows))
    out["model_one_run"] = {"seconds": rep.seconds,
                            "bounds": {r.silo: r.lower_bound for r in rep.rows}}
    st = self_test(cfg)
    print(f"\nself-test ({st.seconds:.1f} s): mechanism, true ε, flagged per hospital")
    for name in dict.fromkeys(r.mechanism for r in st.rows):
        rs = [r for r in st.rows if r.mechanism == name]
        print(f"  {name:<26} claim {rs[0].claimed_epsilon:.2f} true ε "
              f"{_f(rs[0].true_epsilon):>6}  rigorous "
              + " ".join(_f(r.lower_bound) for r in rs) + "  estimate low "
              + " ".join(_f(r.estimate_lower) for r in rs) + "  flagged "
              + " ".join("yes" if r.flagged else "no" for r in rs)
              + ("" if all(r.passed for r in rs) else "  FAILED"))
    out["self_test"] = st.to_dict()
    if false_runs:
        flags = 0
        t = time.perf_counter()
        for _ in range(false_runs):
            flags += bool(audit(cfg, canaries=10_000).violations)
        print(f"\n{false_runs} server-view audits of the real mechanism (m = 10,000): "
              f"{flags} flagged at 95% family-wise ({time.perf_counter() - t:.0f} s)")
        out["false_violations"] = {"audits": false_runs, "flagged": flags}
    return out


def school() -> dict:
    cfg = config_from_dict({"data": {"source": "school"}, "model": {"name": "linear"},
                            "training": {"methods": ["fedavg", "mrmtl"], "rounds": 30},
                            "budget": {"scratch": True}, "output": {"dir": ""}})
    rep = audit(cfg)
    return {"seconds": rep.seconds,
            "rows": show_server("School, FedAvg + MR-MTL, server view, one run", rep)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="?", default="all", choices=["all", "heart", "pandemic"])
    ap.add_argument("--false", type=int, default=0, help="audits of the real mechanism")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args()
    if a.what == "pandemic":
        return pandemic()
    out = {"heart": heart(a.false)}
    if a.what == "all":
        out["school"] = school()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(json_safe(out, []), f, indent=1)


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
    main()
