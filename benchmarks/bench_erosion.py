"""Weight Erosion with every silo as the user: wall time against one MR-MTL run (issue 10;
figures printed, not asserted).

On the heart data (4 hospitals → 4 users) and on the 23-silo synthetic task (`vehicle_like`
→ 23 users), DP on, 200 rounds: `silofl erosion` for every user (Python API:
`experiments.erosion.erosion_for_users`; one job = the K users' Weight Erosion runs + the
shared Global/FedAvg and Local runs, σ calibrated for all K + 2 composed) against one
`silofl run` job with MR-MTL alone, the same data, rounds, batch size, learning rate and
evaluation schedule. Both are timed end to end (planning/σ calibration, budget reservation
in a scratch in-memory store, training, evaluation every round; nothing written to disk),
measured side by side in one process, MR-MTL first then erosion, best of `--repeats`. The
time the erosion job spends in its per-user contribution reports (post-processing after
training) is printed separately.

Run: .venv/bin/python benchmarks/bench_erosion.py [--rounds 200] [--repeats 1]
     [--tasks heart,synthetic23] [--noise secure|seeded]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time

from rich.console import Console
from rich.table import Table

from silofl.config import config_from_dict
from silofl.experiments import erosion
from silofl.experiments.erosion import erosion_for_users
from silofl.experiments.run import run
from silofl.privacy.budget import BudgetStore

#: per task: [data], [model] and [training] settings (both jobs share them)
TASKS = {
    "heart": ({"source": "heart"}, {"name": "logistic"},
              {"batch_size": 16, "lr": 0.03}, {"epsilon": 1.0, "delta": 1e-4}),
    "synthetic23": ({"source": "synthetic", "generator": "vehicle"}, {"name": "logistic"},
                    {"batch_size": 64, "lr": 0.03}, {"epsilon": 1.0, "delta": 1e-5}),
}


def config(task: str, method: str, rounds: int, noise: str):
    data, model, training, privacy = TASKS[task]
    return config_from_dict({
        "data": data, "model": model,
        "training": dict(training, methods=[method], rounds=rounds, eval_every=1),
        "privacy": dict(privacy, noise=noise), "output": {"dir": ""}})


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


@contextlib.contextmanager
def contribution_clock(acc: list[float]):
    """Adds the seconds the erosion job spends in its per-user contribution reports
    (`erosion._contributions`, post-processing after training) to `acc`, while active."""
    orig = getattr(erosion, "_contributions", None)
    if orig is None:  # no contribution reports in this version
        yield
        return

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            acc.append(time.perf_counter() - t0)
    erosion._contributions = wrapper
    try:
        yield
    finally:
        erosion._contributions = orig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tasks", default="heart,synthetic23")
    ap.add_argument("--noise", choices=("secure", "seeded"), default="secure")
    a = ap.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    console = Console(width=max(130, Console().width))
    t = Table(title=f"Weight Erosion, every silo as the user, vs one MR-MTL run: DP on "
                    f"({a.noise} noise), {a.rounds} rounds, best of {a.repeats}")
    for c in ("data", "users", "MR-MTL job (s)", "erosion job (s)", "ratio",
              "of which contribution reports (s)", "rest / MR-MTL", "σ MR-MTL",
              "σ erosion"):
        t.add_column(c, justify="right" if c != "data" else "left")
    for task in a.tasks.split(","):
        mr_best = we_best = float("inf")
        contrib = 0.0
        for _ in range(a.repeats):
            with console.status(f"{task}: MR-MTL, {a.rounds} rounds"):
                s, rep = timed(lambda task=task: run(config(task, "mrmtl", a.rounds, a.noise),
                                           store=BudgetStore(None)))
            mr_best = min(mr_best, s)
            sig_mr = [p.noise_multiplier for p in rep.results[0].plans]
            acc: list[float] = []
            with console.status(f"{task}: Weight Erosion, every silo as the user"), \
                    contribution_clock(acc):
                s, er = timed(lambda task=task: erosion_for_users(
                    config(task, "fedavg", a.rounds, a.noise), "all",
                    store=BudgetStore(None)))
            if s < we_best:
                we_best, contrib = s, sum(acc)
        users = len(er.users)
        sig_we = list(er.noise_multiplier.values())
        t.add_row(task, str(users), f"{mr_best:.2f}", f"{we_best:.2f}",
                  f"{we_best / mr_best:.1f}×", f"{contrib:.2f}",
                  f"{(we_best - contrib) / mr_best:.1f}×",
                  f"{min(sig_mr):.2f}..{max(sig_mr):.2f}",
                  f"{min(sig_we):.2f}..{max(sig_we):.2f}")
        console.print(f"{task}: MR-MTL {mr_best:.2f} s, erosion for {users} users "
                      f"{we_best:.2f} s, of which contribution reports {contrib:.2f} s "
                      f"({er.calibration})")
    console.print(t)
    console.print("The erosion job also runs Global (FedAvg) and Local once (shared by all "
                  "users) and, after training, one contribution report per user (post-"
                  "processing, no privacy cost); 'rest' = the job without those reports. "
                  "Weight Erosion sends one DP-SGD gradient per silo and round, MR-MTL a local "
                  "epoch of DP-SGD steps.")


if __name__ == "__main__":
    main()
