"""The main job (`silofl run` with no config): its figure shows a non-private reference only
on the public built-in heart data, the terminal places it against FLamby's published
Fed-Heart-Disease figures (heart only), and the defaults give pooled accuracy that does
not fall over the rounds."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from silofl.cli import app
from silofl.config import config_from_dict
from silofl.experiments.reference import REFERENCE_KEY
from silofl.experiments.report import flamby_comparison, history_lines, mean_per_silo
from silofl.experiments.run import run

SYNTHETIC = {"source": "synthetic", "options": {"num_silos": 3, "sizes": [60, 80, 70],
                                                "task": "binary"}}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _run_dir(out):
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    return d


def test_heart_job_draws_dashed_nonprivate_reference(tmp_path):
    rep = run(config_from_dict({"budget": {"scratch": True}}), tmp_path)
    lines = history_lines(rep)
    refs = [x for x in lines if x["reference"]]
    assert [x["method"] for x in refs] == [rep.label(r) for r in rep.results]
    assert all(x["style"] == "--" and len(x["values"]) == 30 for x in refs)
    assert all(x["style"] == "-" for x in lines if not x["reference"])
    hist = json.loads((rep.run_dir / "history.json").read_text())
    for h in hist.values():
        ref = h["extra"][REFERENCE_KEY]
        assert len(ref["pooled"]) == len(h["pooled"]) and "public" in ref["note"]
    # non-private runs are seeded: the reference is the same every time
    again = run(config_from_dict({"budget": {"scratch": True}, "output": {"dir": ""}}))
    assert [x["values"] for x in history_lines(again) if x["reference"]] == \
        [x["values"] for x in refs]


def test_other_source_gets_no_reference_and_no_flamby_line(tmp_path):
    rep = run(config_from_dict({"data": SYNTHETIC, "training": {"rounds": 3, "batch_size": 8},
                                "budget": {"scratch": True}}), tmp_path)
    assert not any(x["reference"] for x in history_lines(rep))
    hist = json.loads((rep.run_dir / "history.json").read_text())
    assert all(REFERENCE_KEY not in h.get("extra", {}) for h in hist.values())
    assert flamby_comparison(rep) is None
    assert REFERENCE_KEY not in (rep.run_dir / "summary.json").read_text()


def test_cli_prints_flamby_comparison_for_heart_only(tmp_path):
    res = CliRunner().invoke(app, ["run", "--scratch", "-q", "--out", str(tmp_path / "h")])
    assert res.exit_code == 0, res.output
    out = _flat(res.stdout)
    assert "FLamby Fed-Heart-Disease" in out and "DP-FedAvg 0.685" in out and "0.712" in out
    assert "mean per-hospital" in out and "setups differ" in out
    assert "public-data reference" in out
    # the figure quoted is the unweighted mean over hospitals, not the pooled figure
    summary = json.loads((_run_dir(tmp_path / "h") / "summary.json").read_text())
    fedavg = next(m for m in summary["methods"] if m["name"] == "fedavg")
    assert f"fedavg {mean_per_silo(list(fedavg['per_silo'].values())):.4f}" in out

    cfg = tmp_path / "syn.toml"
    cfg.write_text('[data]\nsource = "synthetic"\n[data.options]\nnum_silos = 3\n'
                   'sizes = [60, 80, 70]\ntask = "binary"\n[training]\nrounds = 3\n'
                   'batch_size = 8\n')
    res = CliRunner().invoke(app, ["run", "--config", str(cfg), "--scratch", "-q", "--out",
                                   str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "FLamby" not in res.stdout


def test_default_curves_do_not_fall():
    """Mean over 8 runs (seeded noise: same distribution, deterministic test) of the last
    three rounds' pooled accuracy vs the three middle rounds, for every method. The
    tolerance is about two standard errors of that difference over 8 runs."""
    diffs = {}
    for seed in range(8):
        rep = run(config_from_dict({"training": {"seed": seed},
                                    "privacy": {"noise": "seeded"},
                                    "budget": {"scratch": True}, "output": {"dir": ""}}))
        for r in rep.results:
            p = np.array(r.history.pooled)
            mid = len(p) // 2
            diffs.setdefault(r.method["name"], []).append(p[-3:].mean() - p[mid - 2:mid + 1].mean())
    for name, d in diffs.items():
        assert np.mean(d) >= -0.01, (name, np.mean(d))
