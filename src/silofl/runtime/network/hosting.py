"""One silo's share of an algorithm's state and randomness — what a networked silo hosts,
and what the simulator's per-silo mode hosts for every silo, so both run the same code.

`silo_randomness` gives each silo its own stream: secure (OS entropy) by default; in the
reproducible "seeded" mode keyed by (seed, silo name), so a silo process and the
simulator's per-silo mode draw the same batches and noise for that silo.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from silofl.algorithms.base import Algorithm, SiloState
from silofl.errors import ConfigError
from silofl.privacy.randomness import Randomness

#: methods whose silo step sends one update row per silo and whose server step needs only
#: the responders' rows and weights (a weighted mean): these run over the network
NETWORK_METHODS = ("local", "fedavg", "mrmtl", "ditto", "finetune")


def check_network_method(name: str) -> None:
    if name not in NETWORK_METHODS:
        raise ConfigError(
            f"method {name!r} does not run over the network yet: its server step needs every "
            f"silo's state (or a silo-side choice the server coordinates). Network methods: "
            f"{', '.join(NETWORK_METHODS)}; run {name!r} in the simulator (`silofl run`)")


def silo_randomness(mode: str, seed: int, name: str) -> Randomness:
    """Silo `name`'s own stream: secure, or seeded by (seed, CRC-32 of the name)."""
    if mode == "secure":
        return Randomness.secure()
    return Randomness.for_mode(mode, [int(seed), zlib.crc32(name.encode("utf-8"))])


def slice_state(state: SiloState, k: int) -> SiloState:
    """Silo k's share of a (K, ...) state: every array field's row k (kept 2-D)."""
    changes = {f.name: getattr(state, f.name)[k:k + 1] for f in dataclasses.fields(state)
               if isinstance(getattr(state, f.name), np.ndarray)
               and getattr(state, f.name).ndim >= 1}
    return dataclasses.replace(state, **changes)


def stack_states(parts: list[SiloState]) -> SiloState:
    """The (K, ...) state of silos given one by one (scalar fields from the first)."""
    first = parts[0]
    changes = {f.name: np.concatenate([getattr(p, f.name) for p in parts])
               for f in dataclasses.fields(first)
               if isinstance(getattr(first, f.name), np.ndarray)
               and getattr(first, f.name).ndim >= 1}
    return dataclasses.replace(first, **changes)


def per_silo_step(algorithm: Algorithm, silos: SiloState, message, trainers: list,
                  round: int):
    """`algorithm.silo_step` run by each silo on its own one-silo trainer (as the network
    does), results stacked: (state of K silos, (K, P) update or None)."""
    states, updates = [], []
    for k, trainer in enumerate(trainers):
        s, u = algorithm.silo_step(slice_state(silos, k), message, trainer, round)
        states.append(s)
        updates.append(u)
    if any(u is None for u in updates):
        return stack_states(states), None
    return stack_states(states), np.concatenate(updates)


def per_silo_trainers(fed, model, cfg, plans, ledgers) -> list:
    """One one-silo `LocalTrainer` per silo of `fed`, each with its own stream
    (`silo_randomness`) and ledger — what each silo process of a networked run hosts."""
    from silofl.training.dpsgd import GradientRule
    from silofl.training.trainer import LocalTrainer, SiloArrays
    mode = "secure" if cfg.private and cfg.noise == "secure" else "seeded"
    return [LocalTrainer(
        model=model, data=SiloArrays.stack([s.X_train], [s.y_train]),
        rule=GradientRule(cfg.clip, np.array([p.noise_multiplier]) if cfg.private else None),
        batch_size=cfg.batch_size, steps_per_round=np.array([p.steps_per_pass]), lr=cfg.lr,
        l2=cfg.l2, rng=silo_randomness(mode, cfg.seed, s.name),
        ledgers=None if ledgers is None else [ledgers[k]])
        for k, (s, p) in enumerate(zip(fed.silos, plans))]
