"""PrivateKT benchmark (issue 11): figures printed, not asserted.

1. The CPU-sized setting (examples/privatekt_mnist_cpu.toml) for PrivateKT, FedAvg with local
   DP on clipped updates (Gaussian) and FedAvg with DP-SGD, all at ε = 5 per round: pooled
   test accuracy at rounds 10, 50, 100, cumulative ε per client, wall time per round
   (scratch budget stores, secure noise).
2. The projected time of the full seed setting (examples/privatekt_mnist.toml: 80 clients ×
   600 images, reference CNN, 12,000 public images, 40 clients per round, 5 local epochs,
   500 rounds) on this machine, from timing its parts: one client's local training, the
   server's predictions on D_p and its fine-tuning, and the evaluation.

    .venv/bin/python benchmarks/bench_privatekt.py [--rounds 100] [--skip-full]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from silofl.config import load_config
from silofl.experiments.ldp_compare import compare

ROOT = Path(__file__).resolve().parents[1]


def cpu_setting(rounds: int, out: Path | None) -> None:
    cfg = load_config(ROOT / "examples" / "privatekt_mnist_cpu.toml")
    cfg.training.rounds = rounds
    t0 = time.perf_counter()
    res = compare(cfg, out)
    print(f"CPU-sized setting, {rounds} rounds ({time.perf_counter() - t0:.0f} s in all)")
    print(f"{'method':<11} {'acc@10':>7} {'acc@50':>7} {'acc@100':>8} {'s/round':>8} "
          f"{'ε/client max':>13} {'mean':>6} {'rounds/client':>14}")
    for m, r in res.items():
        acc = dict(zip(r["rounds"], r["accuracy"]))
        cells = [f"{acc[t]:.3f}" if t in acc else "-" for t in (10, 50, 100)]
        rpc = r["rounds_per_client"]
        print(f"{m:<11} {cells[0]:>7} {cells[1]:>7} {cells[2]:>8} "
              f"{r['seconds'] / rounds:>8.2f} {r['max_epsilon']:>13.1f} "
              f"{r['mean_epsilon']:>6.1f} {min(rpc):>6}–{max(rpc)}")


def full_projection(rounds: int = 500) -> None:
    """Time the parts of one round of the full setting and project `rounds` rounds."""
    from silofl.algorithms.privatekt import class_probs, soft_sgd
    from silofl.data.mnist import load_dirichlet_mnist
    from silofl.models import make_model
    from silofl.privacy.accounting import steps_for_epochs
    from silofl.privacy.randomness import Randomness
    from silofl.training.dpsgd import GradientRule
    from silofl.training.local_dp import local_sgd
    from silofl.training.silo_data import SiloArrays
    from silofl.training.trainer import LocalTrainer

    cfg = load_config(ROOT / "examples" / "privatekt_mnist.toml")
    tc = cfg.training
    fed = load_dirichlet_mnist(num_silos=2, train_per_silo=cfg.data.train_per_silo,
                               test_per_silo=cfg.data.test_per_silo, alpha=cfg.data.alpha,
                               public_fraction=cfg.data.public_fraction)
    model = make_model("kt_cnn", fed.dim, 10, task="multiclass", input_shape=(1, 28, 28),
                       seed=0)
    steps = steps_for_epochs(cfg.data.train_per_silo, tc.batch_size, tc.local_epochs)
    trainer = LocalTrainer(model, SiloArrays.stack([s.X_train for s in fed.silos],
                                                   [s.y_train for s in fed.silos]),
                           GradientRule(tc.clip, None), tc.batch_size,
                           np.array([steps] * fed.num_silos), tc.lr, tc.l2,
                           Randomness.seeded(0))
    w0 = model.init_params()
    t = time.perf_counter()
    local_sgd(trainer, w0[None], np.array([0]))
    client = time.perf_counter() - t
    pub = fed.meta["public_X"]
    t = time.perf_counter()
    class_probs(model, w0, pub)
    predict_pub = time.perf_counter() - t
    m = int(round(tc.kt_self_train * len(pub)))
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    soft_sgd(model, w0, pub[:tc.kt_buffer], np.full((tc.kt_buffer, 10), 0.1),
             tc.kt_server_epochs, tc.batch_size, tc.lr, rng)
    soft_sgd(model, w0, pub[:m], np.eye(10)[rng.integers(0, 10, m)], 1, tc.batch_size,
             tc.lr, rng)
    server_train = time.perf_counter() - t
    per_round_clients = int(round(tc.client_fraction * cfg.data.num_silos))
    test_images = cfg.data.num_silos * cfg.data.test_per_silo
    evals = rounds // tc.eval_every
    per_round = per_round_clients * client + 2 * predict_pub + server_train
    total = rounds * per_round + evals * predict_pub * test_images / len(pub)
    print(f"full setting (kt_cnn, {model.num_params:,} parameters) on this machine's CPU: "
          f"one client's local training {client:.1f} s, predicting D_p ({len(pub)}) "
          f"{predict_pub:.1f} s, server fine-tuning + self-training {server_train:.1f} s")
    print(f"  → {per_round:.0f} s per round ({per_round_clients} clients trained one after "
          f"another), {rounds} rounds ≈ {total / 3600:.1f} h")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--out", type=Path, default=None, help="write comparison.json/.png here")
    ap.add_argument("--skip-full", action="store_true")
    ap.add_argument("--only-full", action="store_true")
    a = ap.parse_args()
    if not a.only_full:
        cpu_setting(a.rounds, a.out)
    if not a.skip_full:
        full_projection()


if __name__ == "__main__":
    main()
