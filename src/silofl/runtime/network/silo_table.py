"""A silo's own table (CSV, CSV.gz, Parquet) read with the consortium's declared schema.

The schema is the only thing the silos share. Each silo reads its own file with the same
reader `silofl run` uses (`silofl.data.tabular`), encodes it by the schema, splits its rows
into train/test with its own seed and preprocesses them with *declared* constants only
(schema bounds, means, fills: public, no cost). The job names the schema by its SHA-256
(`schema_sha256`) and the feature count (`dim`); a silo whose schema differs refuses the job.

Private preprocessing (`standardize`/`impute` = "private": one Gaussian release of the
silo's own statistics, `preprocess_share` of its ε) is planned at join from public facts
(`plan_preprocessing`), composed into the silo's σ calibration, reserved in its store with
the first round it runs and recorded as spent before the release reads a row (the
simulator's protocol, `silofl run`); its constants are kept in the silo's state so that a
restart applies them rather than releasing again. Uncharged statistics are never computed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from silofl.config.base import validate
from silofl.config.network import SiloDataSection
from silofl.data.bounds import bounds_from_json, feature_bounds
from silofl.data.federation import Federation, Silo
from silofl.data.preprocess import PreprocessPlan, PreprocessSpec, preprocess_without_budget
from silofl.data.raw import RawFederation
from silofl.data.schema import Schema, load_schema
from silofl.errors import ConfigError, DataError
from silofl.privacy.targets import PrivacyTarget

if TYPE_CHECKING:
    from silofl.training.trainer import LocalTrainer

#: preprocessing modes a networked job can run (charged at the silo, or free; never uncharged)
NETWORK_PREPROCESSING = ("auto", "declared", "private", "none")
_SILO_COLUMN = "__silofl_silo__"  # the silo column when the schema names none


def schema_sha256(schema: Schema) -> str:
    """SHA-256 of the schema's canonical JSON (its meaning, not its file's spelling)."""
    text = json.dumps(schema.to_dict(), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def read_schema(path: Path, who: str) -> Schema:
    """The declared schema at `path` (a ConfigError naming `who` and the file otherwise)."""
    if not Path(path).is_file():
        raise ConfigError(f"{who}: schema file {str(path)!r} not found; every silo and the "
                          "server keep a copy of the consortium's declared schema "
                          "(`silofl deploy init --schema` writes one into each folder)")
    return load_schema(path)


@dataclass
class TableSettings:
    """A silo's [data] section with its paths resolved (`table_settings`; keys and
    defaults: `silofl.config.network.SiloDataSection`)."""

    path: Path
    schema: Path
    test_fraction: float
    seed: int
    missing: str
    sep: str                  # CSV separator ("" = ","), as `silofl run`'s [data] sep
    encoding: str             # CSV text encoding ("" = utf-8), as [data] encoding
    drop: tuple[str, ...]
    person_column: str = ""   # the person of each row ("" none): person-level jobs


def table_settings(raw: dict | SiloDataSection | None, base: Path, where: str
                   ) -> TableSettings | None:
    """The [data] section of a silo config (`silofl.config.network.SiloDataSection`: the
    run's [data] keys and defaults that a table uses), paths relative to `base`; None when
    absent. ConfigError naming `where` and the key."""
    if not raw:
        return None
    d = raw if isinstance(raw, SiloDataSection) else validate(SiloDataSection, raw, "data",
                                                              where)
    return TableSettings(base / d.path, base / d.schema, d.test_fraction, d.seed, d.missing,
                         d.sep, d.encoding, tuple(d.drop), d.person_column)


def read_silo_table(name: str, ts: TableSettings, target: PrivacyTarget
                    ) -> tuple[RawFederation, Schema]:
    """This silo's rows encoded by the schema and split (no statistic computed): a
    one-silo `RawFederation` and the schema. Every row of the file is the silo's own: a
    silo column in it, if any, is overwritten with the silo's name."""
    from silofl.data.tabular import federation_from_frame_raw, read_table
    schema = read_schema(ts.schema, f"silo {name!r}")
    col = schema.silo_column or _SILO_COLUMN
    # ids read as text; the reader takes the key only where a silo names the column
    person: dict[str, Any] = {"person_column": ts.person_column} if ts.person_column else {}
    df = read_table(ts.path, text_columns=[col, *person.values()], sep=ts.sep,
                    encoding=ts.encoding, drop=ts.drop)
    df[col] = name
    raw = federation_from_frame_raw(df, col, schema.label.name, schema=schema,
                                    test_fraction=ts.test_fraction, seed=ts.seed,
                                    missing=ts.missing, name=f"silo {name!r}", **person)
    if not raw.silos or raw.silos[0].n_train < 1:
        raise DataError(f"silo {name!r}: its table {str(ts.path)!r} has no training rows "
                        "left after the split; it needs more rows")
    s = raw.silos[0]  # the person ids (if any) stay with their rows
    raw.silos[0] = Silo(name, s.X_train, s.y_train, s.X_test, s.y_test, target,
                        s.person_train, s.person_test)
    return raw, schema


def load_silo_data(cfg) -> tuple[Silo, list[str]]:
    """A silo's pre-encoded data: its .npz at `cfg.data` (X_train, y_train, X_test, y_test,
    optional feature_names and person_train/person_test: the person of each row, never a
    feature). Returns the silo (target `cfg.target`) and its feature names; DataError
    naming the file."""
    try:
        with np.load(cfg.data, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("X_train", "y_train", "X_test", "y_test")}
            names = [str(v) for v in z["feature_names"]] if "feature_names" in z else []
            persons = [z[k] if k in z else None for k in ("person_train", "person_test")]
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"silo {cfg.name!r}: cannot read its data file {str(cfg.data)!r} "
                        f"({e}); it must be an .npz with X_train, y_train, X_test, "
                        "y_test") from None
    silo = Silo(cfg.name, arrays["X_train"].astype(np.float64), arrays["y_train"],
                arrays["X_test"].astype(np.float64), arrays["y_test"], cfg.target, *persons)
    for part, ids in zip(("train", "test"), persons):
        if ids is not None and (ids.ndim != 1 or len(ids) != len(arrays[f"y_{part}"])):
            raise DataError(f"silo {cfg.name!r}: {str(cfg.data)!r} holds person_{part} of "
                            f"shape {ids.shape} for {len(arrays[f'y_{part}'])} rows; give "
                            "one person id per row")
    return silo, names


def check_person_job(name: str, job: dict, silo: Silo, table: TableSettings | None) -> None:
    """Refuse (ConfigError) a person-level job at a silo whose data names no person of each
    row: at join, before anything is charged or read for training."""
    if job.get("privacy_unit") != "person" or silo.person_train is not None:
        return
    fix = ("set [data] person_column in its silo.toml to the column naming each row's "
           "person (a patient or customer id)" if table is not None else
           "add person_train and person_test (the person of each row) to its .npz data file")
    raise ConfigError(f"silo {name!r} refuses the job: privacy_unit = 'person' protects all "
                      f"rows of one person, and this silo's data names no person of its rows; "
                      f"{fix}, or run the job at privacy_unit = 'example'. Nothing was charged")


def preprocess_spec(job: dict) -> PreprocessSpec:
    """The job's preprocessing modes, refused unless they cost nothing (declared/none)."""
    for key in ("standardize", "impute"):
        if job[key] not in NETWORK_PREPROCESSING or key == "impute" and job[key] == "none":
            raise ConfigError(
                f"job: {key} = {job[key]!r} cannot run over the network: statistics read "
                "from a silo's rows without a charge are never computed there. Use 'auto' or "
                "'declared' (the schema's public bounds, means and fills; no cost) or "
                "'private' (a Gaussian release charged to each silo's own store)"
                + (" or 'none'" if key == "standardize" else ""))
    return PreprocessSpec(job["standardize"], job["impute"], job["preprocess_share"])


def is_private(job: dict) -> bool:
    """Whether the job's preprocessing releases private statistics at each silo."""
    return "private" in (job["standardize"], job["impute"])


def plan(raw: RawFederation, job: dict, target: PrivacyTarget) -> PreprocessPlan:
    """The silo's preprocessing plan (public facts only: schema, n, its target)."""
    from silofl.data.preprocess import plan_preprocessing
    return plan_preprocessing(raw, preprocess_spec(job), {raw.names[0]: target},
                              accountant=job["accountant"])


def release(raw: RawFederation, prep: PreprocessPlan, job: dict) -> Federation:
    """Apply the plan; a private one draws its noise from the silo's own stream (secure, or
    seeded by (seed, silo) for experiments). Call only once its event is charged."""
    import zlib

    from silofl.data.preprocess import apply_preprocessing
    from silofl.privacy.randomness import Randomness
    name = raw.names[0]
    rng = Randomness.for_mode(job["noise"], None if job["noise"] == "secure" else
                              [int(job["seed"]), 0x9E7, zlib.crc32(name.encode("utf-8"))])
    return apply_preprocessing(raw, prep, rng)


def apply_constants(raw: RawFederation, constants: dict) -> Federation:
    """The silo's rows with constants released earlier (kept in its state): clip, fill,
    (x - center) / scale, as `apply_preprocessing` did — no statistic is computed again."""
    import numpy as np
    name = raw.names[0]
    own = constants["silos"][name]
    index = {n: j for j, n in enumerate(raw.feature_names)}
    s = raw.silos[0]
    out = []
    for X in (s.X_train, s.X_test):
        X = np.array(X, dtype=np.float64)
        for col, (lo, hi) in constants["clip"].items():
            X[:, index[col]] = np.clip(X[:, index[col]], lo, hi)
        for col, fill in own["fill"].items():
            j = index[col]
            X[np.isnan(X[:, j]), j] = fill
        for col, (center, scale) in own["standardize"].items():
            j = index[col]
            X[:, j] = (X[:, j] - center) / scale
        out.append(X)
    silo = Silo(name, out[0], s.y_train, out[1], s.y_test, s.target, s.person_train,
                s.person_test)
    meta = {**raw.meta, "constants": constants}
    meta.pop("schema_from_data", None)
    return Federation([silo], list(raw.feature_names), raw.task, raw.num_classes, raw.name,
                      meta)


def preprocess(raw: RawFederation, job: dict) -> Federation:
    """The silo's rows preprocessed with declared constants only (no budget needed)."""
    return preprocess_without_budget(raw, preprocess_spec(job), "a networked silo")


def check_preprocessing(schema: Schema, job: dict) -> None:
    """ConfigError unless every silo can run the job's preprocessing with this schema
    (e.g. private steps need declared bounds): planned on placeholder rows."""
    raw = _placeholder(schema)
    plan(raw, job, PrivacyTarget(1.0, 1e-4))


def declared_bounds(schema: Schema, job: dict) -> np.ndarray:
    """The (d, 2) public bounds of a dp_gbdt job's bins, from the declared schema and the
    job's preprocessing modes alone (`silofl.data.bounds.feature_bounds`, the rule of
    `silofl run`; planned on placeholder rows: no one's data).

    Parameters
    ----------
    schema : Schema
        The consortium's declared schema.
    job : dict
        The job (its standardize, impute, preprocess_share and accountant).

    Returns
    -------
    numpy.ndarray
        (d, 2) float64 [lower, upper] per encoded feature after preprocessing.

    Raises
    ------
    ConfigError
        A numeric column without declared bounds, or standardized per silo.
    """
    raw = _placeholder(schema)
    job = {**job, "preprocess_share": float(job["preprocess_share"])}
    return feature_bounds(raw, plan(raw, job, PrivacyTarget(1.0, 1e-4)))


def same_bounds(text: str, bounds: np.ndarray) -> bool:
    """Whether the JSON bounds `text` equal `bounds` ((d, 2); floats that round-trip JSON
    exactly, compared to 1e-12 so that a re-encoding elsewhere still agrees)."""
    try:
        got = bounds_from_json(text, len(bounds), "bounds")
    except ConfigError:
        return False
    return bool(np.allclose(got, bounds, rtol=1e-12, atol=1e-12))


def declared_constants(schema: Schema, job: dict) -> dict:
    """The constants new rows need (`clip`, `fill`, `standardize`), from the schema alone:
    declared preprocessing is data-independent, so it is computed on a placeholder row."""
    fed = preprocess(_placeholder(schema), job)
    const = fed.meta["constants"]
    return {"clip": const["clip"], **const["silos"]["shared"]}


def _placeholder(schema: Schema) -> RawFederation:
    """Rows that fit the schema (no one's data): for checks of data-independent steps."""
    import pandas as pd

    from silofl.data.tabular import federation_from_frame_raw
    row = {}
    for c in schema.columns:
        if c.kind == "numeric":
            row[c.name] = c.lower if c.lower is not None else 0.0
        elif c.kind == "binary":
            row[c.name] = 0
        else:
            row[c.name] = c.levels[0]
    lab = schema.label
    values = list(lab.classes) if lab.kind != "regression" else [lab.lower or 0.0, 1.0]
    col = schema.silo_column or _SILO_COLUMN
    df = pd.DataFrame([{**row, lab.name: values[i % len(values)]}
                       for i in range(4 * len(values))])
    df[col] = "shared"
    return federation_from_frame_raw(df, col, lab.name, schema=schema, test_fraction=0.25,
                                     seed=0, name="schema")


class TableSilo(Protocol):
    """What the table hooks read of a silo's configuration (`silo_config.SiloConfig`)."""

    @property
    def name(self) -> str: ...

    @property
    def target(self) -> PrivacyTarget: ...


class TableHooks:
    """The silo program's steps for a table (mixed into `SiloProgram`): its preprocessing
    plan, the private release as an extra charge of the first round it runs, and the
    released constants (kept in its state)."""

    # set by the program the hooks are mixed into
    cfg: TableSilo
    raw: RawFederation | None  # the table as read (None: pre-encoded .npz data)
    job: dict | None  # the accepted job (None until a join)
    silo: Silo
    trainer: LocalTrainer
    # set here; `prep` and `table_release_due` are absent until a job's plan is made
    prep: PreprocessPlan
    table_release_due: bool
    constants: dict[str, Any] | None

    def _data_trainer(self) -> LocalTrainer:
        raise NotImplementedError  # the program's own (`SiloProgram._data_trainer`)

    def _table(self) -> RawFederation:
        """The silo's table (ConfigError for a silo without one: pre-encoded data)."""
        if self.raw is None:
            raise ConfigError(f"silo {self.cfg.name!r} holds no table (pre-encoded data)")
        return self.raw

    def _table_plan(self, job: dict) -> None:
        """Plan the table's preprocessing: declared (free) is applied now; a private
        release waits for the first round this silo runs, which reserves it (the rows
        stand in with their gaps zeroed until then: planning reads only n)."""
        raw = self._table()
        self.prep = plan(raw, job, self.cfg.target)
        self.table_release_due = self.prep.private
        if not self.prep.private:
            fed = preprocess(raw, job)
            self.silo, self.constants = fed.silos[0], fed.meta["constants"]
            return
        s = raw.silos[0]
        self.silo = Silo(s.name, np.nan_to_num(s.X_train), s.y_train, np.nan_to_num(s.X_test),
                         s.y_test, s.target, s.person_train, s.person_test)
        self.constants = None

    def _table_extra(self) -> list:
        """The private preprocessing release still to run, as the store's extra charge."""
        if not getattr(self, "table_release_due", False):
            return []
        from silofl.privacy.budget import PlannedCharge
        from silofl.runtime.job import NO_METHOD
        return [PlannedCharge(self.cfg.name, NO_METHOD, "preprocess",
                              self.prep.events[self.cfg.name])]

    def _table_release(self, job) -> None:
        """The private release, recorded as spent in the round's reservation first; then
        the trainer works on the preprocessed rows (kept in the state: never released
        twice by one state)."""
        job.spend_extra(self.cfg.name, "preprocess")
        if self.job is None:  # reserved by a round, so a job was accepted
            raise ConfigError(f"silo {self.cfg.name!r} has accepted no job yet (join first)")
        fed = release(self._table(), self.prep, self.job)
        self._use_constants(fed)

    def _use_constants(self, fed) -> None:
        self.silo, self.constants = fed.silos[0], fed.meta["constants"]
        self.table_release_due = False
        ledgers = getattr(self.trainer, "ledgers", None)
        self.trainer = self._data_trainer()
        if ledgers is not None:
            self.trainer.ledgers = ledgers
