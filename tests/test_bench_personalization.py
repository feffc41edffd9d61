"""benchmarks/bench_personalization.py: method specs, job configs and the table maker on
fake results (no training)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_personalization.py"
_spec = importlib.util.spec_from_file_location("bench_personalization", _PATH)
bp = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_personalization", bp)  # dataclasses look their module up
_spec.loader.exec_module(bp)


def test_spec_parsing_sections_values_and_errors():
    s = bp.parse_spec("mrmtl:lam=auto:clip=0.3:tuning.mode=private:tuning.lam=0.1;1")
    assert s.method == "mrmtl" and s.label.startswith("mrmtl:lam=auto")
    assert s.overrides == (("training", "lam", "auto"), ("training", "clip", 0.3),
                           ("tuning", "mode", "private"), ("tuning", "lam", [0.1, 1]))
    assert bp.parse_spec("fedavg").overrides == ()
    assert bp.parse_value("true") is True and bp.parse_value("3") == 3
    for bad in ("mrmtl:lam", "mrmtl:=1", "MR MTL", "mrmtl:a.b.c=1", ""):
        with pytest.raises(ValueError):
            bp.parse_spec(bad)
    specs = bp.parse_methods("local, fedavg,local,mrmtl:lam=1")
    assert [s.label for s in specs] == ["local", "fedavg", "mrmtl:lam=1"]


def test_job_config_applies_overrides_without_touching_the_base():
    base = bp.DATASETS["heart"][1]
    raw = bp.job_config(base, bp.parse_spec("ditto:lam=2:tuning.mode=private"), 4.0, 7)
    assert raw["training"]["methods"] == ["ditto"] and raw["training"]["lam"] == 2
    assert raw["training"]["seed"] == 7 and raw["privacy"]["epsilon"] == 4.0
    assert raw["tuning"]["mode"] == "private" and raw["budget"]["scratch"] is True
    assert raw["privacy"]["noise"] == "seeded" and raw["training"]["eval_every"] == 30
    assert "lam" not in base["training"] and "mode" not in base["tuning"]
    assert bp.parse_sets(["school.training.rounds=20"]) == {
        "school": [("training", "rounds", 20)]}
    with pytest.raises(ValueError):
        bp.parse_sets(["nowhere.training.rounds=20"])


def _rec(method, eps, seed, value, error=None):
    return {"dataset": "d", "method": method, "epsilon": eps, "seed": seed, "value": value,
            "error": error}


def test_table_marks_the_better_baseline_ratios_and_failures():
    recs = [_rec("local", 1, 0, 0.30), _rec("local", 1, 1, 0.50),   # mean 0.40
            _rec("fedavg", 1, 0, 0.20), _rec("fedavg", 1, 1, 0.20),  # mean 0.20: baseline
            _rec("local", 8, 0, 0.10), _rec("local", 8, 1, 0.10),    # baseline at ε = 8
            _rec("fedavg", 8, 0, 0.20), _rec("fedavg", 8, 1, 0.20),
            _rec("mrmtl:lam=1", 1, 0, 0.25), _rec("mrmtl:lam=1", 1, 1, None, "diverged"),
            _rec("mrmtl:lam=1", 8, 0, 0.05), _rec("mrmtl:lam=1", 8, 1, 0.05),
            _rec("mrmtl:lam=0.1", 1, 0, 0.18), _rec("mrmtl:lam=0.1", 1, 1, 0.18),
            _rec("mrmtl:lam=0.1", 8, 0, 0.09), _rec("mrmtl:lam=0.1", 8, 1, 0.09),
            _rec("fedprox", 1, 0, None, "ConfigError: unknown method 'fedprox'"),
            _rec("fedprox", 8, 0, None, "ConfigError: unknown method 'fedprox'")]
    cells = bp.aggregate(recs)["d"]
    bp.add_uncounted(cells, [0.1, 1, 3], higher=False)  # MSE-like: lower is better
    rows = ["local", "fedavg", "mrmtl:lam=1", "fedprox", bp.UNCOUNTED]
    header, body, notes = bp.make_table(cells, rows, [1.0, 8.0], seeds=2, higher=False)
    assert header == ["method", "ε = 1", "ε = 8"]
    by = {r[0]: r[1:] for r in body}
    assert by["fedavg"][0] == "0.2 ± 0 *" and by["local"][1] == "0.1 ± 0 *"
    assert by["local"][0] == "0.4 ± 0.14 (2.00×)"
    assert by["mrmtl:lam=1"] == ["0.25 (n=1) (1.25×)", "0.05 ± 0 (0.50×)"]
    assert by["fedprox"][0].startswith("n/a: ConfigError: unknown method")
    assert by[bp.UNCOUNTED] == ["0.18 ± 0 [λ=0.1] (0.90×)", "0.05 ± 0 [λ=1] (0.50×)"]
    assert notes == ["mrmtl:lam=1: diverged"]
    md = bp.markdown("T", "cap", header, body, notes)
    assert "| fedavg | 0.2 ± 0 * | 0.2 ± 0 (2.00×) |" in md and "n/a in part" in md
    # accuracy: higher is better, so the other baseline wins at ε = 1
    header, body, _ = bp.make_table(cells, ["local", "fedavg"], [1.0], seeds=2, higher=True)
    assert body[0][1] == "0.4 ± 0.14 *" and body[1][1] == "0.2 ± 0 (0.50×)"


def test_plan_groups_glm_jobs_per_cell_and_keeps_torch_jobs_apart():
    glm = bp.parse_methods("local,mrmtl:tuning.mode=private")
    torch = bp.parse_methods("local,fedavg")
    tasks = bp.plan_jobs(["heart", "mnist"], {"heart": glm, "mnist": torch},
                         {"heart": [1.0, 8.0], "mnist": [1.0, 4.0, 8.0]}, 2)
    jobs = [j for t in tasks for j in t]
    assert len(jobs) == len(set((d, s.label, e, k) for d, s, e, k in jobs)) == 8 + 12
    assert {e for d, _, e, _ in jobs if d == "mnist"} == {1.0, 4.0, 8.0}  # its own ε grid
    heart = [t for t in tasks if t[0][0] == "heart"]
    assert len(heart) == 4 and all(len({(j[2], j[3]) for j in t}) == 1 for t in heart)
    assert all(len(t) == 1 for t in tasks if t[0][0] == "mnist")
    assert tasks[0][0][0] == "mnist"  # the costliest (torch) tasks are submitted first


def test_defaults_cover_issue_22_rows_and_the_torch_eps_grid():
    a = bp._args([])
    glm = {s.label for s in a.specs["school"]}
    assert {"fedavg:clip=auto", "mrmtl:lam=auto:clip=auto",
            "mrmtl:tuning.mode=private:tuning.select=random:tuning.eta=1",
            "mrmtl:tuning.mode=private:tuning.select=subsample", "fedper", "fedrep",
            "scaffold", "fedprox", "apfl"} <= glm
    assert "fedbn" in {s.label for s in a.specs["mnist"]} and a.uncounted_best_lambda
    assert a.eps["school"] == [1, 2, 4, 6, 8] and a.eps["mnist"] == [1, 2, 4, 8]
    assert not bp._args(["--no-uncounted-best-lambda"]).uncounted_best_lambda
