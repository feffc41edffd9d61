"""DP-SGD throughput of silofl's torch backend against Opacus, MLP and ConvNet, side by side
(figures printed, not asserted).

Both libraries take the same DP-SGD step on the same network, weights and batches:
per-example gradients, clip each to norm C, sum, add N(0, σ²C²I), divide by B, SGD update.
silofl runs its training path (`GradientRule`: the stacked engine of
`silofl.models.torch_stacked`, clipping in torch, noise from the secure stream by default)
for K silos at once; Opacus (1.6, GradSampleModule + DPOptimizer, "hooks", its default
non-secure noise) runs one model per silo, one after the other, as a user of Opacus would.
Batches are fixed at B (no Poisson sampling, so both do the same work per step).

Timing on a shared machine: the two are measured in pairs — a block of steps of one, then
of the other, the order alternating — and each pair gives a ratio (silofl examples/s over
Opacus examples/s); the table reports the median ratio with its min–max spread over the
pairs, so load that comes and goes hits both alike. A σ = 0 step first checks that both
compute the same clipped gradient. The secure noise's share of silofl's step is timed too.

Run: .venv/bin/python benchmarks/bench_torch_opacus.py [--models mlp convnet] [--silos 1 4]
     [--pairs 7] [--steps 10] [--threads 1 2] [--noise secure|seeded] [--device cuda]
     [--quick]
(target: silofl ≥ 1.5× Opacus examples/s)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from silofl.models import make_model
from silofl.privacy.randomness import Randomness
from silofl.training.dpsgd import GradientRule

CLIP, SIGMA, LR, CLASSES = 1.0, 1.0, 0.05, 10


@dataclass(frozen=True)
class Case:
    """One benchmarked network: `make_model` arguments, per-example shape, batch size."""

    name: str
    shape: tuple[int, ...]
    batch: int
    hidden: tuple[int, ...] = ()

    def model(self, device: str = "cpu"):
        return make_model(self.name, self.shape[0], CLASSES, task="multiclass",
                          input_shape=self.shape, hidden=list(self.hidden) or None,
                          device=device)


CASES = {"mlp": Case("mlp", (100,), 256, (64,)),
         "convnet": Case("convnet", (3, 32, 32), 100)}


def batches(case: Case, silos: int, n: int, seed: int = 0) -> list:
    """n batches X (K, B, *shape) float32, y (K, B) int64 of random data (throughput does
    not depend on the values)."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(silos, case.batch) + case.shape).astype(np.float32),
             rng.integers(0, CLASSES, (silos, case.batch))) for _ in range(n)]


class Ours:
    """silofl's DP-SGD step for K silos at once."""

    label = "silofl"

    def __init__(self, case: Case, silos: int, noise: str, device: str = "cpu"):
        self.model = case.model(device)
        rng = np.random.default_rng(1)  # silos hold different models
        self.W = self.model.init_params() + rng.normal(0, 1e-3, (silos, self.model.num_params))
        self.rule = GradientRule(CLIP, np.full(silos, SIGMA))
        self.rng = Randomness.for_mode(noise, 0)
        self.silos, self.mask = np.arange(silos), np.ones((silos, case.batch), bool)
        self.expected = np.full(silos, float(case.batch))

    def step(self, X, y) -> None:
        g = self.rule(self.model, self.W, X, y.astype(float), self.mask, self.expected,
                      self.silos, self.rng)
        self.W -= LR * g

    def clipped_mean(self, X, y) -> np.ndarray:
        """(K, P) σ = 0 mean clipped gradient."""
        return self.model.clipped_grad_sum(self.W, X, y.astype(float), self.mask, CLIP) \
            / X.shape[1]


class OpacusSilos:
    """The same step with Opacus: one GradSampleModule + DPOptimizer per silo."""

    label = "Opacus"

    def __init__(self, case: Case, ours: Ours, sigma: float = SIGMA, device: str = "cpu"):
        from opacus import PrivacyEngine
        self.device = torch.device(device)
        data = torch.utils.data.TensorDataset(torch.zeros((case.batch,) + case.shape),
                                              torch.zeros(case.batch, dtype=torch.long))
        loader = torch.utils.data.DataLoader(data, batch_size=case.batch)
        self.nets, self.opts = [], []
        for k in range(len(ours.W)):
            module = torch_copy(case, ours.W[k]).to(self.device)
            opt = torch.optim.SGD(module.parameters(), lr=LR)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "secure RNG turned off", …
                net, opt, _ = PrivacyEngine().make_private(
                    module=module, optimizer=opt, data_loader=loader, noise_multiplier=sigma,
                    max_grad_norm=CLIP, poisson_sampling=False)
            self.nets.append(net)
            self.opts.append(opt)
        self.loss = nn.CrossEntropyLoss()

    def step(self, X, y) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus' backward-hook notice, every step
            for k, (net, opt) in enumerate(zip(self.nets, self.opts)):
                opt.zero_grad()
                self.loss(net(self._t(X[k])), self._t(y[k])).backward()
                opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def clipped_mean(self, X, y) -> np.ndarray:
        """(K, P) σ = 0 mean clipped gradient (clip, sum, scale — no update)."""
        out = []
        for k, (net, opt) in enumerate(zip(self.nets, self.opts)):
            opt.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.loss(net(self._t(X[k])), self._t(y[k])).backward()
            opt.pre_step()
            out.append(torch.cat([p.grad.flatten() for p in opt.params]).double().cpu()
                       .numpy())
        return np.stack(out)


def torch_copy(case: Case, w: np.ndarray) -> nn.Module:
    """A plain copy of the network holding the parameter vector w (P,)."""
    net = case.model().module
    flat, off = torch.from_numpy(w).float(), 0
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
    return net.train()  # Opacus refuses modules in eval mode


def same_gradient(case: Case, silos: int, data, device: str = "cpu") -> float:
    """Max relative |silofl − Opacus| of the σ = 0 clipped mean gradient on one batch (a
    max-pool window whose two largest inputs differ by float rounding can send one
    example's gradient elsewhere in one library: then ~1e-3 for the ConvNet)."""
    ours = Ours(case, silos, "seeded", device)
    a = ours.clipped_mean(*data[0])
    b = OpacusSilos(case, ours, sigma=0.0, device=device).clipped_mean(*data[0])
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def timed(runner, data) -> float:
    t = time.perf_counter()
    for X, y in data:
        runner.step(X, y)
    return time.perf_counter() - t


def noise_seconds(noise: str, shape: tuple[int, int], reps: int) -> float:
    """Median seconds to draw one step's (K, P) standard normals from the `noise` stream."""
    rng = Randomness.for_mode(noise, 0)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        rng.normal(shape)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def compare(case: Case, silos: int, args) -> dict:
    """Paired, order-alternating timings of one case → the row of the table."""
    data = batches(case, silos, args.steps)
    device = getattr(args, "device", "cpu")
    ours = Ours(case, silos, args.noise, device)
    row: dict = {"case": f"{case.name} K={silos}", "params": ours.model.num_params}
    have = importlib.util.find_spec("opacus") is not None
    runners = [ours] + ([OpacusSilos(case, ours, device=device)] if have else [])
    if have:
        row["same_grad"] = same_gradient(case, silos, data, device)
    for r in runners:  # warm-up: allocation, kernel selection
        timed(r, data[:2])
    times: dict[str, list[float]] = {r.label: [] for r in runners}
    for i in range(args.pairs):
        for r in runners if i % 2 == 0 else runners[::-1]:
            times[r.label].append(timed(r, data))
    n = args.steps * silos * case.batch
    row["ours"] = n / statistics.median(times["silofl"])
    row["noise_share"] = (noise_seconds(args.noise, (silos, ours.model.num_params), 5)
                          * args.steps / statistics.median(times["silofl"]))
    if have:
        row["opacus"] = n / statistics.median(times["Opacus"])
        ratios = [b / a for a, b in zip(times["silofl"], times["Opacus"])]
        row["ratio"] = (statistics.median(ratios), min(ratios), max(ratios))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "convnet"], choices=list(CASES))
    ap.add_argument("--silos", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--pairs", type=int, default=7, help="timed pairs (≥ 5 for a spread)")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--threads", nargs="+", type=int, default=[0],
                    help="torch intra-op threads, one table row set per value (0: silofl's "
                         "default, one per CPU this process may use)")
    ap.add_argument("--noise", default="secure", choices=["secure", "seeded"])
    ap.add_argument("--device", default="cpu", help="cpu | cuda (both libraries)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 steps, 2 pairs, small")
    ap.add_argument("--json", metavar="PATH", help="also write the table's rows to PATH (JSON)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.pairs, args.silos = 2, 2, [2]
        for k, c in CASES.items():
            CASES[k] = Case(c.name, c.shape, 16, c.hidden)
    make_model("mlp", 2, CLASSES, task="multiclass")  # applies silofl's thread policy
    default_threads = torch.get_num_threads()
    if importlib.util.find_spec("opacus") is None:
        print('Opacus is not installed, so only silofl is timed; install it with '
              'pip install "silofl[bench]" (opacus==1.6.0) to compare.')
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads or default_threads)
        rows += [dict(compare(CASES[m], k, args), threads=torch.get_num_threads())
                 for m in args.models for k in args.silos]
    where = (torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU")
    print(f"\nDP-SGD examples/s, torch {torch.__version__}, {args.device}: {where}, "
          f"{args.pairs} pairs × {args.steps} steps, silofl noise {args.noise}")
    print(f"{'case':14s} {'threads':>7s} {'params':>7s} {'batch':>6s} {'silofl':>9s} "
          f"{'Opacus':>9s} {'ratio (median, min–max)':>25s} {'noise share':>12s} "
          f"{'same grad':>10s}")
    for r in rows:
        case = CASES[r["case"].split()[0]]
        ratio = ("{:.2f}× ({:.2f}–{:.2f})".format(*r["ratio"]) if "ratio" in r else "–")
        print(f"{r['case']:14s} {r['threads']:7d} {r['params']:7d} {case.batch:6d} "
              f"{r['ours']:9.0f} {r.get('opacus', float('nan')):9.0f} {ratio:>25s} "
              f"{100 * r['noise_share']:11.1f}% {r.get('same_grad', float('nan')):10.1e}")
    print("\nratio = silofl examples/s ÷ Opacus examples/s per pair; target ≥ 1.5×")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": where, "pairs": args.pairs, "steps": args.steps,
                       "noise": args.noise, "rows": [
                           dict(r, batch=CASES[r["case"].split()[0]].batch) for r in rows]},
                      fh, indent=1)
    if args.quick:  # 2 steps of batch 16 time start-up, not throughput
        print("--quick is a smoke run (batch 16, 2 steps, 2 pairs): its ratios are not the "
              "documented figures; run without --quick for those")


if __name__ == "__main__":
    main()
