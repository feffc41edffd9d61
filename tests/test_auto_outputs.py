"""clip = "auto" says where C came from and what it cost, in every output a reader gets:
the run notes (summary.json, privacy_report.json, every model card), the card's own final
C_k and count noise, and the terminal caption naming whose final C_k it prints."""

from __future__ import annotations

import json
from pathlib import Path

import tomli_w
from typer.testing import CliRunner

from silofl.cli import app
from silofl.experiments.report import clip_note


def _run(tmp: Path, clip) -> tuple[Path, str]:
    raw = {"data": {"source": "heart"}, "model": {"name": "logistic"},
           "training": {"methods": ["local", "fedrep"], "rounds": 2, "batch_size": 8,
                        "clip": clip},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
           "output": {"dir": str(tmp / "runs")}}
    p = tmp / "run.toml"
    p.write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["run", "-c", str(p), "--scratch", "-q"])
    assert res.exit_code == 0, res.output
    return next((tmp / "runs").iterdir()), " ".join(res.output.split())


def test_clip_auto_is_explained_in_notes_and_cards(tmp_path):
    run, out = _run(tmp_path, "auto")
    # printed once, with the closing notes (not again under the metrics table)
    assert out.count("tracks the γ = 0.7 quantile") == 1
    summary = json.loads((run / "summary.json").read_text())
    note = [n for n in summary["notes"] if n.startswith("clip = auto")]
    assert len(note) == 1 and "γ = 0.7" in note[0] and "add/remove" in note[0]
    assert "inside every ε" in note[0]
    report = json.loads((run / "privacy_report.json").read_text())
    assert note[0] in report["notes"]
    for method in ("local", "fedrep"):
        card = json.loads(next((run / "models" / method).glob("card-Cleveland-*.json"))
                          .read_text())
        clip = card["privacy"]["adaptive_clip"]
        entry = report["methods"][method][0]
        assert entry["silo"] == "Cleveland"
        assert clip["final_clip"] == entry["final_clip"] > 0  # this method's own C_k
        assert clip["count_noise"] == entry["count_noise"] > 0
        assert clip["gradient_noise_multiplier"] >= card["privacy"]["noise_multiplier"]
        assert note[0] in card["privacy"]["notes"]


def test_fixed_clip_has_no_auto_note(tmp_path):
    run, _ = _run(tmp_path, 1.0)
    summary = json.loads((run / "summary.json").read_text())
    assert not any(n.startswith("clip = auto") for n in summary["notes"])
    card = json.loads(next((run / "models" / "local").glob("card-*.json")).read_text())
    assert "adaptive_clip" not in card["privacy"]


def test_clip_caption_names_the_method_and_pairs_each_value():
    entries = [{"silo": "A", "clip": "auto", "count_noise": 30.0, "final_clip": 1.25,
                "gradient_noise_multiplier": 1.5},
               {"silo": "B", "clip": "auto", "count_noise": 40.0, "final_clip": 0.5,
                "gradient_noise_multiplier": 2.0}]
    text = clip_note(entries, "fedrep", 2)
    assert "fedrep's final C_k" in text and "other methods' in privacy_report.json" in text
    assert "A σ_b 30, σ_Δ 1.5, C 1.25; B σ_b 40, σ_Δ 2, C 0.5" in text
    assert clip_note([{"silo": "A", "n_train": 3}], "local") == ""


def test_tuning_note_says_where_lambda_came_from_and_its_cost():
    from silofl.config import TuningConfig
    from silofl.experiments.notes import tuning_note
    tc = TuningConfig(mode="private", select="subsample", eta=0.0, mean_trials=10)
    text = tuning_note("mrmtl_tuned", {"tuned": "lam", "select": "subsample",
                                       "subsample_fraction": 0.1}, tc)
    assert "λ per silo chosen privately" in text and "20% of each silo's training rows" in text
    assert "E[h] = 10" in text and "γ = 0.1 subsample" in text and "inside this method's ε" in text
    proxy = {"tuning": {"mode": "proxy", "proxy_source": "table", "proxy_path": "pub.csv",
                        "chosen_lam": 1.0, "proxy_noise": "none"}}
    text = tuning_note("mrmtl(λ=1)", proxy, TuningConfig(mode="proxy"))
    assert "λ = 1 chosen on the proxy pub.csv" in text and "ε cost 0 for the silos" in text
    assert "declared public" in text
    assert tuning_note("mrmtl", {"lam": 0.1}, TuningConfig()) is None


def test_tuning_note_states_the_distribution_the_run_draws_from():
    """η and E[h] as the run builds them (`tuning.setup.distribution`): subsample's η = 0
    when eta is unset, E[h] = 1/γ for a geometric TNB given gamma — not the config fields."""
    from silofl.config import TuningConfig
    from silofl.experiments.notes import tuning_note
    sub = TuningConfig(mode="private", select="subsample")
    text = tuning_note("m", {"tuned": "lam", "select": "subsample",
                             "subsample_fraction": 0.1}, sub)
    assert "TNB(η = 0, E[h] = 10)" in text
    geo = TuningConfig(mode="private", select="random", eta=1.0, gamma=0.05)
    assert "TNB(η = 1, E[h] = 20)" in tuning_note("m", {"tuned": "lam", "select": "random"}, geo)


def test_private_tuning_run_note_reaches_summary_and_cards(tmp_path):
    raw = {"data": {"source": "heart"}, "model": {"name": "logistic"},
           "training": {"methods": ["local", "mrmtl"], "rounds": 2, "batch_size": 8},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
           "output": {"dir": str(tmp_path / "runs")},
           "tuning": {"mode": "private", "select": "subsample", "lam": [0.1, 1.0],
                      "mean_trials": 3}}
    p = tmp_path / "run.toml"
    p.write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["run", "-c", str(p), "--scratch", "-q"])
    assert res.exit_code == 0, res.output
    run = next((tmp_path / "runs").iterdir())
    notes = json.loads((run / "summary.json").read_text())["notes"]
    tuned = [n for n in notes if n.startswith("mrmtl_tuned: λ per silo chosen privately")]
    assert len(tuned) == 1 and "E[h] = 3" in tuned[0]
    card = json.loads(next((run / "models" / "mrmtl_tuned").glob("card-*.json")).read_text())
    assert tuned[0] in card["privacy"]["notes"]


def test_a_card_carries_only_its_own_methods_notes(tmp_path):
    raw = {"data": {"source": "heart"}, "model": {"name": "logistic"},
           "training": {"methods": ["mrmtl", "ditto", "fedper"], "rounds": 2,
                        "batch_size": 8, "lam": "auto"},
           "privacy": {"epsilon": 2.0, "delta": 1e-4, "noise": "seeded", "accountant": "rdp"},
           "output": {"dir": str(tmp_path / "runs")}}
    p = tmp_path / "run.toml"
    p.write_text(tomli_w.dumps(raw))
    res = CliRunner().invoke(app, ["run", "-c", str(p), "--scratch", "-q"])
    assert res.exit_code == 0, res.output
    run = next((tmp_path / "runs").iterdir())

    def card(method):
        return json.loads(next((run / "models" / method).glob("card-*.json")).read_text())

    def about(notes, label):
        return [n for n in notes if n.startswith(f"{label}: ")]

    summary = json.loads((run / "summary.json").read_text())["notes"]
    assert about(summary, "mrmtl(λ=auto)") and about(summary, "ditto(λ=auto)")  # the run: all
    fedper = card("fedper")["privacy"]
    assert not about(fedper["notes"], "mrmtl(λ=auto)") and "λ" not in fedper["statement"]
    mrmtl = card("mrmtl(λ=auto)")["privacy"]
    assert about(mrmtl["notes"], "mrmtl(λ=auto)") and not about(mrmtl["notes"], "ditto(λ=auto)")
    assert "scratch budget store" in mrmtl["statement"]  # notes about the whole run stay


def _rep(metric, pooled: dict):
    from types import SimpleNamespace
    results = [SimpleNamespace(method={"name": n}, metric=metric, final_pooled=v)
               for n, v in pooled.items()]
    return SimpleNamespace(results=results, label=lambda r: r.method["name"])


def test_baseline_to_beat_is_the_better_of_local_and_fedavg():
    from silofl.experiments.report import baseline_line
    line = baseline_line(_rep("accuracy", {"local": 0.80, "fedavg": 0.78, "fedper": 0.82,
                                           "apfl": 0.79}))
    assert "local 0.8000; above it: fedper 0.8200; not above: apfl 0.7900" in line
    line = baseline_line(_rep("mse", {"local": 0.040, "fedavg": 0.024, "fedrep": 0.0258,
                                      "scaffold": 0.0235}))
    assert "fedavg 0.0240; above it: scaffold 0.0235; not above: fedrep 0.0258" in line
    assert baseline_line(_rep("accuracy", {"local": 0.8, "fedavg": 0.7})) is None
    assert "add \"local\" and \"fedavg\"" in baseline_line(_rep("accuracy", {"fedper": 0.8}))
