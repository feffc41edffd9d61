"""`silofl persons`: a first look, before training, at what a person seen by m silos would
be guaranteed under a job's plans — and, with a linkage key, at the actual overlap.

Without a key nothing is released and nothing is charged: the table composes each silo's
*planned* events (every method's declared events and any private preprocessing, as the
job would reserve them) for m = 1..K, with the declared M marked. Planning reads the
silos' public sizes (numbers of persons) only, as `silofl run` does before it reserves.

With a key (`experiments.linkage`), the noisy overlap histogram is released once: charged
to every silo's lifetime budget store (its own run, command ``silofl persons``) before
any person id is pseudonymized, then shown as the table's "persons (noisy)" column. It is
a release of its own: a later `silofl run` with the key releases (and charges) again
unless it sets ``[privacy] overlap_epsilon = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa

from silofl.config import Config
from silofl.errors import ConfigError
from silofl.experiments import linkage
from silofl.experiments.person_report import person_report
from silofl.experiments.run import _lifetime, _prepare, check_demo_store, open_store
from silofl.privacy.budget import BudgetStore
from silofl.runtime.job import fingerprints, open_job


@dataclass
class PersonLook:
    """`first_look`'s answer.

    Attributes
    ----------
    report : dict
        `person_report` of the planned events (with the noisy column after a release).
    linkage : dict or None
        `linkage.describe`: the release, its ε and noise, or None without a key.
    charged : bool
        Whether the silos' lifetime stores were charged (a release happened).
    run_id, store : str or None
        The store's run of the release and the store (None: nothing charged / scratch).
    """

    report: dict[str, Any]
    linkage: dict[str, Any] | None
    charged: bool
    run_id: str | None = None
    store: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (noisy figures only)."""
        return {"persons_across_silos": self.report, "linkage": self.linkage,
                "charged": self.charged, "run_id": self.run_id, "budget_store": self.store}


def first_look(cfg: Config, store: BudgetStore | None = None) -> PersonLook:
    """The person table of a job's plans, with the released overlap when a key is set.

    Parameters
    ----------
    cfg : Config
        A private job at ``[privacy] unit = "person"``.
    store : BudgetStore, optional
        The store to charge (default: the job's, `experiments.run.open_store`).

    Returns
    -------
    PersonLook

    Raises
    ------
    ConfigError
        Not a private person-level job; a bad key (nothing charged).
    BudgetExceeded
        A silo cannot pay for the release: none is charged, nothing is released.
    """
    pc = cfg.privacy
    if not pc.enabled or pc.unit != "person":
        raise ConfigError("silofl persons describes a person-level job: set [privacy] unit = "
                          "\"person\" (with [data] person_column) and keep privacy enabled")
    job_cfg = cfg
    if "uldp" in cfg.training.methods and pc.overlap_epsilon:  # the job itself releases
        job_cfg = cfg.model_copy(deep=True)  # none; the overlap ε is for this release
        job_cfg.privacy.overlap_epsilon = 0.0
    p = _prepare(job_cfg)  # plans, and the key checked, before the store is opened
    link = p.link
    if link is not None and not link.events:  # the job releases none: one of its own
        link = linkage.plan_linkage(cfg, p.raw, standalone=True)
    tcfg: Any = p.tcfg  # _Prepared types its fields loosely
    raw: Any = p.raw
    spent = linkage.merged(p.extra, p.link)
    silo_events: dict[str, list[dpa.DpEvent]] = {}
    targets = {}
    for plans in p.plans:
        for pl in plans:
            silo_events.setdefault(pl.name, []).append(pl.declared)
            targets[pl.name] = pl.target
    for name, ev in spent.items():
        silo_events.setdefault(name, []).append(ev)
    release, run_id, where = None, None, None
    if link is not None and link.events:
        st = store if store is not None else open_store(cfg)
        check_demo_store(cfg, st)
        job = open_job(st, {}, lifetime=_lifetime(cfg, raw),
                       explicit_lifetime=cfg.budget.epsilon is not None,
                       command="silofl persons", noise=tcfg.noise,
                       accountant=tcfg.accountant, fingerprints=fingerprints(raw),
                       extra=linkage.charges(link))
        try:
            release = linkage.release(link, raw, job, tcfg.noise, cfg.training.seed)
        except BaseException:
            job.settle("failed")
            raise
        job.settle()
        run_id, where = job.run_id, (None if st.path is None else str(st.path))
    report = person_report(silo_events, targets, pc.delta, pc.persons_in_silos, release)
    info = linkage.describe(link)
    if info is not None and info.get("overlap"):
        info["overlap"]["charged"] = (
            "to every silo's ledger and lifetime budget store, as a run of its own "
            "(command \"silofl persons\"); a later `silofl run` with the key releases and "
            "charges the overlap again unless [privacy] overlap_epsilon = 0 (a uldp job "
            "releases none)")
    return PersonLook(report, info, release is not None, run_id, where)
