"""A non-private reference for the main job, on public data only.

On the built-in UCI heart-disease data (public), `silofl run` also trains every method
without DP so that the figure and history.json show what the privacy costs. On any other
source this is never done: a non-private model of private data, or its test metrics, would
itself be a release no budget covers.
"""

from __future__ import annotations

import dataclasses

from silofl.runtime.simulator import RunResult, simulate

#: the key under which history.json (each method's "extra") records the reference
REFERENCE_KEY = "nonprivate_reference"
#: sources whose rows are public, so a non-private reference releases nothing
PUBLIC_SOURCES = frozenset({"heart"})
NOTE = ("trained without DP on the public built-in data for comparison; public data only, "
        "not a release of private data")


def wanted(cfg, tcfg) -> bool:
    """Only for a private job on public data (a non-private job is its own reference)."""
    return tcfg.private and cfg.data.source in PUBLIC_SOURCES


def add_nonprivate_reference(cfg, fed, model, algorithms, tcfg,
                             results: list[RunResult]) -> None:
    """Train each of `algorithms` again without DP on `fed` and store its per-round test
    metrics in the matching result's `history.extra[REFERENCE_KEY]`; no-op unless
    `wanted`. Non-private runs charge no budget and need no store."""
    if not wanted(cfg, tcfg):
        return
    ref_cfg = dataclasses.replace(tcfg, private=False)
    from silofl.experiments.run_trees import is_trees, run_trees
    for alg, r in zip(algorithms, results):
        ref = run_trees(fed, alg, ref_cfg, r.plans, metric=r.metric) if is_trees(alg) \
            else simulate(fed, model, alg, ref_cfg, metric=r.metric)
        r.history.extra[REFERENCE_KEY] = {"pooled": ref.history.pooled,
                                          "per_silo": ref.history.per_silo, "note": NOTE}


def reference_of(r: RunResult) -> dict | None:
    """The non-private reference recorded for `r`, if any."""
    return r.history.extra.get(REFERENCE_KEY)
