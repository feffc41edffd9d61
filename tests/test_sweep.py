"""Sweeps: the grid runs on real data (the built-in heart-disease hospitals), records one
complete JSON line per run with ε spent from the ledgers, resumes without redoing runs,
refuses another sweep's results file, selects on validation (never test), and `plot` /
`report` produce every figure and the HTML — through the API and the CLI."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from silofl.algorithms import LAMBDA_METHODS, LOCAL_DP_METHODS, METHODS
from silofl.cli import app
from silofl.errors import BudgetExceeded, ConfigError, DataError
from silofl.experiments import build
from silofl.experiments.report import write_report
from silofl.experiments.sweep import expand, prepare, run_sweep
from silofl.experiments.sweep_config import load_sweep_config, sweep_config_from_dict
from silofl.experiments.sweep_results import read_results
from silofl.privacy.budget import BudgetStore
from silofl.tuning.selection import privacy_check, select_best

logging.getLogger("absl").setLevel(logging.ERROR)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("privacy_utility", "mrmtl_lambda", "over_rounds")

BASE = {
    "data": {"source": "heart", "test_fraction": 0.2},
    "model": {"name": "logistic", "metric": "accuracy"},
    "training": {"rounds": 4, "batch_size": 8, "clip": 1.0},
    # seeded noise: these tests check that runs are reproducible across processes
    "privacy": {"delta": 1e-4, "noise": "seeded"},
    "sweep": {"methods": ["local", "mrmtl"], "epsilon": [1, 4], "nonprivate": True,
              "lam": [0.1, 1.0], "lr": [0.1], "seeds": [0], "workers": 1,
              "results": "results.jsonl"},
}
# local: 3 ε-settings (1, 4, non-private); mrmtl: 3 × 2 λ → 9 runs
N_RUNS = 9


def _write(tmp: Path, raw: dict, name: str = "sweep.toml") -> Path:
    p = tmp / name
    p.write_text(tomli_w.dumps(raw))
    return p


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One completed in-process sweep: (config path, results path)."""
    tmp = tmp_path_factory.mktemp("sweep")
    cfg = _write(tmp, BASE)
    out = run_sweep(load_sweep_config(cfg))
    assert (out.total, out.executed, out.skipped) == (N_RUNS, N_RUNS, 0)
    return cfg, out.results


def test_grid_multiplies_lambda_only_for_lambda_methods():
    sc = sweep_config_from_dict(copy.deepcopy(BASE))
    specs = expand(sc)
    assert len(specs) == N_RUNS
    assert {s.lam for s in specs if s.method == "local"} == {None}
    assert {s.lam for s in specs if s.method == "mrmtl"} == {0.1, 1.0}
    assert {s.epsilon for s in specs} == {1.0, 4.0, None}
    assert len({s.key for s in specs}) == N_RUNS
    assert "mrmtl" in LAMBDA_METHODS and "local" not in LAMBDA_METHODS


def test_validation_is_carved_from_training_rows_and_test_is_untouched():
    sc = sweep_config_from_dict(copy.deepcopy(BASE))
    original = build.load_federation(sc.base.data)
    prep = prepare(sc)
    for s0, s, (Xv, yv) in zip(original.silos, prep.fed.silos, prep.validation):
        np.testing.assert_array_equal(s.X_test, s0.X_test)
        np.testing.assert_array_equal(s.y_test, s0.y_test)
        assert s.n_train + len(yv) == s0.n_train
        assert len(yv) == round(0.2 * s0.n_train)
        # training and validation rows partition the original training rows (as multisets:
        # the heart data has duplicate records)
        both = np.column_stack([np.vstack([s.X_train, Xv]), np.r_[s.y_train, yv]])
        orig = np.column_stack([s0.X_train, s0.y_train])
        np.testing.assert_array_equal(np.unique(both, axis=0, return_counts=True)[1],
                                      np.unique(orig, axis=0, return_counts=True)[1])
        np.testing.assert_array_equal(np.unique(both, axis=0), np.unique(orig, axis=0))


def test_sweep_records_complete_runs_with_ledger_epsilons(finished):
    _, results = finished
    head, records = read_results(results)
    lines = _lines(results)
    assert lines[0]["kind"] == "silofl-sweep" and lines[0]["fingerprint"] == head["fingerprint"]
    assert len(records) == N_RUNS == len(lines) - 1
    assert head["silos"] == ["Cleveland", "Hungary", "Switzerland", "VA Long Beach"]
    assert sum(head["n_validation"]) > 0
    for r in records:
        assert r["rounds"] == [1, 2, 3, 4]
        assert len(r["validation"]) == len(r["test"]) == 4
        assert r["final_test"] == r["test"][-1] and r["final_validation"] == r["validation"][-1]
        assert 0.0 <= r["final_test"] <= 1.0
        if r["private"]:
            p = r["privacy"]
            assert p["target_epsilon"] == [r["epsilon"]] * 4
            # calibrated to the target and charged in full: spent is at, never over, it
            assert all(0.9 * r["epsilon"] < e <= r["epsilon"] * (1 + 1e-9)
                       for e in p["epsilon_spent"])
            assert p["over_target"] == []
        else:
            assert r["privacy"] is None and r["epsilon"] is None
    # validation and test are different data: their curves differ somewhere
    assert any(r["validation"] != r["test"] for r in records)
    check = privacy_check(head, records)
    assert len(check) == 2 * 4 and not any(c["over_target"] for c in check)


def test_resume_skips_finished_runs_and_drops_a_torn_line(finished, tmp_path):
    cfg, results = finished
    lines = results.read_text().splitlines(keepends=True)
    partial = tmp_path / "partial.jsonl"
    # header + 3 complete runs + half of the 4th (a crash mid-write)
    partial.write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])
    assert len(read_results(partial)[1]) == 3
    sc = load_sweep_config(cfg)
    out = run_sweep(sc, results=partial)
    assert (out.skipped, out.executed) == (3, N_RUNS - 3)
    head, records = read_results(partial)
    assert len(records) == N_RUNS == len({r["key"] for r in records})
    assert all(x.endswith("\n") for x in partial.read_text().splitlines(keepends=True))
    # seeded runs are reproducible: the redone runs match the original ones
    first = {r["key"]: r["final_test"] for r in read_results(results)[1]}
    assert {r["key"]: r["final_test"] for r in records} == first
    again = run_sweep(sc, results=partial)
    assert (again.skipped, again.executed) == (N_RUNS, 0)


def test_refuses_results_of_a_different_sweep(finished):
    cfg, results = finished
    raw = copy.deepcopy(BASE)
    raw["sweep"]["lr"] = [0.1, 0.3]
    sc = sweep_config_from_dict(raw, cfg.parent)
    before = results.read_text()
    with pytest.raises(ConfigError) as e:
        run_sweep(sc, results=results)
    msg = str(e.value)
    assert "different sweep" in msg and "sweep.lr" in msg and "new results path" in msg
    assert results.read_text() == before
    # workers and the results path are not part of the fingerprint
    raw = copy.deepcopy(BASE)
    raw["sweep"]["workers"] = 3
    raw["sweep"]["results"] = "elsewhere.jsonl"
    assert sweep_config_from_dict(raw).fingerprint() == load_sweep_config(cfg).fingerprint()


def test_selection_uses_validation_not_test():
    """Candidate A wins on validation and loses on test: A is chosen, A's test reported."""
    head = {"higher_is_better": True, "metric": "accuracy",
            "config": {"sweep": {"methods": ["mrmtl"], "epsilon": [1.0]}}}

    def rec(lam, seed, val, test):
        return {"method": "mrmtl", "epsilon": 1.0, "lam": lam, "lr": 0.1, "seed": seed,
                "key": f"{lam}-{seed}", "final_validation": val, "final_test": test,
                "privacy": None}
    records = [rec(0.1, 0, 0.80, 0.60), rec(0.1, 1, 0.82, 0.62),   # A: best validation
               rec(1.0, 0, 0.70, 0.90), rec(1.0, 1, 0.72, 0.92)]   # B: best test
    (row,) = select_best(head, records)
    assert row["lam"] == 0.1
    assert row["test_mean"] == pytest.approx(0.61) and row["test_std"] == pytest.approx(0.01)
    # lower-is-better metrics flip the choice
    (row,) = select_best(dict(head, higher_is_better=False), records)
    assert row["lam"] == 1.0
    # a diverged seed disqualifies a candidate instead of being averaged away
    records[0]["final_validation"] = None
    (row,) = select_best(head, records)
    assert row["lam"] == 1.0


def test_selection_on_real_results_maximizes_mean_validation(finished):
    _, results = finished
    head, records = read_results(results)
    rows = select_best(head, records)
    assert len(rows) == 6  # 2 methods × (2 ε + non-private)
    for row in rows:
        cands = {}
        for r in records:
            if r["method"] == row["method"] and r["epsilon"] == row["epsilon"]:
                cands.setdefault((r["lam"], r["lr"]), []).append(r["final_validation"])
        best = max(np.mean(v) for v in cands.values())
        assert row["validation_mean"] == pytest.approx(best)
        assert row["candidates"] == len(cands)


def test_report_api_writes_html_figures_and_summary(finished, tmp_path):
    _, results = finished
    summary = write_report(results, tmp_path / "rep")
    assert summary["figure_epsilon"] == 4.0  # the middle of [1, 4] (no [report] epsilon)
    assert write_report(results, tmp_path / "rep1", epsilon=1)["figure_epsilon"] == 1.0
    for name in FIGURES:
        assert (tmp_path / "rep" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
        assert summary["figures"][name]
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert "<b>The privacy cost of hyperparameter selection is not counted.</b>" in html
    assert "{{" not in html
    assert "Switzerland" in html and "OVER TARGET" not in html
    saved = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert saved["runs_recorded"] == N_RUNS and len(saved["selection"]) == 6
    assert saved["over_target"] == []
    assert "finetune" in saved["figure_notes"]["over_rounds"]  # not in this sweep: said so


def test_report_flags_a_silo_over_its_target(finished, tmp_path):
    _, results = finished
    lines = results.read_text().splitlines()
    rec = json.loads(lines[1])
    assert rec["private"]
    rec["privacy"]["epsilon_spent"][2] = rec["epsilon"] * 1.5  # a tampered ledger reading
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], json.dumps(rec), *lines[2:]]) + "\n")
    summary = write_report(bad, tmp_path / "rep")
    assert [(o["silo"], o["epsilon"]) for o in summary["over_target"]] == \
        [("Switzerland", rec["epsilon"])]
    assert "OVER TARGET" in (tmp_path / "rep" / "report.html").read_text()


def test_cli_sweep_with_two_workers_then_plot_and_report(tmp_path, finished):
    raw = copy.deepcopy(BASE)
    raw["sweep"]["workers"] = 2
    cfg = _write(tmp_path, raw)
    res = CliRunner().invoke(app, ["sweep", str(cfg), "-q"])
    assert res.exit_code == 0, res.output
    out = _flat(res.output)
    assert f"{N_RUNS} runs executed" in out and "is not counted" in out and "mrmtl" in out
    results = tmp_path / "results.jsonl"  # relative to the config file's directory
    head, records = read_results(results)
    assert len(records) == N_RUNS
    # the same seeded runs in worker processes give the same numbers as in-process
    ref = {r["key"]: r["final_test"] for r in read_results(finished[1])[1]}
    assert {r["key"]: r["final_test"] for r in records} == ref
    res = CliRunner().invoke(app, ["sweep", str(cfg), "-q"])
    assert res.exit_code == 0 and f"0 runs executed, {N_RUNS} already recorded" in \
        _flat(res.output)
    res = CliRunner().invoke(app, ["plot", str(results), "--out", str(tmp_path / "fig")])
    assert res.exit_code == 0, res.output
    for name in FIGURES:
        assert (tmp_path / "fig" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    res = CliRunner().invoke(app, ["report", str(results)])
    assert res.exit_code == 0, res.output
    d = tmp_path / "results-report"
    assert {p.name for p in d.iterdir()} >= {"report.html", "summary.json",
                                             *(f"{n}.png" for n in FIGURES)}


@pytest.mark.parametrize("section, key, value, expect", [
    ("sweep", "methods", ["local", "mrmlt"], "Did you mean 'mrmtl'"),
    ("sweep", "methods", [], "sweep.methods' is empty"),
    ("sweep", "epsilons", [1], "did you mean 'sweep.epsilon'"),
    ("sweep", "epsilon", [], "sweep.epsilon' is empty"),
    ("sweep", "epsilon", [1, 0], "must hold positive values"),
    ("sweep", "lam", [0.1, -1], "non-negative"),
    ("sweep", "lr", [0.1, 0.1], "more than once"),
    ("sweep", "seeds", [0, 1.5], "list of integers"),
    ("sweep", "validation_fraction", 1.0, "validation_fraction' must be in (0, 1)"),
    ("sweep", "workers", 0, "workers' must be ≥ 1"),
    ("training", "lr", 0.1, "use sweep.lr"),
    ("privacy", "epsilon", 2.0, "use sweep.epsilon"),
    ("report", "epsilon", 3.0, "not in sweep.epsilon"),
])
def test_bad_sweep_config(section, key, value, expect):
    raw = copy.deepcopy(BASE)
    raw.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError) as e:
        sweep_config_from_dict(raw)
    assert expect in str(e.value)


def test_bad_input_through_the_cli(tmp_path, finished):
    raw = copy.deepcopy(BASE)
    del raw["sweep"]
    cases = [
        (["sweep", str(tmp_path / "missing.toml")], "does not exist"),
        (["sweep", str(_write(tmp_path, raw, "nosweep.toml"))], "needs a [sweep] section"),
        (["report", str(tmp_path / "none.jsonl")], "does not exist"),
    ]
    (tmp_path / "other.jsonl").write_text('{"kind": "something else"}\n')
    cases.append((["report", str(finished[1]), "--out", str(tmp_path / "r"), "--epsilon", "3"],
                   "--epsilon 3 was not swept"))
    cases.append((["plot", str(tmp_path / "other.jsonl")], "not a silofl sweep results file"))
    raw = copy.deepcopy(BASE)
    raw["training"]["batch_size"] = 0  # (b ≥ n_k is allowed now: full-batch steps, q = 1)
    cases.append((["sweep", str(_write(tmp_path, raw, "big.toml"))],
                  "batch_size must be a positive integer"))
    for args, expect in cases:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert expect in _flat(res.output), (args, res.output)
    assert not (tmp_path / "results.jsonl").exists()  # the refused sweep wrote nothing
    assert not (tmp_path / "r").exists()  # nor did the refused report


def test_damaged_middle_line_is_an_error(finished, tmp_path):
    _, results = finished
    lines = results.read_text().splitlines()
    bad = tmp_path / "damaged.jsonl"
    bad.write_text("\n".join([lines[0], lines[1][:20], *lines[2:]]) + "\n")
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        read_results(bad)


def test_every_registered_method_runs_in_a_sweep(tmp_path):
    """All methods of the registry through the same sweep path: each run spends at most its
    silos' targets (ledgers), and figure (c) shows Finetune vs FedAvg vs Local."""
    # every method but the local-DP ones (they need a public set and a per-round ε:
    # test_privatekt.py); a method that fails to build fails the test (never dropped)
    # and FedBN, which needs a torch model with normalization layers (test_split_models.py),
    # and ULDP, which needs persons across silos (test_uldp.py)
    # and dp_gbdt, which `silofl sweep` refuses (tests/test_gbdt_run.py)
    methods = [m for m in METHODS if m not in LOCAL_DP_METHODS
               and m not in ("fedbn", "uldp", "dp_gbdt")]
    assert {"weight_erosion", "fedavg", "mrmtl", "local", "finetune"} <= set(methods)
    raw = copy.deepcopy(BASE)
    raw["training"].update(rounds=10, we_user="Cleveland")  # weight_erosion's user silo
    raw["sweep"].update(methods=methods, epsilon=[2], nonprivate=False, lam=[0.1])
    out = run_sweep(load_sweep_config(_write(tmp_path, raw)))
    assert out.executed == len(methods)
    head, records = read_results(out.results)
    assert sorted(r["method"] for r in records) == sorted(methods)
    for r in records:
        assert max(r["privacy"]["epsilon_spent"]) <= 2 * (1 + 1e-9), r["method"]
        assert r["final_test"] is not None and 0 <= r["final_test"] <= 1
        assert (r["lam"] is not None) == (r["method"] in LAMBDA_METHODS)
    summary = write_report(out.results, tmp_path / "rep")
    if {"finetune", "fedavg", "local"} <= set(methods):
        assert summary["figures"]["over_rounds"] and "over_rounds" not in summary["figure_notes"]


def test_sweep_on_scratch_stores_says_so_first(finished):
    head, _ = read_results(finished[1])
    assert any("scratch budget store" in n for n in head["notes"])
    assert any("reproducible noise" in n for n in head["notes"])


def test_sweep_on_a_lifetime_store_spends_only_its_declared_budget(tmp_path):
    """With [budget] store every run is reserved in that store; the sweep declares the
    total ε it may spend per silo and stops (BudgetExceeded) when that is used up."""
    raw = json.loads(json.dumps(BASE))
    raw["sweep"].update(methods=["local"], epsilon=[1], nonprivate=False, lr=[0.1, 0.3],
                        seeds=[0, 1])
    raw["budget"] = {"store": "budget.sqlite"}
    with pytest.raises(ConfigError, match=r"declare the total budget .* \[budget\] epsilon"):
        run_sweep(load_sweep_config(_write(tmp_path, raw)))
    assert not (tmp_path / "results.jsonl").exists()
    raw["budget"]["epsilon"] = 1.6  # room for two ε = 1 runs composed (≈ 1.43), not four
    with pytest.raises(BudgetExceeded, match="lifetime ε would reach"):
        run_sweep(load_sweep_config(_write(tmp_path, raw)))
    _, records = read_results(tmp_path / "results.jsonl")
    assert 2 <= len(records) < 4  # the runs that fit were recorded, then it stopped
    with BudgetStore(tmp_path / "budget.sqlite") as st:
        for name in st.silos():
            spent = st.spent(name)
            assert spent["epsilon"] <= 1.6 and spent["target_epsilon"] == 1.6
            assert len({c["run"] for c in st.charges(name)}) == len(records)
    assert all(not r["privacy"]["scratch_store"] for r in records)


def test_report_lists_the_silos_a_sweep_left_out(tmp_path):
    raw = json.loads(json.dumps(BASE))
    raw["sweep"].update(methods=["local"], epsilon=[1], nonprivate=False, lam=[0.1],
                        min_silo_train=100)  # Switzerland has 78 training rows here
    out = run_sweep(load_sweep_config(_write(tmp_path, raw)))
    summary = write_report(out.results, tmp_path / "rep")
    assert [d["silo"] for d in summary["dropped_silos"]] == ["Switzerland"]
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "left out by sweep.min_silo_train: Switzerland (78 training rows)" in html


def test_auto_lambda_in_the_sweep_grid(tmp_path):
    """sweep.lam may list "auto" next to numbers: MR-MTL runs at each, the records keep
    "auto", selection and the report handle it (the λ figure plots the numbers only), and
    a method that takes no "auto" or a near miss is refused before anything runs."""
    raw = copy.deepcopy(BASE)
    raw["sweep"].update(methods=["fedavg", "mrmtl"], epsilon=[4], nonprivate=False,
                        lam=[1.0, "auto"])
    out = run_sweep(load_sweep_config(_write(tmp_path, raw)))
    assert out.executed == 3
    head, records = read_results(out.results)
    assert sorted(str(r["lam"]) for r in records if r["method"] == "mrmtl") == ["1.0", "auto"]
    (row,) = [r for r in select_best(head, records) if r["method"] == "mrmtl"]
    assert row["lam"] in (1.0, "auto")
    summary = write_report(out.results, tmp_path / "rep")
    assert summary["figures"]["mrmtl_lambda"]
    for lam, expect in ((["Auto"], 'exactly as "auto"'), (["auto", "auto"], "more than once")):
        bad = copy.deepcopy(raw)
        bad["sweep"]["lam"] = lam
        with pytest.raises(ConfigError, match=expect):
            sweep_config_from_dict(bad)
    bad = copy.deepcopy(raw)
    bad["sweep"]["methods"] = ["mocha"]
    with pytest.raises(ConfigError, match="mrmtl and ditto"):
        sweep_config_from_dict(bad)
