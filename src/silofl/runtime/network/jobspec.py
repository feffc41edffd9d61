"""The public job description of a networked run: its keys (`JOB_KEYS`), their checks, and
what the server and every silo build from it alike (algorithm, model, training settings,
starting point, PrivateKT's public set). Pure functions of the job: no silo's data here.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np

from silofl.algorithms import make_algorithm
from silofl.algorithms.auto_lambda import check_lam
from silofl.errors import ConfigError, DataError
from silofl.models import make_model
from silofl.runtime.network import messages as W
from silofl.runtime.network.hosting import check_network_method
from silofl.runtime.plan import EXAMPLE_LEVEL_ONLY, TrainingConfig

JOB_KEYS = {"method": str, "lam": (float, str), "weighted": bool, "finetune_fraction": float,
            "model": str, "task": str, "num_classes": int, "dim": int, "rounds": int,
            "batch_size": int, "local_epochs": float, "lr": float, "clip": float,
            "l2": float, "accountant": str, "noise": str, "seed": int,
            # the silos of the job, in order (a JSON list of names: silo k is names[k])
            "silos": str,
            # IFCA family (clusters, share of ε per selection, share of rounds selecting)
            "clusters": int, "selection_fraction": float, "selection_rounds": float,
            # Weight Erosion: the user silo's name, penalties, what each silo sends, and the
            # public participation schedule (join/leave: a JSON object {silo name: round};
            # the schedule's seed is `seed`)
            "we_user": str, "we_p_s": float, "we_p_d": float, "we_update": str,
            "we_participation": float, "we_join_round": str, "we_leave_round": str,
            "we_count": str, "we_newcomer": str,
            # local-DP methods (PrivateKT, FedAvg-LDP) and the public set's SHA-256 ("" none)
            "ldp_epsilon": float, "ldp_mechanism": str, "ldp_delta": float,
            "client_fraction": float, "max_participation": int, "kt_samples": int,
            "kt_buffer": int, "kt_self_train": float, "kt_server_epochs": int,
            "kt_server_lr": float, "public_seed": int, "public_sha256": str,
            # the kind of data the job trains on (`DATA_KINDS`) and, for graph data, its
            # public settings (JSON; the pandemic track's, `silofl.pandemic.network`)
            "data_kind": str, "graph": str,
            # a silo's own table: the consortium's declared schema (its SHA-256, "" for
            # pre-encoded .npz data) and the declared preprocessing modes every silo applies
            "schema_sha256": str, "standardize": str, "impute": str,
            "preprocess_share": float,
            # fedprox's μ, apfl's initial α and its step size
            "prox_mu": float, "apfl_alpha": float, "apfl_alpha_lr": float,
            # clip = "auto" (private adaptive clipping): "" for a fixed clip, else the JSON
            # of its settings {quantile, lr, init, count_noise} (`auto_clip_job`)
            "clip_auto": str,
            # the privacy unit ("example": one row; "person": all rows of one person of a
            # silo, named by the silo's own person column) and, per person, the most rows
            # one step reads (0: all)
            "privacy_unit": str, "max_rows_per_person": int,
            # uldp: M, the declared most silos one person is in (0: every silo), its weights
            # and persons' sampling rate (the network runs "uniform" at rate 1 only)
            "persons_in_silos": int, "uldp_weighting": str, "uldp_sample_rate": float,
            # dp_gbdt: the [trees] settings (`TreesConfig`) as canonical JSON (`gbdt_host`)
            # and the (d, 2) public bounds its bins span, as JSON [[lower, upper], ...]
            # (derived from the declared schema, `silo_table.declared_bounds`; "" none)
            "trees": str, "bounds": str}

#: [job] keys of clip = "auto" in server.toml, folded into "clip_auto" (`auto_clip_job`)
CLIP_AUTO_KEYS = {"clip_quantile": "quantile", "clip_lr": "lr", "clip_init": "init",
                  "clip_max": "max", "clip_count_noise": "count_noise"}

#: data kinds → the module supplying their job model, algorithm and silo program, imported
#: on use (the runtime does not import the optional tracks): "tabular" rows in an .npz
#: (this module), "graph" the pandemic track's persons and contacts (node-level unit)
DATA_KINDS = {"tabular": None, "graph": "silofl.pandemic.network"}


def data_module(kind: str):
    """The module of data kind `kind` (None: tabular); ProtocolError for an unknown kind."""
    if kind not in DATA_KINDS:
        raise W.ProtocolError(f"data_kind {kind!r} is not one of {', '.join(DATA_KINDS)}")
    name = DATA_KINDS[kind]
    return None if name is None else importlib.import_module(name)


#: job keys whose value, a table {silo name: round}, travels as its JSON string
JOB_TABLES = ("we_join_round", "we_leave_round")
#: job keys given as a TOML table and sent as its JSON string (checked by their method)
JSON_TABLES = (*JOB_TABLES, "trees")


def tables_as_json(job: dict) -> dict:
    """`job` with a table (dict) under a `JOB_TABLES` key (a TOML table, `--set
    we_join_round={b=3}`) replaced by its canonical JSON string."""
    return {k: json.dumps(v, sort_keys=True) if k in JSON_TABLES and isinstance(v, dict)
            else v for k, v in job.items()}


def check_job(job: dict) -> dict:
    """The public job description with exactly `JOB_KEYS` (ProtocolError otherwise)."""
    W.check_fields({**job, "protocol": W.PROTOCOL, "kind": "job"},
                   {**JOB_KEYS, "protocol": str, "kind": str}, "job")
    for key in JOB_TABLES:
        job_rounds(job, key)
    try:  # λ: a number ≥ 0 or "auto" (λ_k from the released updates)
        lam = check_lam(job["lam"], "job: field 'lam'")
    except ConfigError as e:
        raise W.ProtocolError(str(e)) from None
    check_unit(job)
    # ints where floats are expected are the same number: one canonical form to hash
    out = {k: lam if k == "lam" else float(v) if JOB_KEYS[k] is float else v
           for k, v in job.items()}
    if out["bounds"] and out["method"] != "dp_gbdt":
        raise W.ProtocolError(f"job: 'bounds' (the bins' bounds) is for method dp_gbdt, the "
                              f"job runs {out['method']!r}; remove it")
    if out["method"] == "dp_gbdt":  # the complete [trees] table, one canonical form
        from silofl.runtime.network.gbdt_host import job_trees, trees_json
        try:
            out["trees"] = trees_json(job_trees(out).model_dump())
        except ConfigError as e:
            raise W.ProtocolError(f"job: 'trees': {e}") from None
    return out


#: privacy units a networked tabular job can name (graph data: its own node level)
NETWORK_UNITS = ("example", "person")


def check_unit(job: dict) -> None:
    """ProtocolError for a job's privacy unit the network cannot run: not `NETWORK_UNITS`,
    a negative row cap, or the person level on graph data (node level there)."""
    unit, cap = job["privacy_unit"], job["max_rows_per_person"]
    if unit not in NETWORK_UNITS:
        raise W.ProtocolError(f"job: privacy_unit must be 'example' (one row) or 'person' "
                              f"(all rows of one person of a silo), got {unit!r}")
    if cap < 0 or (cap and unit != "person"):
        raise W.ProtocolError(f"job: max_rows_per_person (the most rows of one person a step "
                              f"reads; 0 = all) must be ≥ 0 and is for privacy_unit = "
                              f"'person', got {cap!r} with {unit!r}")
    if unit == "person" and job["data_kind"] != "tabular":
        raise W.ProtocolError(f"job: privacy_unit = 'person' needs tabular data; "
                              f"{job['data_kind']!r} data has its own unit")
    if unit == "person" and job["method"] in EXAMPLE_LEVEL_ONLY:
        raise W.ProtocolError(f"job: {job['method']} is not available with privacy_unit = "
                              "'person': its local-DP uploads are accounted per example; use "
                              "a DP-SGD method")


def auto_clip_job(job: dict) -> dict:
    """A [job] table with ``clip = "auto"`` and its `CLIP_AUTO_KEYS` as the wire form: clip
    = C₀ (a float) and "clip_auto" = the settings' JSON (defaults: `TrainingConfig`'s).

    Parameters
    ----------
    job : dict
        The [job] keys as written (server.toml, `deploy init --set`).

    Returns
    -------
    dict
        A copy with only `JOB_KEYS` names for the clip. ConfigError: clip_* keys without
        clip = "auto".
    """
    out = {k: v for k, v in job.items() if k not in CLIP_AUTO_KEYS}
    given = {CLIP_AUTO_KEYS[k]: v for k, v in job.items() if k in CLIP_AUTO_KEYS}
    if job.get("clip") != "auto":
        if given:
            raise ConfigError(f"[job] {', '.join(sorted(k for k in job if k in CLIP_AUTO_KEYS))}"
                              " only apply with clip = \"auto\"")
        return out
    d = TrainingConfig()
    settings = {"quantile": d.clip_quantile, "lr": d.clip_lr, "init": d.clip_init,
                "max": d.clip_max, "count_noise": d.clip_count_noise, **given}
    out["clip"] = float(settings["init"]) if isinstance(settings["init"], (int, float)) \
        else settings["init"]
    out["clip_auto"] = json.dumps(settings, sort_keys=True)
    return out


def job_config(job: dict) -> TrainingConfig:
    auto, d_max = {}, TrainingConfig().clip_max
    if job.get("clip_auto"):
        try:
            s = json.loads(job["clip_auto"])
            auto = dict(clip="auto", clip_quantile=s["quantile"], clip_lr=s["lr"],
                        clip_init=s["init"], clip_max=s.get("max", d_max),
                        clip_count_noise=s["count_noise"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise W.ProtocolError(f"job: 'clip_auto' must be the JSON of clip = \"auto\"'s "
                                  f"settings, got {job['clip_auto'][:200]!r}") from None
    return TrainingConfig(rounds=job["rounds"], local_epochs=job["local_epochs"],
                          batch_size=job["batch_size"], lr=job["lr"],
                          **({"clip": job["clip"]} | auto),
                          l2=job["l2"], accountant=job["accountant"], noise=job["noise"],
                          seed=job["seed"], eval_every=job["rounds"],
                          privacy_unit=job["privacy_unit"],
                          max_rows_per_person=job["max_rows_per_person"])


def job_silos(job: dict) -> list[str]:
    """The job's silo names in order (ProtocolError for a malformed list)."""
    try:
        names = json.loads(job["silos"])
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list) or not names or not all(
            isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise W.ProtocolError(f"job: 'silos' must be a JSON list of distinct silo names, got "
                              f"{job['silos'][:200]!r}")
    return names


def job_rounds(job: dict, key: str) -> dict:
    """Weight Erosion's join or leave rounds {silo name: round} from the job's JSON string
    `key` (ProtocolError naming the key for a malformed one; the rounds themselves are
    checked by the algorithm)."""
    try:
        rounds = json.loads(job[key])
    except json.JSONDecodeError:
        rounds = None
    if not isinstance(rounds, dict):
        raise W.ProtocolError(f"job: {key!r} must be a JSON object {{silo name: round}}, e.g. "
                              f"'{{\"b\": 3}}' ('{{}}': none), got {job[key][:200]!r}")
    return rounds


def job_algorithm(job: dict, public: np.ndarray | None = None):
    """The job's algorithm, bound to the job's silos (names resolve to indices) and, for
    PrivateKT, to the public set `public` (whose SHA-256 the job states)."""
    graph = data_module(job["data_kind"])
    if graph is not None:
        return graph.job_algorithm(job)
    if job["method"] == "dp_gbdt":  # no Algorithm: the trees' programs (`gbdt_host`)
        from silofl.runtime.network.gbdt_host import check_gbdt_job
        check_gbdt_job(job)
        return None
    check_network_method(job["method"])
    if job["method"] == "scaffold":
        from silofl.algorithms.scaffold import check_step_size
        check_step_size(job["lr"])
    alg = make_algorithm(
        job["method"], lam=job["lam"], weighted=job["weighted"],
        finetune_fraction=job["finetune_fraction"], clusters=job["clusters"],
        selection_fraction=job["selection_fraction"], selection_rounds=job["selection_rounds"],
        we_user=job["we_user"] or None, we_p_s=job["we_p_s"], we_p_d=job["we_p_d"],
        we_options={"update": job["we_update"], "participation": job["we_participation"],
                    "join_round": job_rounds(job, "we_join_round"),
                    "leave_round": job_rounds(job, "we_leave_round"),
                    "count": job["we_count"], "newcomer": job["we_newcomer"],
                    "seed": job["seed"]},  # the schedule's public seed, as training.seed
        ldp_epsilon=job["ldp_epsilon"],
        ldp_mechanism=job["ldp_mechanism"], ldp_delta=job["ldp_delta"],
        client_fraction=job["client_fraction"], max_participation=job["max_participation"],
        kt_samples=job["kt_samples"], kt_buffer=job["kt_buffer"],
        kt_self_train=job["kt_self_train"], kt_server_epochs=job["kt_server_epochs"],
        kt_server_lr=job["kt_server_lr"], public_seed=job["public_seed"],
        prox_mu=job["prox_mu"], apfl_alpha=job["apfl_alpha"], apfl_alpha_lr=job["apfl_alpha_lr"],
        persons_in_silos=job["persons_in_silos"], uldp_weighting=job["uldp_weighting"],
        uldp_sample_rate=job["uldp_sample_rate"])
    names = job_silos(job)
    alg.bind_silos(names)
    # PrivateKT: the public set, checked against the job (uldp binds no data over the
    # network: a silo has its own persons only, weights 1/M)
    if hasattr(alg, "bind_data") and not getattr(alg, "consortium", False):
        if public is None or public_sha256(public) != job["public_sha256"]:
            raise ConfigError(
                f"{job['method']} needs the public set D_p on the server and every silo: "
                "set public_data (an .npz with X) under [server] and [silo]; the job states "
                f"its SHA-256 ({job['public_sha256'][:12] or 'none'}), and "
                + ("none is given" if public is None else "the file given differs"))
        from types import SimpleNamespace
        stand_in = SimpleNamespace(meta={"public_X": public}, task=job["task"],
                                   num_classes=job["num_classes"],
                                   silos=[SimpleNamespace(X_train=public[:1])])
        alg.bind_data(stand_in, job_model(job))
    if hasattr(alg, "bind_model"):  # FedPer, FedRep, FedBN: the personal coordinates
        alg.bind_model(job_model(job))
    alg.check_plan(len(names), job["rounds"], job["accountant"])
    return alg


def public_sha256(X: np.ndarray) -> str:
    """SHA-256 of a public array (its float64 bytes and shape): what the job pins."""
    import hashlib
    X = np.ascontiguousarray(X, dtype=np.float64)
    return hashlib.sha256(X.tobytes() + str(X.shape).encode()).hexdigest()


def load_public(path: Path | None, who: str) -> np.ndarray | None:
    """The public set X (an .npz with key X) or None; DataError naming the file."""
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return np.asarray(z["X"], dtype=np.float64)
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{who}: cannot read the public set {str(path)!r} ({e}); it must be "
                        "an .npz with an array X (public, unlabeled examples)") from None


def job_model(job: dict):
    graph = data_module(job["data_kind"])
    if graph is not None:
        return graph.job_model(job)
    return make_model(job["model"], job["dim"], job["num_classes"])


def job_params0(job: dict, model) -> np.ndarray:
    """(P,) the common starting point of the job's model (server and every silo)."""
    graph = data_module(job["data_kind"])
    return model.init_params() if graph is None else graph.job_params0(job, model)
