"""`TorchModel`: any torch.nn.Module architecture behind the engine's `Model` interface.

The engine keeps parameters as flat float64 vectors (K, P); here they become per-silo
parameter dicts (views into one float32 tensor). One DP-SGD step for K silos:

    per-example grads (K, B, ·) → norms (K, B) → clip factors min(1, c/‖g‖)·mask → Σ_b (K, P)

with c = clip_bound(C) just below C, norms accumulated in float64.

Two engines compute it. Where the architecture is a Sequential of the layers it covers
(Linear, Conv2d, LayerNorm, pooling, elementwise activations, Flatten: every net of
`torch_nets`), the stacked engine (`silofl.models.torch_stacked`) runs all silos of a chunk
in one pass with their parameters stacked on a silo axis: dense layers' per-example norms
without per-example gradients, one oneDNN convolution grouped by silo, per-example conv
gradients as one grouped weight gradient (`TorchModel.stacked`). Any other module uses
`torch.func`: `vmap(grad(loss of one example))` over examples, and a second `vmap` over
silos for dense nets (`silo_vmap`; conv nets loop over silos there).

Padded rows (mask False) get factor 0, so they contribute nothing. Compute is float32
(DP noise swamps float32 rounding); results return as float64 numpy arrays.

Device: parameters, inputs and gradients live on `device` ("cpu" by default, "cuda" for a
GPU, "auto" = cuda when available; `resolve_device`); every result comes back to the CPU as
numpy, so the engine — DP noise, clipping bookkeeping, accounting — never sees a tensor.
Initialization always runs on the CPU, so a seed gives the same initial model everywhere.

Losses (per example, like the GLMs): binary — cross-entropy on one logit, labels {0, 1};
multiclass — softmax cross-entropy, labels 0..C−1; regression — 0.5·squared error.
`predict` returns P(class 1) (n,), class probabilities (n, C), or the value (n,).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from silofl.errors import ConfigError, DataError
from silofl.models.base import Model
from silofl.models.torch_stacked import StackedNet
from silofl.privacy.clipping import CLIP_MARGIN, clip_bound

TASKS = ("binary", "multiclass", "regression")
#: [training] device values (README, "PrivateKT")
DEVICES = ("cpu", "cuda", "auto")
#: cap on the per-example gradient tensor of one vectorized chunk of silos (bytes)
CHUNK_BYTES = 256 * 2**20
#: examples per forward pass in predict / loss / per_example_grads
EVAL_CHUNK = 512
#: cap on one chunk of silos in the stacked engine (activations and per-example conv
#: gradients, bytes): small enough to stay near the CPU caches, where memory traffic, not
#: arithmetic, bounds a conv net's step (K = 4 silos of a ConvNet batch of 100 at once run
#: slower than four chunks of one)
STACK_BYTES = 48 * 2**20
#: per-example bytes × batch above which a CPU step with n > 1 intra-op threads splits its
#: examples in n parts, each on its own Python thread with one intra-op thread: no OpenMP
#: barrier per op, which on a busy 2-core machine made two threads 2–4× slower than one
SPLIT_BYTES = 8 * 2**20
_POOLS: dict[int, ThreadPoolExecutor] = {}
if hasattr(os, "register_at_fork"):  # a forked child has none of its parent's threads
    os.register_at_fork(after_in_child=_POOLS.clear)


def _pool(n: int) -> ThreadPoolExecutor:
    """n worker threads, each with one intra-op thread (torch's setting is per thread)."""
    if n not in _POOLS:
        _POOLS[n] = ThreadPoolExecutor(n, thread_name_prefix="silofl-torch",
                                       initializer=torch.set_num_threads, initargs=(1,))
    return _POOLS[n]


def _cap_threads() -> None:
    """Use at most one intra-op thread per CPU this process may run on (torch defaults to
    the machine's cores, which oversubscribes CPU-limited containers); an explicit
    OMP_NUM_THREADS wins."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    if torch.get_num_threads() > cpus:
        torch.set_num_threads(max(1, cpus))


def resolve_device(device: str | torch.device = "cpu") -> torch.device:
    """'cpu' | 'cuda' | 'cuda:N' | 'auto' (cuda when available, else cpu) → torch.device.
    ConfigError for an unknown name or a GPU that this machine does not have."""
    if isinstance(device, torch.device):
        device = str(device)
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:") and name[5:].isdigit():
        if not torch.cuda.is_available():
            raise ConfigError(f"[training] device = {device!r} asks for a GPU, but PyTorch sees "
                              f"no CUDA device here (torch {torch.__version__}"
                              f"{', a CPU-only build' if torch.version.cuda is None else ''}); "
                              "use device = \"auto\" (GPU when present, else CPU) or \"cpu\", "
                              "or run on a machine with a GPU and a CUDA build of PyTorch")
        idx = int(name[5:]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise ConfigError(f"[training] device = {device!r}: this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s); use 'cuda' or "
                              f"'cuda:0'..'cuda:{torch.cuda.device_count() - 1}'")
        return torch.device(name)
    raise ConfigError(f"unknown [training] device {device!r}; choose one of "
                      f"{', '.join(DEVICES)} (or 'cuda:N' for GPU N)")


def _np(t: torch.Tensor) -> np.ndarray:
    """A tensor on any device → float64 numpy on the CPU (what the engine works with)."""
    return t.double().cpu().numpy()


def task_loss(task: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """loss(out (..., O), y (...)) → (...) per-example losses for `task`."""
    if task == "binary":
        return lambda out, y: nn.functional.softplus(out[..., 0]) - y * out[..., 0]
    if task == "multiclass":
        return lambda out, y: torch.logsumexp(out, -1) - torch.gather(
            out, -1, y.long().unsqueeze(-1)).squeeze(-1)
    if task == "regression":
        return lambda out, y: 0.5 * (out[..., 0] - y) ** 2
    raise ConfigError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")


def mismatch_message(name: str, got: tuple, expected: tuple | None = None) -> str:
    """Why model `name` cannot take examples of per-example shape `got`."""
    if expected is not None and len(expected) == len(got):
        hint = ""
        if len(got) == 3 and got[-1] in (1, 3) and got[0] not in (1, 3):
            hint = "; the data looks channels-last: transpose it to (n, C, H, W)"
        return (f"model {name!r} was built for examples of shape {expected} but the data has "
                f"examples of shape {got}{hint}")
    if name == "convnet" or expected is not None and len(expected) == 3:
        return (f"model {name!r} needs image data with examples of shape (channels, height, "
                f"width), but the data has examples of shape {got}; use model 'mlp' (or a "
                "GLM) for tabular data, or reshape images to (n, C, H, W)")
    return (f"model {name!r} needs tabular data with examples of shape (features,), but the "
            f"data has examples of shape {got}; use model 'convnet' for images")


class TorchModel(Model):
    """A `Model` backed by `module` (no buffers: BatchNorm-style state would mix examples
    and break per-example DP).

    module: maps (n, *input_shape) → (n, O), O = C for multiclass else 1.
    task: 'binary' | 'multiclass' | 'regression'. seed: init_params seed.
    dtype: compute precision (float32; float64 for exact comparisons in tests).
    device: where parameters and data live during compute ('cpu', 'cuda', 'cuda:N',
    'auto'; `resolve_device`); results always return as CPU numpy arrays.
    silo_vmap: (the torch.func engine only) vectorize over the silo axis with a second vmap
    (per-silo parameters). Dense layers become batched matmuls, which pays; a convolution
    with per-silo weights becomes a grouped convolution, which on CPU is slower than one
    ordinary batched convolution per silo (measured ~1.4× for the ConvNet at K = 4), so the
    default (None) is True unless the architecture has conv layers.
    The attribute `stacked` (True where `torch_stacked` covers the architecture) selects the
    stacked engine; set it False to use torch.func.
    """

    def __init__(self, module: nn.Module, *, task: str, input_shape: Sequence[int],
                 num_classes: int = 2, name: str = "torch", seed: int = 0,
                 dtype: torch.dtype = torch.float32, silo_vmap: bool | None = None,
                 device: str | torch.device = "cpu"):
        _cap_threads()
        self.device = resolve_device(device)
        if task not in TASKS:
            raise ConfigError(f"unknown task {task!r} for model {name!r}; use one of "
                              f"{', '.join(TASKS)}")
        if list(module.buffers()):
            raise ConfigError(f"model {name!r} has buffers (e.g. BatchNorm statistics); "
                              "per-example DP needs a buffer-free architecture (use GroupNorm)")
        self.name, self.task, self.tasks = name, task, (task,)
        self.num_classes, self.seed, self.dtype = int(num_classes), int(seed), dtype
        self.input_shape = tuple(int(s) for s in input_shape)
        self.module = module.to(dtype).to(self.device).eval()
        named = list(self.module.named_parameters())
        self._names = [n for n, _ in named]
        self._shapes = [tuple(p.shape) for _, p in named]
        self._sizes = [p.numel() for _, p in named]
        self.num_params = int(sum(self._sizes))
        self._loss = task_loss(task)
        self._check_output()
        ex_grads = vmap(grad(self._example_loss), in_dims=(None, 0, 0))  # over examples
        self._ex_grads = ex_grads
        self._silo_ex_grads = vmap(ex_grads, in_dims=(0, 0, 0))          # over silos
        self._grad_sum = grad(self._masked_sum_loss)
        self._silo_grad_sum = vmap(self._grad_sum, in_dims=(0, 0, 0, 0))
        if silo_vmap is None:  # see the class docstring
            silo_vmap = not any(isinstance(m, nn.modules.conv._ConvNd) for m in module.modules())
        self.silo_vmap = bool(silo_vmap)
        self._stacked = StackedNet.build(self.module, self.input_shape)
        #: clip with the stacked engine (`torch_stacked`) where it covers the architecture;
        #: False: per-example gradients from torch.func (`silo_vmap` applies)
        self.stacked = self._stacked is not None
        self._example_bytes = self._stacked_example_bytes()

    # -- pure functions of (param dict, data) -------------------------------------------
    def _example_loss(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                      y: torch.Tensor) -> torch.Tensor:
        """Scalar loss of one example x (*input_shape), label y ()."""
        return self._loss(functional_call(self.module, params, (x.unsqueeze(0),))[0], y)

    def _masked_sum_loss(self, params: dict[str, torch.Tensor], X: torch.Tensor,
                         y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (self._loss(functional_call(self.module, params, (X,)), y) * m).sum()

    # -- conversions -----------------------------------------------------------------
    def _params(self, W: np.ndarray) -> dict[str, torch.Tensor]:
        """Flat (..., P) → {name: (..., *shape)} views of one `dtype` tensor."""
        W = np.asarray(W)
        if W.shape[-1] != self.num_params:
            raise DataError(f"model {self.name!r} has {self.num_params} parameters but got a "
                            f"parameter array of shape {W.shape}")
        t = torch.from_numpy(np.ascontiguousarray(W)).to(self.device, self.dtype)
        lead, out, off = t.shape[:-1], {}, 0
        for n, s, k in zip(self._names, self._shapes, self._sizes):
            out[n] = t[..., off:off + k].reshape(lead + s)
            off += k
        return out

    def _flat(self, grads: dict[str, torch.Tensor], lead: int) -> torch.Tensor:
        """{name: (*L, *shape)} → (*L, P) in parameter order; L has `lead` axes."""
        return torch.cat([grads[n].flatten(lead) for n in self._names], -1)

    def _inputs(self, X: np.ndarray, lead: int) -> torch.Tensor:
        X = np.asarray(X)
        if X.shape[lead:] != self.input_shape:
            raise DataError(mismatch_message(self.name, tuple(X.shape[lead:]), self.input_shape))
        return torch.from_numpy(np.ascontiguousarray(X)).to(self.device, self.dtype)

    def _labels(self, y: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(y)).to(self.device, self.dtype)

    def _mask(self, mask: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        """(…, B) mask on the compute device: bool (padding), or row weights as `dtype`."""
        if dtype is None:
            return torch.from_numpy(np.ascontiguousarray(mask, dtype=bool)).to(self.device)
        return torch.from_numpy(np.ascontiguousarray(mask)).to(self.device, dtype)

    def _check_output(self) -> None:
        want = self.num_classes if self.task == "multiclass" else 1
        try:
            with torch.no_grad():
                out = self.module(torch.zeros((2,) + self.input_shape, dtype=self.dtype,
                                              device=self.device))
        except RuntimeError as e:
            raise ConfigError(f"model {self.name!r} cannot take inputs of shape "
                              f"{self.input_shape}: {e}") from None
        if tuple(out.shape) != (2, want):
            raise ConfigError(f"model {self.name!r} must output (n, {want}) for a {self.task} "
                              f"task but outputs {tuple(out.shape)[1:]} per example")

    # -- the Model interface ---------------------------------------------------------
    def check_input(self, x_shape: Sequence[int]) -> None:
        """Raise ConfigError unless data X of shape (n, *input_shape) fits this model."""
        got = tuple(int(s) for s in x_shape[1:])
        if got != self.input_shape:
            raise ConfigError(mismatch_message(self.name, got, self.input_shape))

    def init_params(self) -> np.ndarray:
        """(P,) float64: the architecture's default initialization, seeded by `seed`."""
        module = copy.deepcopy(self.module).cpu()  # CPU RNG: the same init on any device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            for m in module.modules():
                reset = getattr(m, "reset_parameters", None)
                if callable(reset):
                    reset()
        return torch.cat([p.detach().flatten() for p in module.parameters()]).double().numpy()

    def _forward(self, w: np.ndarray, X: np.ndarray) -> torch.Tensor:
        """(n, O) network outputs for one parameter vector w (P,), in chunks."""
        params, Xt = self._params(w), self._inputs(X, 1)
        with torch.no_grad():
            outs = [functional_call(self.module, params, (Xt[i:i + EVAL_CHUNK],))
                    for i in range(0, max(len(Xt), 1), EVAL_CHUNK)]
        return torch.cat(outs)

    def predict(self, w: np.ndarray, X: np.ndarray) -> np.ndarray:
        out = self._forward(w, X)
        if self.task == "binary":
            out = torch.sigmoid(out[:, 0])
        elif self.task == "multiclass":
            out = torch.softmax(out, -1)
        else:
            out = out[:, 0]
        return _np(out)

    def loss(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return _np(self._loss(self._forward(w, X), self._labels(y)))

    def per_example_grads(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        params, Xt, yt = self._params(w), self._inputs(X, 1), self._labels(y)
        if len(Xt) == 0:
            return np.zeros((0, self.num_params))
        return _np(torch.cat([self._flat(self._ex_grads(params, Xt[i:i + EVAL_CHUNK],
                                                        yt[i:i + EVAL_CHUNK]), 1)
                              for i in range(0, len(Xt), EVAL_CHUNK)]))

    def param_groups(self) -> dict[str, np.ndarray]:
        """{"head": the last Linear layer's weight and bias; "norm": the affine parameters of
        normalization layers (LayerNorm, GroupNorm, …), present only if the net has any}."""
        def mask_of(prefixes: list[str]) -> np.ndarray:
            parts = [np.full(k, n.rpartition(".")[0] in prefixes)
                     for n, k in zip(self._names, self._sizes)]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
        mods = list(self.module.named_modules())
        linear = [n for n, m in mods if isinstance(m, nn.Linear)]
        norm = [n for n, m in mods if isinstance(m, (nn.LayerNorm, nn.GroupNorm))]
        groups = {"head": mask_of(linear[-1:])}
        if norm:
            groups["norm"] = mask_of(norm)
        return groups

    def _coords(self, coords: np.ndarray | None) -> list[torch.Tensor] | None:
        """A (P,) bool mask as one 0/1 tensor per parameter (flattened), or None."""
        if coords is None:
            return None
        t = torch.from_numpy(np.ascontiguousarray(coords, dtype=bool)).to(self.device,
                                                                           self.dtype)
        return list(torch.split(t, self._sizes))

    def _clip_sum(self, grads: dict[str, torch.Tensor], mask: torch.Tensor,
                  clip: float | np.ndarray, within: list | None = None,
                  coords: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Σ_b min(1, c/‖g_b‖)·mask_b·g_b with c = clip_bound(clip). grads {name: (*L, B,
        *shape)}, mask (*L, B) → (*L, P). Norms are over all parameters of an example (the
        L2 norm DP-SGD clips), accumulated in float64: a float32 reduction over many
        parameters can err by more than the clipping margin."""
        lead = mask.dim()
        flat = [grads[n].flatten(lead) for n in self._names]       # (*L, B, p_i) views
        if coords is not None:  # the gradient restricted to the trained coordinates
            flat = [g * c for g, c in zip(flat, coords)]
        norms = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g, dim=-1, dtype=torch.float64) for g in flat]), dim=0)
        factor = self._factors(norms, mask, clip, within).to(flat[0].dtype)
        return torch.cat([torch.einsum("...b,...bp->...p", factor, g) for g in flat], -1)

    @staticmethod
    def _factors(norms: torch.Tensor, mask: torch.Tensor, clip: float | np.ndarray,
                 within: list | None = None) -> torch.Tensor:
        """(*L, B) float64 clip factors min(1, c/‖g_b‖)·mask_b from per-example norms (*L,
        B), c = clip_bound(clip); a float mask holds row weights (person level: each row
        is clipped, then weighed). With `within`, clip is per silo (*L,) and the count of
        unmasked rows with ‖g‖ ≤ clip is appended to it (numpy, (*L,))."""
        valid = mask if mask.dtype == torch.bool else mask > 0
        if within is None:
            bound: float | torch.Tensor = clip_bound(float(clip))
        else:  # one clip per silo (clip = "auto"): count the rows within it
            c = torch.as_tensor(np.asarray(clip, dtype=np.float64), device=norms.device)
            c = c.reshape(c.shape + (1,) * (norms.dim() - c.dim()))
            bound = c / (1.0 + CLIP_MARGIN)
            inside = (norms <= c) & valid
            within.append(_np(inside.sum(-1) if valid is mask
                              else (inside.to(norms.dtype) * mask.to(norms.dtype)).sum(-1)))
        factor = torch.where(valid, (bound / norms.clamp_min(1e-12)).clamp(max=1.0),
                             0.0)
        if valid is not mask:
            factor = factor * mask.to(factor.dtype)
        return factor

    def clipped_grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                         clip: float, *, coords: np.ndarray | None = None,
                         **aux: Any) -> np.ndarray:
        """Σ_b min(1, clip/‖g_kb‖)·g_kb over unmasked rows → (K, P) float64.
        W (K, P); X (K, B, *input_shape); y, mask (K, B). coords (P,) bool: g restricted to
        these coordinates (0 elsewhere) before its norm. `aux` (GLM helpers) is ignored."""
        include = self._stacked_include(coords)
        if include is not None:
            return self._stacked_clip(W, X, y, mask, clip, include, count=False)[0]
        cm = self._coords(coords)
        out = np.zeros((np.shape(mask)[0], self.num_params))
        for s, G, m in self._example_grads(W, X, y, mask):
            out[s] = _np(self._clip_sum(G, m, clip, coords=cm))
        return out

    def clipped_grad_sum_count(self, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                               mask: np.ndarray, clip: np.ndarray, *,
                               coords: np.ndarray | None = None,
                               **aux: Any) -> tuple[np.ndarray, np.ndarray]:
        """`clipped_grad_sum` at clip[k] (K,) for silo k, and per silo the number of
        unmasked rows whose gradient norm (restricted to `coords`) is ≤ clip[k] (K,)
        (see `Model`)."""
        clip = np.asarray(clip, dtype=np.float64)
        include = self._stacked_include(coords)
        if include is not None:
            out, count = self._stacked_clip(W, X, y, mask, clip, include, count=True)
            assert count is not None
            return out, count
        cm = self._coords(coords)
        K = np.shape(mask)[0]
        out, count = np.zeros((K, self.num_params)), np.zeros(K)
        for s, G, m in self._example_grads(W, X, y, mask):
            within: list = []
            out[s] = _np(self._clip_sum(G, m, clip[s], within, cm))
            count[s] = within[0]
        return out, count

    # -- the stacked engine (`torch_stacked`) -------------------------------------------
    def _stacked_example_bytes(self) -> int:
        """Bytes one example occupies in the stacked engine: every kept activation and its
        gradient, and its per-example conv weight gradients (a traced forward of one)."""
        if self._stacked is None:
            return 0
        W = np.zeros((1, self.num_params))
        X = torch.zeros((1, 1) + self.input_shape, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            _, records = self._stacked.forward(self._params(W), X, keep=True)
        floats = sum(2 * (r.a.numel() + r.z.numel())
                     + (r.op.module.weight.numel() if r.op.kind == "conv" else 0)
                     for r in records)
        return int(floats) * torch.finfo(self.dtype).bits // 8

    def _stacked_include(self, coords: np.ndarray | None) -> set[str] | None:
        """The parameter names the stacked engine clips for `coords` (all when None), or
        None when it cannot serve the call (engine off, or coords that split a tensor)."""
        if not self.stacked or self._stacked is None:
            return None
        if coords is None:
            return set(self._names)
        parts = np.split(np.asarray(coords, dtype=bool), np.cumsum(self._sizes)[:-1])
        if any(p.any() and not p.all() for p in parts):
            return None
        return {n for n, p in zip(self._names, parts) if p.all()}

    def _stacked_clip(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray,
                      clip: float | np.ndarray, include: set[str], count: bool,
                      ) -> tuple[np.ndarray, np.ndarray | None]:
        """`clipped_grad_sum` (count False, clip a float) or `clipped_grad_sum_count`
        (clip (K,)) with the stacked engine, in parts (`_stacked_parts`)."""
        K, B = np.shape(mask)
        out, counts = np.zeros((K, self.num_params)), (np.zeros(K) if count else None)
        if B == 0:
            return out, counts
        engine = self._stacked
        assert engine is not None
        Xt, yt = self._inputs(X, 2), self._labels(y)
        m = (self._mask(mask) if np.asarray(mask).dtype == bool
             else self._mask(mask, torch.float64))  # row weights (person level)
        keep = include.__contains__

        def part(item: tuple[slice, slice]) -> tuple[slice, np.ndarray, Any]:
            s, e = item
            batch = engine.backward(self._params(W[s]), Xt[s, e], yt[s, e], self._loss)
            norms = engine.sq_norms(batch, keep).sqrt()
            within: list | None = [] if count else None
            c = np.asarray(clip)[s] if count else clip  # per silo for counts
            factor = self._factors(norms, m[s, e], c, within)
            sums = engine.clipped_sums(batch, factor.to(self.dtype), keep)
            return s, _np(self._flat_some(sums, s.stop - s.start)), within and within[0]

        for s, o, c in self._run_parts(part, K, B):
            out[s] += o
            if counts is not None:
                counts[s] += c
        return out, counts

    def _stacked_parts(self, K: int, B: int) -> tuple[list[tuple[slice, slice]], int]:
        """Work items (silos, examples) of one stacked step, and the worker threads to run
        them on (0: this thread). Silos go in chunks under STACK_BYTES (CPU caches; a GPU
        takes CHUNK_BYTES); on a CPU with n > 1 intra-op threads and at least SPLIT_BYTES
        of work per chunk, each chunk's examples go in n parts, one per worker."""
        cap = STACK_BYTES if self.device.type == "cpu" else CHUNK_BYTES
        step = max(1, cap // max(1, B * self._example_bytes))
        chunks = [slice(a, min(a + step, K)) for a in range(0, K, step)]
        n = torch.get_num_threads() if self.device.type == "cpu" else 1
        if n < 2 or B < 2 or B * self._example_bytes < SPLIT_BYTES:
            return [(s, slice(0, B)) for s in chunks], 0
        cuts = np.linspace(0, B, min(n, B) + 1).astype(int)
        return [(s, slice(a, b)) for s in chunks for a, b in zip(cuts[:-1], cuts[1:])], n

    def _run_parts(self, fn: Callable[[tuple[slice, slice]], Any], K: int,
                   B: int) -> Iterator[Any]:
        """fn over the work items of `_stacked_parts`, here or on its worker threads."""
        items, n = self._stacked_parts(K, B)
        return iter(_pool(n).map(fn, items)) if n else map(fn, items)

    def _flat_some(self, grads: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        """{name: (k, *shape)} for some parameters → (k, P), zeros for the others."""
        return torch.cat([grads[n].reshape(k, -1) if n in grads else
                          torch.zeros((k, size), dtype=self.dtype, device=self.device)
                          for n, size in zip(self._names, self._sizes)], -1)

    def _example_grads(self, W: np.ndarray, X: np.ndarray, y: np.ndarray,
                       mask: np.ndarray) -> Iterator[tuple[int | slice, dict, torch.Tensor]]:
        """The per-example gradients of `clipped_grad_sum`, silo by silo (an int index,
        {name: (B, *shape)}, mask (B,)) or, with `silo_vmap`, in chunks of silos (a slice,
        {name: (k, B, *shape)}, mask (k, B)); nothing when B = 0."""
        K, B = np.shape(mask)
        if B == 0:
            return
        Xt, yt = self._inputs(X, 2), self._labels(y)
        m = (self._mask(mask) if np.asarray(mask).dtype == bool
             else self._mask(mask, torch.float64))  # row weights (person level)
        if not self.silo_vmap or K == 1:
            for k in range(K):
                yield k, self._ex_grads(self._params(W[k]), Xt[k], yt[k]), m[k]
            return
        # silos per chunk so the (k, B, P) per-example gradients stay under CHUNK_BYTES
        step = max(1, CHUNK_BYTES // (B * self.num_params * torch.finfo(self.dtype).bits // 8))
        for a in range(0, K, step):
            s = slice(a, a + step)
            yield s, self._silo_ex_grads(self._params(W[s]), Xt[s], yt[s]), m[s]

    def grad_sum(self, W: np.ndarray, X: np.ndarray, y: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Σ_b g_kb over unmasked rows → (K, P) float64 (the non-private path: one
        backward pass per silo, no per-example gradients)."""
        m = self._mask(mask, self.dtype)
        K, B = m.shape
        if B == 0:
            return np.zeros((K, self.num_params))
        Xt, yt = self._inputs(X, 2), self._labels(y)
        engine = self._stacked
        if self.stacked and engine is not None:  # weighted by the mask, no norms
            out = np.zeros((K, self.num_params))
            every = set(self._names).__contains__

            def part(item: tuple[slice, slice]) -> tuple[slice, np.ndarray]:
                s, e = item
                batch = engine.backward(self._params(W[s]), Xt[s, e], yt[s, e], self._loss)
                sums = engine.clipped_sums(batch, m[s, e], every)
                return s, _np(self._flat_some(sums, s.stop - s.start))

            for s, o in self._run_parts(part, K, B):
                out[s] += o
            return out
        if not self.silo_vmap or K == 1:
            return np.stack([_np(self._flat(self._grad_sum(self._params(W[k]), Xt[k], yt[k],
                                                           m[k]), 0)) for k in range(K)])
        return _np(self._flat(self._silo_grad_sum(self._params(W), Xt, yt, m), 1))
