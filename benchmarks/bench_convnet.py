"""ConvNet DP-SGD throughput: silofl's torch backend vs Opacus (figures printed, not
asserted).

The network is the appendix-B.1 ConvNet (Conv 3×3 32 → ReLU → MaxPool 2 → Conv 3×3 64 →
ReLU → MaxPool 2 → Linear, no padding) on 32×32×3 inputs with 10 classes (42,442
parameters). One DP-SGD step on a batch of B examples = per-example gradients, clip each to
norm C, sum, add N(0, σ²C²I), divide by B, SGD update — in both libraries. Both start from
the same weights and see the same batches (random CIFAR-shaped tensors: throughput does not
depend on pixel values); the batch is fixed at B (no Poisson sampling, so both do the same
work per step). Opacus (`pip install "silofl[bench]"`, opacus 1.6, default "hooks" grad
sampler) runs its GradSampleModule + DPOptimizer directly on the tensors, without its data
loader. Steps of the two are interleaved so that machine load hits both alike; the table
reports the median and best of the repeats. When Opacus is installed, one noise-free step
also checks that both compute the same clipped gradient.

Run: .venv/bin/python benchmarks/bench_convnet.py [--batch 100] [--steps 20] [--repeats 5]
     [--threads N] [--quick]          (target: ours ≥ 1.5× Opacus examples/s; MLP and
     several silos: bench_torch_opacus.py)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import warnings

import numpy as np
import torch
from torch import nn

from silofl.models import make_model
from silofl.privacy.randomness import Randomness
from silofl.training.dpsgd import GradientRule

SHAPE, CLASSES = (3, 32, 32), 10
CLIP, SIGMA, LR = 1.0, 1.0, 0.05


def batches(n: int, batch: int, seed: int = 0):
    """n CIFAR-shaped batches: X (batch, 3, 32, 32) float32, y (batch,) int64."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(batch,) + SHAPE).astype(np.float32),
             rng.integers(0, CLASSES, batch)) for _ in range(n)]


class Ours:
    """silofl's DP-SGD step for one silo: GradientRule (clip → sum → noise → scale)."""

    label = "silofl (stacked)"

    def __init__(self, batch: int):
        self.model = make_model("convnet", 0, CLASSES, task="multiclass", input_shape=SHAPE)
        self.W = self.model.init_params()[None]
        self.rule = GradientRule(CLIP, np.array([SIGMA]))
        self.rng = Randomness.seeded(0)
        self.silos, self.mask = np.array([0]), np.ones((1, batch), bool)
        self.expected = np.array([float(batch)])

    def step(self, X, y) -> None:
        g = self.rule(self.model, self.W, X[None], y[None].astype(float), self.mask,
                      self.expected, self.silos, self.rng)
        self.W = self.W - LR * g

    def clipped_mean(self, W, X, y) -> np.ndarray:
        g = self.model.clipped_grad_sum(W[None], X[None], y[None].astype(float),
                                        self.mask, CLIP)
        return g[0] / len(y)


class OpacusRunner:
    """The same network and step with Opacus' GradSampleModule + DPOptimizer."""

    label = "Opacus (hooks)"

    def __init__(self, batch: int, module: nn.Module, sigma: float = SIGMA):
        from opacus import PrivacyEngine
        data = torch.utils.data.TensorDataset(torch.zeros((batch,) + SHAPE),
                                              torch.zeros(batch, dtype=torch.long))
        loader = torch.utils.data.DataLoader(data, batch_size=batch)
        opt = torch.optim.SGD(module.parameters(), lr=LR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "secure RNG turned off"
            self.net, self.opt, _ = PrivacyEngine().make_private(
                module=module, optimizer=opt, data_loader=loader, noise_multiplier=sigma,
                max_grad_norm=CLIP, poisson_sampling=False)
        self.loss = nn.CrossEntropyLoss()

    def step(self, X, y) -> None:
        self.opt.zero_grad()
        self.loss(self.net(torch.from_numpy(X)), torch.from_numpy(y)).backward()
        self.opt.step()

    def clipped_mean(self, X, y) -> np.ndarray:
        """σ = 0 DP gradient: Σ clip(g_i) / B, flattened in parameter order."""
        self.opt.zero_grad()
        self.loss(self.net(torch.from_numpy(X)), torch.from_numpy(y)).backward()
        self.opt.pre_step()  # clip, accumulate, (no) noise, scale — without the update
        return torch.cat([p.grad.flatten() for p in self.opt.params]).double().numpy()


def torch_copy(ours: Ours) -> nn.Module:
    """A plain nn.Sequential ConvNet holding our initial weights."""
    net = make_model("convnet", 0, CLASSES, task="multiclass", input_shape=SHAPE).module
    flat, off = torch.from_numpy(ours.W[0]).float(), 0
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
    return net.train()  # Opacus refuses modules in eval mode


def check_same_gradient(batch: int, data) -> float:
    """Max |ours − Opacus| of the noise-free clipped mean gradient on one batch."""
    ours = Ours(batch)
    op = OpacusRunner(batch, torch_copy(ours), sigma=0.0)
    X, y = data[0]
    a, b = ours.clipped_mean(ours.W[0], X, y), op.clipped_mean(X, y)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def time_steps(runner, data) -> float:
    t = time.perf_counter()
    for X, y in data:
        runner.step(X, y)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: silofl's default)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 steps, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats = 2, 1
    ours = Ours(args.batch)  # applies silofl's thread policy first
    if args.threads:
        torch.set_num_threads(args.threads)
    data = batches(args.steps, args.batch)
    runners = [ours]
    have_opacus = importlib.util.find_spec("opacus") is not None
    if have_opacus:
        runners.append(OpacusRunner(args.batch, torch_copy(ours)))
        print(f"same clipped gradient (σ = 0), max relative difference: "
              f"{check_same_gradient(args.batch, data):.1e}")
    else:
        print('Opacus is not installed, so only silofl is timed; install it with '
              'pip install "silofl[bench]" (opacus==1.6.0) to compare.')
    for r in runners:  # warm-up: first-call allocation and kernel selection
        time_steps(r, data[:2])
    times: dict[str, list[float]] = {r.label: [] for r in runners}
    for _ in range(args.repeats):
        for r in runners:
            times[r.label].append(time_steps(r, data))
    n = args.steps * args.batch
    print(f"\nConvNet DP-SGD, 32×32×3, batch {args.batch}, {args.steps} steps × "
          f"{args.repeats} repeats, torch {torch.__version__}, {torch.get_num_threads()} "
          f"thread(s)")
    print(f"{'':22s} {'examples/s (median)':>20s} {'examples/s (best)':>18s}")
    rate = {}
    for label, ts in times.items():
        rate[label] = (n / statistics.median(ts), n / min(ts))
        print(f"{label:22s} {rate[label][0]:20.0f} {rate[label][1]:18.0f}")
    if have_opacus:
        a, b = rate[Ours.label], rate[OpacusRunner.label]
        print(f"\nratio silofl / Opacus: {a[0] / b[0]:.2f}× (median), {a[1] / b[1]:.2f}× (best)"
              f"   target ≥ 1.5×")


if __name__ == "__main__":
    main()
