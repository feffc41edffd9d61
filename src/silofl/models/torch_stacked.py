"""Per-example clipped gradients of K silos at once, parameters stacked on a silo axis.

`StackedNet` runs a sequential network (Linear, Conv2d, LayerNorm, pooling, elementwise
activations, Flatten) for K silos of the same architecture, each with its own parameters,
in one pass — dense layers as batched matmuls over the silo axis (`torch.baddbmm`),
convolutions as one convolution grouped by silo — and gets per-example gradients the way
DP libraries' "hooks" do, without `torch.func`:

1. forward, keeping each parametrized layer's input a and output z;
2. one backward pass of Σ losses to the layer outputs only (dL/dz per example; no weight
   gradients are formed);
3. per-example squared norms per layer: a Linear layer's weight gradient dz aᵀ has norm²
   ‖dz‖²·‖a‖² (never formed: the "ghost norm"); a convolution's per-example weight
   gradients come from one weight gradient grouped by (example, silo), as torch.func's
   batching rule for conv does;
4. clip factors f from the norms (the caller's rule), then each layer's clipped sum as one
   weighted product: Σ_b f_b dz_b a_bᵀ = (f ⊙ dz)ᵀ a for Linear, fᵀ G for conv.

Images flow as (B, K·C, H, W) in channels-last memory (oneDNN's fast layout, and max-pool's:
~8× faster than NCHW on this CPU); a max-pool that follows a ReLU runs before it (the same
function and gradient, on a quarter of the values). Everything is float32 (the model's
dtype) except the squared norms: rows of at most C_in·kh·kw values are reduced in float32
and the rest in float64 (the clipping margin is 2⁻²⁰, `silofl.privacy.clipping`).

`StackedNet.build(module, input_shape)` returns None for architectures it does not cover
(any other layer, string padding, …); `TorchModel` then uses `torch.func`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

#: layers applied as they are to any shape (stateless, per element; Dropout is the identity
#: in eval mode, which `TorchModel` keeps its module in)
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid,
               nn.Softplus, nn.Identity, nn.Dropout)
POOLS = (nn.MaxPool2d, nn.AvgPool2d)


@dataclass
class _Op:
    """One layer: kind ∈ {linear, conv, norm, pool, elementwise, flatten}; `params` are the
    names of its weight and bias ("" where absent)."""

    kind: str
    module: Any  # the nn.Module (Any: its attributes are read by kind)
    params: tuple[str, str] = ("", "")


@dataclass
class _Record:
    """What one parametrized layer kept in the forward pass: its input `a` (Linear:
    (K, B, I); conv: (B, K·C, H, W); norm: the normalized x̂ (K, B, H)) and its output `z`
    (Linear, norm: (K, B, O); conv: (B, K·O, H', W'))."""

    op: _Op
    a: torch.Tensor
    z: torch.Tensor


@dataclass
class Batch:
    """One forward/backward pass of K silos × B examples: the records, dL/dz of each, and
    (once `StackedNet.sq_norms` formed them) the per-example conv weight gradients by
    record index, for `StackedNet.clipped_sums`."""

    records: list[_Record]
    dz: list[torch.Tensor]
    K: int
    B: int
    conv_grads: dict[int, torch.Tensor] = field(default_factory=dict)


def _flatten_ops(module: nn.Module, prefix: str = "") -> list[_Op] | None:
    """The layers of a (nested) Sequential, or a single supported layer, as `_Op`s; None if
    any layer is not covered."""
    if isinstance(module, nn.Sequential):
        ops: list[_Op] = []
        for name, child in module.named_children():
            sub = _flatten_ops(child, f"{prefix}{name}.")
            if sub is None:
                return None
            ops += sub
        return ops
    def names(bias: bool) -> tuple[str, str]:
        return f"{prefix}weight", (f"{prefix}bias" if bias else "")
    m = module
    if isinstance(m, nn.Linear):
        return [_Op("linear", m, names(m.bias is not None))]
    if isinstance(m, nn.Conv2d):
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            return None
        return [_Op("conv", m, names(m.bias is not None))]
    if isinstance(m, nn.LayerNorm):
        if len(m.normalized_shape) != 1:
            return None
        return [_Op("norm", m, names(m.bias is not None) if m.elementwise_affine
                    else ("", ""))]
    if isinstance(m, POOLS):
        return [_Op("pool", m)]
    if isinstance(m, ELEMENTWISE):
        if getattr(m, "inplace", False):  # in place would overwrite a kept layer output
            m = copy.copy(m)
            m.inplace = False
        return [_Op("elementwise", m)]
    if isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1:
        return [_Op("flatten", m)]
    return None


class StackedNet:
    """Forward, per-example norms and clipped sums of one architecture for K silos."""

    def __init__(self, ops: list[_Op], image: bool):
        self.ops, self.image = ops, image

    @staticmethod
    def build(module: nn.Module, input_shape: Sequence[int]) -> StackedNet | None:
        """A `StackedNet` for `module` on examples of `input_shape` ((C, H, W) or (d,)), or
        None when it has a layer this engine does not cover, or parameters outside them."""
        ops = _flatten_ops(module)
        if ops is None or len(input_shape) not in (1, 3):
            return None
        if len(list(module.named_modules(remove_duplicate=False))) != \
                len(list(module.named_modules())):  # a layer used twice: its repeats are
            return None  # skipped by named_children, and per-example norms would not add
        covered = {n for op in ops for n in op.params if n}
        if covered != {n for n, _ in module.named_parameters()}:
            return None
        image = len(input_shape) == 3
        for op in ops:  # the layers must see the layout they are written for
            if op.kind in ("conv", "pool") and not image:
                return None
            if op.kind in ("linear", "norm") and image:
                return None
            if op.kind == "flatten":
                image = False
        if image:  # the net must end in per-example vectors (K, B, O)
            return None
        for i in range(len(ops) - 1):  # max-pool before ReLU: the same function and
            a, b = ops[i], ops[i + 1]    # gradient (ReLU is monotone), on 4× fewer values
            if type(a.module) is nn.ReLU and isinstance(b.module, nn.MaxPool2d):
                ops[i], ops[i + 1] = b, a
        return StackedNet(ops, len(input_shape) == 3)

    # -- forward ---------------------------------------------------------------------
    def forward(self, params: dict[str, torch.Tensor], X: torch.Tensor,
                keep: bool = False) -> tuple[torch.Tensor, list[_Record]]:
        """Outputs (K, B, O) for stacked `params` {name: (K, *shape)} and X (K, B, *input);
        with `keep`, the records of every parametrized layer (for `backward`)."""
        K, B = X.shape[:2]
        x = (X.transpose(0, 1).reshape((B, -1) + X.shape[3:]).contiguous(
            memory_format=torch.channels_last) if self.image else X)
        records: list[_Record] = []
        for op in self.ops:
            w = params[op.params[0]] if op.params[0] else None
            b = params[op.params[1]] if op.params[1] else None
            if op.kind == "linear":
                assert w is not None
                z = (torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2)) if b is not None
                     else torch.bmm(x, w.transpose(1, 2)))
                if keep:
                    records.append(_Record(op, x, z))
                x = z
            elif op.kind == "conv":
                x = self._conv(op, w, b, x, records if keep else None)
            elif op.kind == "norm":
                m = op.module
                xh = F.layer_norm(x, m.normalized_shape, eps=m.eps)
                if w is None:
                    x = xh
                    continue
                z = xh * w.unsqueeze(1) + b.unsqueeze(1) if b is not None else xh * w.unsqueeze(1)
                if keep:
                    records.append(_Record(op, xh, z))
                x = z
            elif op.kind == "flatten":  # (B, K·C, H, W) → (K, B, C·H·W), torch's order
                if x.dim() == 4:
                    x = x.reshape((B, K, -1) + x.shape[2:]).transpose(0, 1).reshape(K, B, -1)
            else:
                x = op.module(x)
        return x, records

    @staticmethod
    def _conv(op: _Op, w: torch.Tensor | None, b: torch.Tensor | None, x: torch.Tensor,
              records: list[_Record] | None) -> torch.Tensor:
        """x (B, K·C, H, W) → (B, K·O, H', W'): one convolution grouped by silo (silo k's
        channels meet only silo k's filters), channels-last, oneDNN's kernel."""
        m = op.module
        assert w is not None
        K = w.shape[0]
        z = F.conv2d(x, w.reshape((-1,) + w.shape[2:]), None if b is None else b.reshape(-1),
                     m.stride, m.padding, m.dilation, m.groups * K)
        if records is not None:
            records.append(_Record(op, x, z))
        return z

    # -- per-example gradients ---------------------------------------------------------
    def backward(self, params: dict[str, torch.Tensor], X: torch.Tensor, y: torch.Tensor,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Batch:
        """Forward with records, then dL/dz of every parametrized layer, L = Σ_kb
        loss(out_kb, y_kb) (each example's loss reaches only its own z rows)."""
        with torch.enable_grad():
            for t in params.values():
                t.requires_grad_(True)  # so outputs join the graph (no weight grads form)
            out, records = self.forward(params, X, keep=True)
            total = loss(out, y).sum()
            dz = list(torch.autograd.grad(total, [r.z for r in records]))
        for t in params.values():
            t.requires_grad_(False)
        kept = [_Record(r.op, r.a.detach(), r.z.detach()) for r in records]
        return Batch(kept, [d.detach() for d in dz], int(X.shape[0]), int(X.shape[1]))

    @staticmethod
    def sq_norms(batch: Batch, include: Callable[[str], bool]) -> torch.Tensor:
        """(K, B) float64 squared per-example gradient norms over the parameters for which
        `include(name)`; conv per-example weight gradients are kept in `batch` for
        `clipped_sums`. Rows of at most C_in·kh·kw values are reduced in float32, the
        rest in float64."""
        K, B = batch.K, batch.B
        total = torch.zeros((K, B), dtype=torch.float64, device=batch.dz[0].device)
        for i, (r, dz) in enumerate(zip(batch.records, batch.dz)):
            wname, bname = r.op.params
            if r.op.kind == "conv":
                if include(wname):
                    G = _conv_example_grads(r, dz, K, B)         # (B·K·O, C·kh·kw)
                    batch.conv_grads[i] = G
                    rows = torch.linalg.vector_norm(G, dim=-1).double().square()
                    total += rows.view(B, K, -1).sum(-1).T
                if bname and include(bname):
                    total += _sq(_conv_bias_grads(dz, K, B)).T
                continue
            dsq = _sq(dz)
            if include(wname):
                total += dsq * _sq(r.a) if r.op.kind == "linear" else _sq(dz * r.a)
            if bname and include(bname):
                total += dsq
        return total

    @staticmethod
    def clipped_sums(batch: Batch, factor: torch.Tensor,
                     include: Callable[[str], bool]) -> dict[str, torch.Tensor]:
        """{name: (K, *shape)} Σ_b factor_kb · g_kb for every included parameter; `factor`
        (K, B) in the compute dtype (clip factors times the mask)."""
        K, B = batch.K, batch.B
        out: dict[str, torch.Tensor] = {}
        fk = factor.unsqueeze(1)                                  # (K, 1, B)
        for i, (r, dz) in enumerate(zip(batch.records, batch.dz)):
            wname, bname = r.op.params
            shape = tuple(r.op.module.weight.shape)
            if r.op.kind == "conv":
                if include(wname):
                    G = batch.conv_grads.get(i)
                    out[wname] = (_conv_weighted_grad(r, dz, factor) if G is None else
                                  torch.einsum("kb,bkp->kp", factor, G.view(B, K, -1))
                                  ).view((K,) + shape)
                if bname and include(bname):
                    out[bname] = torch.einsum("kb,bko->ko", factor,
                                              _conv_bias_grads(dz, K, B))
                continue
            if include(wname):
                if r.op.kind == "linear":
                    out[wname] = torch.bmm((dz * factor.unsqueeze(-1)).transpose(1, 2), r.a)
                else:
                    out[wname] = torch.bmm(fk, dz * r.a).squeeze(1)
            if bname and include(bname):
                out[bname] = torch.bmm(fk, dz).squeeze(1)
        return out

    @staticmethod
    def per_example(batch: Batch) -> dict[str, torch.Tensor]:
        """{name: (K, B, *shape)} every per-example gradient, materialized (tests, audits)."""
        K, B = batch.K, batch.B
        out: dict[str, torch.Tensor] = {}
        for r, dz in zip(batch.records, batch.dz):
            wname, bname = r.op.params
            shape = tuple(r.op.module.weight.shape)
            if r.op.kind == "conv":
                G = _conv_example_grads(r, dz, K, B)
                out[wname] = G.view((B, K) + shape).transpose(0, 1)
                if bname:
                    out[bname] = _conv_bias_grads(dz, K, B).transpose(0, 1)
                continue
            out[wname] = (torch.einsum("kbo,kbi->kboi", dz, r.a) if r.op.kind == "linear"
                          else dz * r.a)
            if bname:
                out[bname] = dz
        return out


def _conv_args(m: nn.Conv2d) -> tuple:
    return list(m.stride), list(m.padding), list(m.dilation), False, [0, 0]


def _conv_example_grads(r: _Record, dz: torch.Tensor, K: int, B: int) -> torch.Tensor:
    """(B·K·O, C/g·kh·kw) per-example weight gradients of conv record `r` (input (B, K·C, H,
    W), output gradient dz (B, K·O, H', W')): the weight gradient of one convolution with
    a group per (example, silo) — what `torch.func` does for a conv, here without a vmap."""
    m = r.op.module
    a = r.a.contiguous().view((1, -1) + r.a.shape[2:])
    d = dz.contiguous().view((1, -1) + dz.shape[2:])
    w = a.new_empty((B * K * m.weight.shape[0],) + m.weight.shape[1:])  # shape only
    G = torch.ops.aten.convolution_backward(d, a, w, None, *_conv_args(m),
                                            B * K * m.groups, [False, True, False])[1]
    return G.view(B * K * m.weight.shape[0], -1)


def _conv_weighted_grad(r: _Record, dz: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """(K·O, C/g, kh, kw) Σ_b factor_kb · (weight gradient of example b of silo k), as one
    weight gradient with the output gradients scaled (no per-example tensors)."""
    m = r.op.module
    K, B = factor.shape
    f = factor.T.reshape(B, K, 1, 1, 1)
    d = (dz.view((B, K, -1) + dz.shape[2:]) * f).view(dz.shape)
    w = r.a.new_empty((K * m.weight.shape[0],) + m.weight.shape[1:])
    return torch.ops.aten.convolution_backward(d, r.a, w, None, *_conv_args(m),
                                               K * m.groups, [False, True, False])[1]


def _conv_bias_grads(dz: torch.Tensor, K: int, B: int) -> torch.Tensor:
    """(B, K, O) per-example bias gradients: dz (B, K·O, H', W') summed over positions."""
    return dz.sum((2, 3)).view(B, K, -1)


def _sq(t: torch.Tensor) -> torch.Tensor:
    """Σ t² over the last axis, accumulated in float64 → (K, B)."""
    return torch.linalg.vector_norm(t, dim=-1, dtype=torch.float64).square()
