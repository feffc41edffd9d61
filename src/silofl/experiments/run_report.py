"""What one job (`experiments.run.run`) returns and writes: the `RunReport` and its files.

`RunReport` holds one job's results and privacy statement; `write_outputs` puts them into
the run directory (history.json, privacy_report.json, summary.json, figures, saved
models). Weight Erosion's α per round travels in `History.extra[ALPHA_KEY]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silofl.algorithms import LAMBDA_METHODS, LOCAL_DP_METHODS
from silofl.config import Config
from silofl.experiments import saving
from silofl.experiments.figures import alpha_over_rounds
from silofl.experiments.notes import (
    CLIP_AUTO_NOTE,
    LOCAL_DP_NOTE,
    job_notes,
    reset_notes,
    tuning_note,
    unit_notes,
)
from silofl.experiments.quality import QUALITY_NOTE, assess, warnings_of
from silofl.experiments.report import plot_history
from silofl.experiments.run_trees import TreeResult
from silofl.io import json_safe, write_json_atomic
from silofl.privacy import units
from silofl.privacy.targets import ASSUMPTIONS
from silofl.runtime.rules import clip_entry
from silofl.runtime.simulator import RunResult


@dataclass
class RunReport:
    """What `run` returns: one job's results and privacy statement.

    Attributes
    ----------
    run_dir : Path or None
        The run directory (None: nothing written).
    config : Config
        The job's configuration.
    results : list of RunResult
        One per method.
    combined_privacy : list of dict
        Per silo: the whole job's ε (all methods composed).
    run_id : str or None
        The budget store's id of the job.
    store : str or None
        The budget store's path (None: scratch or non-private).
    scratch, demo : bool
        Charged to a scratch store / the restartable demo store of public data.
    lifetime : list of dict
        Per silo, its lifetime position after this job.
    uncharged : list of str
        Data reads no budget covers (each listed in every output).
    quality : dict
        Per method label, the final models against the baseline they must beat.
    """

    run_dir: Path | None
    config: Config
    results: list[RunResult]
    combined_privacy: list[dict]  # per silo: the whole job's ε (all methods composed)
    run_id: str | None = None
    store: str | None = None      # the budget store's path (None: scratch / non-private)
    scratch: bool = False
    demo: bool = False            # the demo store of the public built-in data
    store_created: bool = False   # this job created the store file
    lifetime: list[dict] = field(default_factory=list)  # per silo, after this job
    uncharged: list[str] = field(default_factory=list)  # data reads no budget covers
    preprocessing: dict | None = None  # what preprocessing did (fed.meta["preprocessing"])
    resumed: list[str] = field(default_factory=list)  # how a resumed run continued
    #: what saving the models needs (`saving.release_info`): model spec, schema, feature
    #: names, task/classes, per-silo preprocessing constants and raw-data fingerprints
    release: dict = field(default_factory=dict)
    #: per method label, the final models against the baseline they must beat
    #: (`silofl.experiments.quality.assess`): test-set statistics, not privatized
    quality: dict = field(default_factory=dict)
    #: silos left out by [data] min_silo_rows with small_silos = "drop": {silo, n_train, n_test}
    dropped_silos: list = field(default_factory=list)
    #: person level: a person seen by m silos (`person_report.job_persons`), else None
    persons: dict | None = None
    #: linked persons (`linkage.describe`): the overlap release and its charge, or None
    linkage: dict | None = None

    @property
    def noise(self) -> str:
        """[privacy] noise: "secure" or "seeded" (every output says which)."""
        return self.config.privacy.noise

    @property
    def unit(self) -> str:
        """The privacy unit of every guarantee of this job: "example" or "person"."""
        return self.config.privacy.unit if self.config.privacy.enabled else "example"

    @property
    def adjacency(self) -> str:
        """The neighbouring relation as every output states it (`units.ADJACENCY`)."""
        return units.adjacency(self.unit)

    def notes(self) -> list[str]:
        """What every reader of this run's outputs must be told.

        Returns
        -------
        list of str
            Notes: seeded noise, scratch or demo store, uncharged reads, resets.
        """
        local = [r.method["name"] for r in self.results
                 if r.method["name"] in LOCAL_DP_METHODS]
        auto = [f"{self.label(r)}: λ_k per silo and round, {r.method['lam_source']}"
                for r in self.results if "lam_source" in r.method]  # λ from released updates
        auto += [n for r in self.results
                 if (n := tuning_note(self.label(r), r.method, self.config.tuning))]
        tc = self.config.training
        if tc.clip == "auto" and self.config.privacy.enabled:
            auto.append(CLIP_AUTO_NOTE.format(quantile=tc.clip_quantile))
        auto += unit_notes(self.unit, self.config.data.person_column,
                           self.config.privacy.enabled) + (self.linkage or {}).get("notes", [])
        return job_notes(private=self.config.privacy.enabled, noise=self.noise,
                         scratch=self.scratch, demo=self.demo, uncharged=self.uncharged,
                         extra=self.resumed + ([LOCAL_DP_NOTE.format(", ".join(local))]
                                               if local and self.config.privacy.enabled
                                               else []) + reset_notes(self.lifetime,
                                                                      self.demo) + auto)

    def store_text(self) -> str | None:
        """The budget store as every output names it.

        Returns
        -------
        str or None
            Its path (marked as demo store), "scratch (in memory)", or None for a
            non-private job.
        """
        if not self.config.privacy.enabled:
            return None
        if self.store is None:
            return "scratch (in memory)"
        return f"{self.store} (demo store)" if self.demo else self.store

    def label(self, r: RunResult) -> str:
        """A method's label in outputs, e.g. ``mrmtl(λ=0.3)``.

        Parameters
        ----------
        r : RunResult
            One of `results`.

        Returns
        -------
        str
            The label.
        """
        m = r.method
        if m["name"] in LAMBDA_METHODS and "lam" in m:  # every λ method, not only MR-MTL
            lam = m["lam"]  # a number, or "auto" (λ_k from released updates)
            return f"{m['name']}(λ={lam:g})" if isinstance(lam, (int, float)) else \
                f"{m['name']}(λ={lam})"
        return m["name"]

    def summary(self) -> dict:
        """The job as ``summary.json`` records it.

        Returns
        -------
        dict
            Run directory, notes, budget store, per-method metrics and the combined
            privacy per silo.
        """
        out = {"run_dir": str(self.run_dir) if self.run_dir else None,
               "private": self.config.privacy.enabled, "noise": self.noise,
               "notes": self.notes(), "run_id": self.run_id,
               "budget_store": self.store_text(), "budget_store_created": self.store_created,
               "methods": [{"method": self.label(r), **r.method, "metric": r.metric,
                            "pooled": r.final_pooled,
                            "per_silo": dict(zip(r.silos, r.final_per_silo)),
                            "seconds": r.seconds, **_clip_summary(r),
                            **({"final_metrics": r.final_metrics}  # dp_gbdt: AUC, accuracy
                               if getattr(r, "final_metrics", None) else {}),
                            **({"quality": self.quality[self.label(r)]}
                               if self.label(r) in self.quality else {})}
                           for r in self.results],
               "combined_privacy": self.combined_privacy}
        if self.config.privacy.enabled:  # what combined_privacy's ε protects
            out["privacy_unit"], out["adjacency"] = self.unit, self.adjacency
        if self.quality:  # a useless model never looks fine (README "Reading the results")
            out["quality_warnings"] = warnings_of(self.quality)
            out["quality_note"] = QUALITY_NOTE
        out["dropped_silos"] = list(self.dropped_silos)
        if any(ALPHA_KEY in r.history.extra for r in self.results):
            out["weight_erosion_alpha"] = (
                f"{ALPHA_PNG}: each silo's weight α_i after every round (user highlighted); "
                f"the values, and who took part each round, in history.json under "
                f"<method>.extra.{ALPHA_KEY}")
        return out


def _clip_summary(r: RunResult) -> dict:
    """clip = "auto": {"adaptive_clip": {silo: σ_b, σ_Δ, final C_k, γ_k, the release}} for
    summary.json (empty for a fixed clip)."""
    per = {name: clip_entry(p.to_dict()) for name, p in zip(r.silos, r.plans or [])}
    return {"adaptive_clip": per} if any(per.values()) else {}



def assess_all(rep: RunReport, model, fed) -> dict:
    """Each method's final models against the best constant prediction on the same test
    rows (`quality.assess`).

    Parameters
    ----------
    rep : RunReport
        The job's report (its results and labels).
    model : Model
        The job's model.
    fed : Federation
        The preprocessed federation (its test rows).

    Returns
    -------
    dict
        Method label (as in history.json) → `quality.assess` statistics.
    """
    from silofl.experiments.run_trees import TreeModel  # dp_gbdt's ensembles
    return {rep.label(r): assess(r, TreeModel() if isinstance(r, TreeResult) else model, fed,
                                 rep.label(r)) for r in rep.results}


#: the key of Weight Erosion's α in a run's `History.extra` (history.json) and its figure
ALPHA_KEY, ALPHA_PNG = "alpha", "alpha_over_rounds.png"


def record_alpha(r: RunResult, alg, rounds: int) -> None:
    """Put Weight Erosion's weights into ``r.history.extra[ALPHA_KEY]`` (history.json).

    α is post-processing of the DP gradients: recording it costs nothing.

    Parameters
    ----------
    r : RunResult
        The method's result (its history is updated in place).
    alg : WeightErosion
        The trained algorithm (``alpha_history``, ``round_log``, ``user_index``).
    rounds : int
        The job's rounds.

    Notes
    -----
    The entry holds ``per_silo`` [round][silo] α after each round (NaN: a late joiner
    before it joined), ``present`` [round][silo] who took part, the ``user``, and the
    ``rounds`` they cover (a resumed run: the rounds after resuming).
    """
    n = len(alg.alpha_history)
    r.history.extra[ALPHA_KEY] = {
        "rounds": list(range(rounds - n + 1, rounds + 1)), "user": r.silos[alg.user_index],
        "per_silo": [a.tolist() for a in alg.alpha_history],
        "present": [e["present"].tolist() for e in alg.round_log]}


def plot_alpha(rep: RunReport, path: Path) -> bool:
    """Draw `ALPHA_PNG`: α of every silo over rounds, the user highlighted.

    Parameters
    ----------
    rep : RunReport
        The job (the first Weight Erosion result is drawn).
    path : Path
        The figure's file.

    Returns
    -------
    bool
        False: no Weight Erosion in the run, nothing drawn.
    """
    for r in rep.results:
        a = r.history.extra.get(ALPHA_KEY)
        if a and a["per_silo"]:
            kind = "private" if rep.config.privacy.enabled else "non-private"
            alpha_over_rounds(a["rounds"], np.array(a["per_silo"], float), r.silos,
                              a["user"], f"{rep.label(r)} for user {a['user']}: weights α_i "
                              f"({kind}; post-processing of the released updates)", path)
            return True
    return False


def write_outputs(rep: RunReport) -> None:
    """Write the job's files into ``rep.run_dir``.

    Parameters
    ----------
    rep : RunReport
        A finished job with a run directory: history.json, privacy_report.json,
        summary.json, metric_over_rounds.png, `ALPHA_PNG` (Weight Erosion) and the saved
        models are written atomically.
    """
    d = rep.run_dir
    hist = {rep.label(r): {"metric": r.metric, "silos": r.silos, **r.history.to_dict(),
                           **({"final_quality": rep.quality[rep.label(r)]}
                              if rep.label(r) in rep.quality else {})}
            for r in rep.results}
    write_json_atomic(d / "history.json", hist)
    privacy = {"accountant_for_calibration": rep.config.privacy.accountant,
               "neighbouring_relation": rep.adjacency, "privacy_unit": rep.unit,
               "noise": rep.noise, "notes": rep.notes(), "assumptions": list(ASSUMPTIONS),
               "uncharged": rep.uncharged, "preprocessing": rep.preprocessing,
               "run_id": rep.run_id,
               "budget_store": rep.store, "scratch_store": rep.scratch,
               "demo_store": rep.demo, "budget_store_created": rep.store_created,
               "job": ("The job's methods share each silo's target for this job: one σ per "
                       "silo is calibrated for their composition. 'combined' is the job's "
                       "spend per silo; 'lifetime' is everything the silo has spent so far."),
               "methods": {rep.label(r): r.privacy() for r in rep.results},
               "combined": rep.combined_privacy, "lifetime": rep.lifetime,
               "persons_across_silos": rep.persons, "linkage": rep.linkage}
    write_json_atomic(d / "privacy_report.json", privacy, indent=1)
    nonfinite: list[str] = []
    summary = json_safe(rep.summary(), nonfinite)
    write_json_atomic(d / "summary.json", dict(summary, nonfinite=nonfinite), indent=1)
    plot_history(rep, d / "metric_over_rounds.png")
    plot_alpha(rep, d / ALPHA_PNG)
    saving.save_models(rep)
