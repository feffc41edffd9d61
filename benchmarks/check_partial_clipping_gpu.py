"""Device check (needs CUDA): partial (coords) clipped sums of mlp and mlp_norm on the GPU
equal the CPU ones (tolerance 1e-4, float32), are 0 off the coordinates and ≤ C per example.

    PYTHONPATH=src python benchmarks/check_partial_clipping_gpu.py
"""
import numpy as np
import torch

from silofl.models.torch_nets import make_torch_model

rng = np.random.default_rng(0)
K, B, d = 4, 64, 12
X = rng.normal(size=(K, B, d)).astype(np.float32) * 3
y = rng.integers(0, 2, size=(K, B)).astype(float)
mask = np.ones((K, B))
mask[:, -5:] = 0  # padded rows
for name in ("mlp", "mlp_norm"):
    cpu = make_torch_model(name, d, 2, task="binary", hidden=[32, 16], device="cpu")
    gpu = make_torch_model(name, d, 2, task="binary", hidden=[32, 16], device="cuda")
    W = np.stack([cpu.init_params() + 0.1 * rng.normal(size=cpu.num_params) for _ in range(K)])
    groups = cpu.param_groups()
    assert set(groups) == ({"head", "norm"} if name == "mlp_norm" else {"head"}), groups
    for g, m in groups.items():
        for coords in (None, m, ~m):
            a = cpu.clipped_grad_sum(W, X, y, mask, 0.7, coords=coords)
            b = gpu.clipped_grad_sum(W, X, y, mask, 0.7, coords=coords)
            err = np.abs(a - b).max()
            assert err < 1e-4, (name, g, err)
            if coords is not None:
                assert np.all(b[:, ~coords] == 0)
            one = gpu.clipped_grad_sum(W, X[:, :1], y[:, :1], mask[:, :1], 0.7, coords=coords)
            assert np.all(np.linalg.norm(one, axis=1) <= 0.7)
            print(name, g, None if coords is None else int(coords.sum()), f"max|cpu-gpu| {err:.2e}")
print("OK", torch.cuda.get_device_name(0))
