"""Method ``dp_gbdt`` over the network: the silo and server programs of
`silofl.algorithms.gbdt_programs` (the same the in-process `train_dp_gbdt` drives),
hosted by `silo.SiloProgram` and `server.ServerProgram` on the usual transport.

Each wire round carries one protocol message (`gbdt_programs`' table): round t's
broadcast is the server's `Ask` as one float64 vector, a silo's reply its noisy release
as one (1, M) row (none for the last, MODEL, round). The job carries the [trees]
settings (`TreesConfig`) as canonical JSON under the key ``trees``. A silo

* refuses a job whose method it did not consent to, a person-level job, private
  preprocessing, or bins' bounds other than those its own declared schema gives after the
  job's preprocessing (`silofl.data.bounds.feature_bounds`, the rule of `silofl run`; the
  job carries them, derived by the server from its schema) — all at join, nothing charged;
* with bins = "private", answers the first round (BINS) with its noisy fine histograms
  (charged first) and takes the edges the first tree's message brings;
* reserves each round's release in its own lifetime store before the round runs (the
  MODEL round: its local trees) and charges that reservation's ledger before it reads a
  row; a store that refuses makes it leave ("exhausted"), the others go on;
* builds the model itself from the splits and leaf values it is sent, computes its
  personal leaves (shrink) and grows its local trees alone after MODEL, and saves its
  models and privacy report;
* keeps its program's state on disk between messages (`gbdt_state.silo_state`), so a
  fresh process per message (SuperNode) continues the run.

The server only sums releases (automatic bins and shrink = "auto" from the silos' σ_k and
rows, reported at join: public), checkpoints its program after every round (a restarted
server resumes) and writes the ensemble (TreeEnsemble JSON and XGBoost JSON) and its
privacy report. Seeded noise: silo k of K draws the simulator's stream
(`dp_gbdt.program_rngs(seed, K)`), so a networked run equals `train_dp_gbdt`; secure
noise: the CSPRNG (`gbdt_programs.noise_stream`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from silofl.algorithms.dp_gbdt import program_rngs
from silofl.algorithms.gbdt_messages import OP_MODEL, Ask, MessageError
from silofl.algorithms.gbdt_programs import GbdtServer, GbdtSilo, grow_local, noise_stream
from silofl.algorithms.gbdt_settings import GbdtSettings, calibrate_sigma, gbdt_settings
from silofl.algorithms.gbdt_state import (
    restore_silo,
    silo_state,
    trees_from_arrays,
    trees_to_arrays,
)
from silofl.config.run import TreesConfig
from silofl.data.bounds import bounds_from_json, feature_bounds
from silofl.errors import BudgetExceeded, ConfigError, DataError
from silofl.io import write_json_atomic
from silofl.models.trees import TreeEnsemble, xgboost_name_map
from silofl.privacy import events
from silofl.privacy.ledger import Ledger, silo_file_id
from silofl.runtime.network import messages as W
from silofl.runtime.tree_release import bins_source, ensemble_from_dict, ensemble_to_dict
from silofl.training.histograms import tree_event

GBDT = "dp_gbdt"
#: what a seeded networked trees job's privacy reports and cards say
SEEDED = "noise = 'seeded': reproducible experiment noise, NOT a privacy guarantee"
#: pre-encoded .npz data (no schema) whose job states no bounds: the encoding's
#: convention, features mapped to [−1, 1] (values outside fall in the end bins)
NPZ_BOUNDS = (-1.0, 1.0)


def _silos(job: dict) -> list[str]:
    """The job's silo names in order (checked by `jobspec.check_job` before a job is
    used; this module is imported by jobspec and the programs, not the other way)."""
    return list(json.loads(job["silos"]))


def trees_json(trees: dict | str | None = None) -> str:
    """The canonical JSON of a complete [trees] table.

    Parameters
    ----------
    trees : dict or str or None
        The given keys (a table, or its JSON); `TreesConfig`'s defaults for the rest.

    Returns
    -------
    str
        Sorted-key JSON of every [trees] key (ConfigError names an unknown or mistyped
        key).
    """
    if isinstance(trees, str):
        trees = json.loads(trees) if trees else {}
    return json.dumps(TreesConfig(**(trees or {})).model_dump(), sort_keys=True)


def job_trees(job: dict) -> TreesConfig:
    try:
        raw = json.loads(job["trees"]) if job["trees"] else {}
    except json.JSONDecodeError:
        raw = None
    if not isinstance(raw, dict):
        raise W.ProtocolError(f"job: 'trees' must be the JSON of the [trees] settings, got "
                              f"{job['trees'][:200]!r}")
    return TreesConfig(**raw)


def check_gbdt_job(job: dict) -> None:
    """ConfigError for a dp_gbdt job the network cannot run (checked by the server's
    config, deploy and every silo at join, before anything is charged)."""
    if job["privacy_unit"] != "example":
        raise ConfigError("dp_gbdt over the network supports privacy_unit = \"example\" only "
                          f"(got {job['privacy_unit']!r}): person-level trees are not "
                          "implemented; set [job] privacy_unit = \"example\"")
    if job["data_kind"] != "tabular":
        raise ConfigError(f"dp_gbdt needs tabular data, the job has {job['data_kind']!r}")
    if "private" in (job["standardize"], job["impute"]):
        raise ConfigError("dp_gbdt over the network bins the declared bounds: private "
                          "standardize/impute constants are not supported; use \"declared\"")
    if job["schema_sha256"] and not job["bounds"]:
        raise ConfigError("dp_gbdt over a declared schema bins each feature over its declared "
                          "range, but the job carries no 'bounds'; the server derives them "
                          "from its copy of the schema ([server] schema)")
    job_settings(job)


def job_bounds(job: dict, d: int) -> np.ndarray:
    """(d, 2) the bounds a dp_gbdt job's bins span: the job's (derived from the declared
    schema, or stated for pre-encoded data), else `NPZ_BOUNDS` (pre-encoded data only)."""
    if not job["bounds"]:
        return np.tile(NPZ_BOUNDS, (d, 1))
    return bounds_from_json(job["bounds"], d, "job: 'bounds'")


def bounds_note(job: dict) -> str:
    """Where a networked job's bounds came from, in words (cards, privacy reports)."""
    if job["schema_sha256"]:
        return ("the consortium's declared schema and the job's declared preprocessing "
                "(silofl.data.bounds.feature_bounds, as silofl run), carried by the job and "
                "checked by every silo against its own schema at join")
    return ("pre-encoded .npz data: " + ("the job's stated bounds" if job["bounds"] else
            "the encoding's convention, every feature in [-1, 1]") + " (public; no schema)")


def job_settings(job: dict) -> tuple[GbdtSettings, np.ndarray]:
    """The run's checked settings and the declared bounds of its bins.

    Parameters
    ----------
    job : dict
        A checked job (`jobspec.check_job`) of method dp_gbdt.

    Returns
    -------
    (GbdtSettings, numpy.ndarray)
        The settings (automatic bins still to resolve) and the (d, 2) bounds
        (`job_bounds`).
    """
    t = job_trees(job)
    auto = {k: None if getattr(t, k) == "auto" else getattr(t, k) for k in ("trees", "depth")}
    s = gbdt_settings(
        job["task"], job["dim"], **auto, n_bins=t.n_bins, lr=t.lr,
        lam=t.lam, clip_g=t.clip_g, clip_h=None if t.clip_h == "auto" else float(t.clip_h),
        subsample=t.subsample, colsample=t.colsample, min_child_hessian=t.min_child_hessian,
        max_leaf=None if t.max_leaf == "auto" else float(t.max_leaf),
        base_score=t.base_score, splits=t.splits, local_trees=t.local_trees, bins=t.bins,
        bins_share=t.bins_share, shrink=t.shrink)
    return s, job_bounds(job, s.d)


def bins_report(job: dict, bounds: np.ndarray | None) -> dict:
    """What a privacy report states of the bins: mode, (d, 2) bounds and their source."""
    mode = job_trees(job).bins
    return {"mode": mode, "charged": mode == "private",
            "bounds": None if bounds is None else np.asarray(bounds).tolist(),
            "source": bins_source(mode) if job["schema_sha256"] else bounds_note(job),
            "bounds_from": bounds_note(job)}


# --- models on disk ----------------------------------------------------------------------

def load_ensemble(path: str | Path) -> TreeEnsemble:
    """The TreeEnsemble saved by a networked dp_gbdt run.

    Parameters
    ----------
    path : str or Path
        A ``gbdt*.json`` file (`tree_release.ensemble_to_dict`'s JSON; not the
        ``.xgboost.json``).

    Returns
    -------
    TreeEnsemble
    """
    try:
        return ensemble_from_dict(json.loads(Path(path).read_text()))
    except DataError as e:
        raise DataError(f"{path}: {e}") from None


def _save_model(folder: Path, stem: str, ens: TreeEnsemble) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / f"{stem}.json", ensemble_to_dict(ens))
    ens.save_xgboost(folder / f"{stem}.xgboost.json")  # names made XGBoost-safe there
    return {"trees": f"{stem}.json", "xgboost": f"{stem}.xgboost.json",
            "xgboost_name_map": xgboost_name_map(ens.feature_names)}


# --- the silo side ---------------------------------------------------------------------

def check_bounds(program: Any, job: dict, bounds: np.ndarray) -> None:
    """Refuse (ConfigError, at join: nothing charged) a job whose bins' bounds differ from
    those this silo's own schema and the job's declared preprocessing give.

    Parameters
    ----------
    program : silo.SiloProgram
        The silo (its table as encoded by its schema, `raw`, and its plan, `prep`; a silo
        with pre-encoded data has no schema to check against and takes the job's).
    job : dict
        The checked job.
    bounds : numpy.ndarray
        (d, 2) the job's bounds (`job_bounds`).
    """
    from silofl.runtime.network.silo_table import plan
    if getattr(program, "raw", None) is None:
        return
    prep = getattr(program, "prep", None) or plan(program.raw, job, program.cfg.target)
    own = feature_bounds(program.raw, prep)
    if own.shape == bounds.shape and np.allclose(own, bounds, rtol=1e-12, atol=1e-12):
        return
    names = list(program.raw.feature_names)
    bad = [f"{names[j]!r}: job {bounds[j].tolist()}, schema {own[j].tolist()}"
           for j in range(min(len(own), len(bounds))) if not np.allclose(own[j], bounds[j])]
    raise ConfigError(
        f"silo {program.cfg.name!r} refuses the job: the bins' bounds it carries differ from "
        f"those its own declared schema gives after the job's preprocessing ("
        + ("; ".join(bad[:5]) or f"shape {bounds.shape} vs {own.shape}")
        + "). The consortium shares one declared schema: use the coordinator's schema.toml "
        "unchanged, or ask the coordinator to re-derive the job's bounds. Nothing was charged")


class GbdtSiloHost:
    """Silo k's `GbdtSilo` inside its `SiloProgram`: join-time plan, the per-round checks,
    the store reservation of each round, the silo's state on disk and its model."""

    def __init__(self, program: Any, job: dict, job_hash: str):
        """`program`: the `silo.SiloProgram` hosting it (its config, data and store)."""
        from silofl.runtime.job import accountant_kind
        from silofl.runtime.plan import SiloPlan
        c, p = program.cfg, program
        self.program = program
        check_gbdt_job(job)
        self.s, bounds = job_settings(job)
        check_bounds(program, job, bounds)
        if self.s.trees + self.s.local_trees > c.max_rounds:
            raise ConfigError(f"silo {c.name!r} allows at most {c.max_rounds} rounds (trees), "
                              f"the job grows {self.s.trees + self.s.local_trees}")
        names = _silos(job)
        k, K = names.index(c.name), len(names)
        self.accountant = accountant_kind(job["accountant"])
        sigma = calibrate_sigma(self.s, Ledger(c.name, c.target, self.accountant))
        _, silo_rngs, local_rngs = program_rngs(int(job["seed"]), K)
        rng = noise_stream(c.noise, silo_rngs[k])
        self.local_rng = local_rngs[k]  # public: the column sample of its local trees
        self.names = p.feature_names or None
        self.silo = GbdtSilo(self.s, p.silo.X_train, p.silo.y_train, sigma, None, rng,
                             c.name, bounds=bounds)
        self.declared = self.s.run_event(sigma)
        p.job, p.hash, p.index, p.K = job, job_hash, k, K
        p.plan = SiloPlan(c.name, int(p.n_train), self.s.subsample, self.s.releases,
                          c.target, sigma, declared=self.declared, unit="example")
        p.reported = (self.s.releases, float(self.s.subsample), float(sigma))
        p.done, p.last, p.exhausted, p._why = 0, None, False, ""
        self.total = self.s.exchanges
        self.personal: TreeEnsemble | None = None
        self._load()

    def round(self, req: dict, arrays: list) -> tuple[dict, np.ndarray | None]:
        """Check round t's request and message against this silo's own plan and state,
        reserve what answering costs in the store, then answer it."""
        p = self.program
        if len(arrays) != 1 or not isinstance(arrays[0], np.ndarray) or arrays[0].ndim != 1:
            raise W.ProtocolError("round: a dp_gbdt round carries exactly one flat array")
        message = W.check_array(arrays, arrays[0].shape, "round")
        t = req["round"]
        wrong = [f"{k} {req[k]!r} ≠ {v!r}" for k, v in (
            ("job_hash", p.hash), ("silo", p.cfg.name), ("method", GBDT),
            ("steps", p.reported[0]), ("q", p.reported[1]), ("sigma", p.reported[2]))
            if req[k] != v]
        if wrong:
            return p._reply(req, "refused", "request differs from this silo's own plan: "
                            + "; ".join(wrong) + "; nothing was run", None)
        digest = W.signed_bytes({}, message).hex()
        if p.last is not None and t == p.done:
            if p.last["digest"] == digest:  # the server lost our reply: resend it
                return p._reply(req, "ok", "resent", p.last["update"])
            return p._reply(req, "refused", f"round {t} already ran with another message", None)
        if t != p.done + 1 or not 1 <= t <= self.total:
            return p._reply(req, "refused", f"round {t} is not this silo's next dp_gbdt round "
                            f"({p.done + 1} of {self.total}); nothing was run", None)
        if p.exhausted:
            return p._reply(req, "exhausted", p._why, None)
        try:
            ask = Ask.from_array(message)
            self.silo.validate(ask)
        except MessageError as e:
            return p._reply(req, "refused", f"malformed broadcast: {e}", None)
        out = self._answer(t, ask)
        if isinstance(out, bool):  # the store refused the round
            return p._reply(req, "exhausted", p._why, None)
        update = None if out is None else out[None, :]
        p.last, p.done = {"digest": digest, "update": update}, t
        self._save()
        if ask.op == OP_MODEL:
            self.save_release()
        return p._reply(req, "ok", "", update)

    def _cost(self, ask: Ask):
        """What answering `ask` charges (None: nothing): the release's event, or at the
        shared MODEL the local trees' (grown then, in one go)."""
        import dp_accounting as dpa
        if ask.op == OP_MODEL:
            s = self.s
            return dpa.SelfComposedDpEvent(tree_event(self.silo.sigma, s.releases, s.subsample),
                                           s.local_trees) if s.local_trees else None
        what = self.silo.cost(ask)
        return None if what is None else what[0]

    def _answer(self, t: int, ask: Ask) -> np.ndarray | None | bool:
        """Reserve round t's cost in the lifetime store (False: refused, exhausted), then
        run it: the ledger of the reservation is charged before each release."""
        from silofl.runtime.job import open_job
        p, c = self.program, self.program.cfg
        cost = self._cost(ask)
        run = None
        if cost is not None:
            plan = dataclasses.replace(p.plan, declared=cost)
            try:
                run = open_job(p.store, {GBDT: [plan]}, lifetime={c.name: c.lifetime},
                               explicit_lifetime=True, command=f"silo {c.name} round {t}",
                               noise=c.noise, accountant=p.job["accountant"],
                               fingerprints={c.name: p.fingerprint})
            except BudgetExceeded as e:
                p.exhausted, p._why = True, str(e)[:4000]
                self._save()
                return False
        self.silo.ledger = None if run is None else run.ledgers(GBDT)[0]
        try:
            out = self.silo.answer(ask)
            if ask.op == OP_MODEL and self.s.local_trees:
                self.personal = grow_local(self.silo, self.local_rng)
            elif ask.op == OP_MODEL and self.silo.personal_base is not None:  # shrink
                self.personal = self.silo.personal_base
        except BaseException:
            if run is not None:
                run.settle("failed")  # what ran stays charged
            raise
        if run is not None:
            run.settle()
        return out

    def evaluate(self) -> float:
        """The default metric of the silo's model (its personal trees when it grew some)
        on its own test rows (stays local); ConfigError before the final model."""
        from silofl.models import metrics as M
        model = self.personal or self.silo.shared_ensemble
        if model is None:
            raise ConfigError(f"silo {self.program.cfg.name!r} has no model yet (the run "
                              "did not reach its final round)")
        fn = M.metric_fn(M.default_metric(self.s.task), "trees")
        silo = self.program.silo
        return float(fn(silo.y_test, model.predict(silo.X_test)))

    def privacy(self) -> dict:
        """This silo's privacy report: σ, what the whole run spends, its ε at its δ."""
        from silofl.privacy.ledger import tightest
        c = self.program.cfg
        eps, kind = tightest(self.declared, c.delta)
        return {"silo": c.name, "sigma": self.silo.sigma, "noise": c.noise,
                "event": events.to_json(self.declared), "epsilon": float(eps),
                "accountant": kind, "target_epsilon": c.epsilon, "delta": c.delta,
                "rounds_run": self.program.done, "rounds": self.total,
                "statement": "epsilon is the whole run's (shared and local trees) at this "
                             "silo's delta, example level; each round was reserved in its "
                             "store before it ran (a silo that left early spent less)"}

    def save_release(self) -> Path:
        """Write the shared model (and personal one) and the privacy report."""
        p = self.program
        if self.silo.shared_ensemble is None:
            raise ConfigError(f"silo {p.cfg.name!r} has not received the final model yet")
        fid, folder = silo_file_id(p.cfg.name), Path(p.cfg.release_dir)
        shared = TreeEnsemble(**{**vars(self.silo.shared_ensemble),
                                 "feature_names": self.names})
        files = _save_model(folder, f"gbdt-{fid}", shared)
        if self.personal is not None:
            self.personal.feature_names = self.names
            files["personal"] = _save_model(folder, f"gbdt-{fid}-personal", self.personal)
        write_json_atomic(folder / f"gbdt-{fid}-privacy.json",
                          {**self.privacy(), "bins": bins_report(p.job, self.silo.bounds),
                           "job_hash": p.hash, "files": files})
        return folder

    # -- state on disk (a silo process may start per message) ------------------------
    def _paths(self) -> tuple[Path, Path]:
        d = Path(self.program.cfg.state_dir)
        return d / "gbdt.npz", d / "gbdt.json"

    def _save(self) -> None:
        from silofl.io import write_npz_atomic
        p = self.program
        arrays_path, meta_path = self._paths()
        arrays_path.parent.mkdir(parents=True, exist_ok=True)
        arrays, meta = silo_state(self.silo)
        last = p.last
        if last is not None and last["update"] is not None:
            arrays["last_update"] = last["update"]
        write_npz_atomic(arrays_path, compressed=False, **arrays)
        write_json_atomic(meta_path, {
            "job_hash": p.hash, "round": p.done, "exhausted": p.exhausted, "reason": p._why,
            "last_digest": None if last is None else last["digest"], "silo": meta})

    def _load(self) -> None:
        p = self.program
        arrays_path, meta_path = self._paths()
        if not meta_path.is_file():
            return
        m = json.loads(meta_path.read_text())
        if m["job_hash"] != p.hash:
            raise ConfigError(f"silo {p.cfg.name!r}: {meta_path.parent} holds the state of "
                              "another job; give this job a fresh state_dir")
        with np.load(arrays_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        restore_silo(self.silo, arrays, m["silo"])
        p.done, p.exhausted, p._why = int(m["round"]), bool(m["exhausted"]), m["reason"]
        s, trees = self.s, self.silo.ensemble.trees
        base = self.silo.personal_base
        if s.local_trees and len(trees) == s.trees + s.local_trees:  # its personal model
            head = list(trees[:s.trees]) if base is None else list(base.trees)
            self.personal = TreeEnsemble(s.d, s.task, s.base_score, head + trees[s.trees:])
        elif not s.local_trees and base is not None:
            self.personal = base
        if m["last_digest"] is not None:
            p.last = {"digest": m["last_digest"], "update": arrays.get("last_update")}


# --- the server side -------------------------------------------------------------------

class GbdtServerHost:
    """The `GbdtServer` inside a `ServerProgram`: the broadcast of each round, the checks
    of the releases' size, the step and the release of the ensemble. The server program
    is built at the first round, when the silos have joined: automatic bins and
    shrink = "auto" take their σ_k and rows (public, reported at join)."""

    def __init__(self, program: Any):
        """`program`: the `server.ServerProgram` hosting it (its job, config, silos)."""
        job = program.job
        check_gbdt_job(job)
        self.s, self.bounds = job_settings(job)
        self.names = _silos(job)
        self.K = len(self.names)
        self.rng = program_rngs(int(job["seed"]), self.K)[0]  # public: columns, splits
        self.program = program
        self.feature_names = None
        if program.cfg.schema is not None:  # the declared schema names the columns
            from silofl.runtime.network.silo_table import read_schema
            self.feature_names = list(read_schema(program.cfg.schema, "server").feature_names)
        self._server: GbdtServer | None = None
        self.public: tuple[list[float], int] | None = None
        self.total = self.s.exchanges

    @property
    def server(self) -> GbdtServer:
        """The server program (built from the joined silos' σ_k and rows at first use)."""
        if self._server is None:
            reg = self.program.silos
            joined = [reg.get(n) for n in self.names]
            self._build([0.0 if r is None else float(r.sigma) for r in joined],
                        sum(int(r.n_train) for r in joined if r is not None))
        assert self._server is not None
        return self._server

    def _build(self, sigmas: list[float], n_rows: int) -> None:
        self.public = (sigmas, n_rows)
        self._server = GbdtServer(self.s, self.rng, bounds=self.bounds, sigmas=sigmas,
                                  n_rows=n_rows, feature_names=self.feature_names)

    @property
    def message(self) -> np.ndarray:
        return self.server.current.to_array()

    def update_shape(self) -> tuple[int, int] | None:
        n = self.server.release_size()
        return (1, n) if n else None

    def step(self, names: list[str], updates: dict[str, np.ndarray | None]) -> None:
        """The server program's step over the silos that answered (job order)."""
        got = {n: updates[n] for n in names}
        self.server.receive([None if got.get(n) is None else got[n][0]  # type: ignore[index]
                             for n in self.names])

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """The server program between rounds (its checkpoint): arrays and JSON data."""
        srv = self.server
        arrays = {**trees_to_arrays(srv.ensemble.trees), "current": srv.current.to_array(),
                  "sums": np.stack(srv.sums) if srv.sums else np.zeros((0, 2, 1))}
        if srv.edges is not None:
            arrays["edges"] = srv.edges
        if hasattr(srv, "features"):  # the tree being grown
            arrays.update(features=srv.features, heap_feature=srv.feature,
                          heap_threshold=srv.threshold)
        if srv.per_silo:  # shrink = "auto": rows (tree, σ_k, Σg, Σh) of who answered
            arrays["per_silo"] = np.array([[t, sg, *g, *h] for t, rel in
                                           enumerate(srv.per_silo) for sg, g, h in rel])
        return arrays, {"done": srv.done, "rng": srv.rng.bit_generator.state,
                        "public": self.public}

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Resume from `state`'s checkpoint (a restarted server)."""
        self._build(*meta["public"])
        srv = self.server
        srv.ensemble.trees = trees_from_arrays(arrays)
        srv.sums = list(np.array(arrays["sums"])) if len(arrays["sums"]) else []
        srv.current = Ask.from_array(arrays["current"])
        if "edges" in arrays:
            srv.edges = np.array(arrays["edges"], np.float64)
        if "features" in arrays:
            srv.features = np.array(arrays["features"], np.int64)
            srv.feature = np.array(arrays["heap_feature"], np.int32)
            srv.threshold = np.array(arrays["heap_threshold"], np.float64)
        if "per_silo" in arrays:
            rows, L = np.array(arrays["per_silo"]), 2 ** srv.s.depth
            srv.per_silo = [[(float(r[1]), r[2:2 + L], r[2 + L:]) for r in rows
                             if r[0] == t] for t in range(len(srv.sums))]
        srv.done = bool(meta["done"])
        srv.rng.bit_generator.state = meta["rng"]

    def save_release(self, folder: Path) -> Path | None:
        """Write the ensemble (JSON and XGBoost JSON) and the privacy report."""
        p = self.program
        if not self.server.done:
            return None
        files = _save_model(Path(folder), "gbdt", self.server.ensemble)
        silos = {n: {"sigma": r.sigma, "q": r.q, "releases_per_tree": r.steps,
                     "status": r.status, "rounds": len(r.rounds),
                     "event": events.to_json(self.server.s.run_event(r.sigma))}
                 for n, r in p.silos.items()}
        write_json_atomic(Path(folder) / "gbdt-privacy.json", {
            "method": GBDT, "job_hash": p.hash, "privacy_unit": "example",
            "noise": p.job["noise"], "trees": self.server.s.trees,
            "depth": self.server.s.depth, "n_bins": self.server.s.n_bins,
            "bins": bins_report(p.job, self.bounds),
            "statement": "the ensemble is post-processing of the silos' noisy releases "
                         "(private bins' counts, histograms, leaf sums); each silo "
                         "calibrated its σ for its own (ε, δ) and "
                         "charged its own store (its report states the ε it spent); the "
                         "server saw no row",
            "notes": [SEEDED] if p.job["noise"] == "seeded" else [],
            "silos": silos, "files": files})
        return Path(folder)
