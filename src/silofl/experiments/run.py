"""One experiment run: every requested method on one federation, written to a run
directory with the resolved config, per-round history, ledgers, privacy report, summary
and a plot.

Validation, calibration and the budget preflight of *every* method happen before the run
directory is created or any training data is touched, so bad input leaves nothing
behind and spends nothing.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tomli_w

from silofl.algorithms import LAMBDA_METHODS
from silofl.experiments import build
from silofl.experiments.config import Config
from silofl.privacy import accounting, events
from silofl.runtime.plan import plan_silos
from silofl.runtime.simulator import RunResult, simulate


@dataclass
class RunReport:
    run_dir: Path | None
    config: Config
    results: list[RunResult]
    combined_privacy: list[dict]  # per silo: ε if every method's models are released

    def label(self, r: RunResult) -> str:
        m = r.method
        if m["name"] in LAMBDA_METHODS and "lam" in m:  # every λ method, not only MR-MTL
            return f"{m['name']}(λ={m['lam']:g})"
        return m["name"]

    def summary(self) -> dict:
        return {"run_dir": str(self.run_dir) if self.run_dir else None,
                "private": self.config.privacy.enabled,
                "methods": [{"method": self.label(r), **r.method, "metric": r.metric,
                             "pooled": r.final_pooled,
                             "per_silo": dict(zip(r.silos, r.final_per_silo)),
                             "seconds": r.seconds} for r in self.results],
                "combined_privacy": self.combined_privacy}


def run(cfg: Config, out_dir: Path | None = None,
        on_progress: Callable[[str, int, int, float], None] | None = None) -> RunReport:
    """Run every method in `cfg`. The run directory is `out_dir` (or [output].dir) plus
    [output].name; with no directory configured (output.dir = "") nothing is written."""
    # --- everything that can fail on bad input, before any data access ---------------
    fed = build.apply_privacy(build.load_federation(cfg.data), cfg)
    model = build.build_model(cfg, fed)
    algorithms = build.build_algorithms(cfg)
    tcfg = build.training_config(cfg)
    plans = [plan_silos(fed, alg, tcfg) for alg in algorithms]
    if tcfg.private:  # the whole experiment must fit each silo's budget, method by method
        from silofl.privacy.ledger import Ledger
        for alg_plans in plans:
            for p in alg_plans:
                Ledger(p.name, p.target, tcfg.accountant).preflight(p.declared)
    run_dir = _make_run_dir(cfg, out_dir)
    # --- training ---------------------------------------------------------------------
    results = []
    for alg, alg_plans in zip(algorithms, plans):
        label = alg.describe()["name"]

        def tick(t, pooled, _label=label):
            if on_progress:
                on_progress(_label, t, tcfg.rounds, pooled)
        results.append(simulate(
            fed, model, alg, tcfg, metric=cfg.model.metric or None, plans=alg_plans,
            ledger_dir=run_dir / "ledgers" / label if run_dir else None, on_round=tick))
    report = RunReport(run_dir, cfg, results, _combined(results))
    if run_dir:
        _write_outputs(report)
    return report


def _combined(results: list[RunResult]) -> list[dict]:
    """Honest total per silo when all methods' outputs are released: compose their ledgers."""
    if not results or results[0].ledgers is None:
        return []
    out = []
    for k, silo in enumerate(results[0].silos):
        counts = Counter()
        for r in results:
            counts += r.ledgers[k].spent_counts()
        target = results[0].ledgers[k].target
        eps = accounting.epsilons(events.compose(counts), target.delta)
        out.append({"silo": silo, "delta": target.delta, "epsilon_rdp": eps["rdp"],
                    "epsilon_pld": eps["pld"], "methods": len(results)})
    return out


def _make_run_dir(cfg: Config, out_dir: Path | None) -> Path | None:
    base = Path(out_dir) if out_dir is not None else (Path(cfg.output.dir) if cfg.output.dir else None)
    if base is None:
        return None
    name = cfg.output.name or time.strftime("%Y%m%d-%H%M%S")
    run_dir = base / name
    i = 1
    while run_dir.exists():
        run_dir = base / f"{name}-{i}"
        i += 1
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(tomli_w.dumps(_toml_safe(cfg.to_dict())))
    return run_dir


def _toml_safe(d):
    if isinstance(d, dict):
        return {k: _toml_safe(v) for k, v in d.items() if v is not None}
    return d


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(str(type(o)))


def _write_outputs(rep: RunReport) -> None:
    from silofl.experiments.report import plot_history
    d = rep.run_dir
    hist = {rep.label(r): {"metric": r.metric, "silos": r.silos, **r.history.to_dict()}
            for r in rep.results}
    (d / "history.json").write_text(json.dumps(hist, default=_json_default))
    privacy = {"accountant_for_calibration": rep.config.privacy.accountant,
               "neighbouring_relation": "add/remove one example",
               "note": ("Each method's ledger is its own training run. Releasing the models "
                        "of several methods composes their costs: see 'combined'."),
               "methods": {rep.label(r): r.privacy() for r in rep.results},
               "combined": rep.combined_privacy}
    (d / "privacy_report.json").write_text(json.dumps(privacy, indent=1, default=_json_default))
    (d / "summary.json").write_text(json.dumps(rep.summary(), indent=1, default=_json_default))
    plot_history(rep, d / "metric_over_rounds.png")
