"""`silofl account`: DP-SGD accounting from the command line (ε for σ, or σ for ε),
example-level or node-level, with its inputs and its own time and memory bounded."""

from __future__ import annotations

import contextlib
import threading

import typer
from rich.table import Table

from silofl.cli.root import _fail, app, console
from silofl.errors import SiloflError


@app.command()
def account(n: int = typer.Option(..., help="training examples (persons) in the silo"),
            batch: float = typer.Option(..., help="(expected) batch size b"),
            delta: float | None = typer.Option(None, help="δ (node-level default: 1/n)"),
            steps: int | None = typer.Option(None, help="DP-SGD steps"),
            epochs: float | None = typer.Option(None, help="epochs (steps = epochs·n/b)"),
            sigma: float | None = typer.Option(None, help="noise multiplier → report ε"),
            epsilon: float | None = typer.Option(None, help="target ε → calibrate σ"),
            node_level: bool = typer.Option(False, "--node-level", help=(
                "node-level DP for graph neighbourhoods (Theorem 2.4.4): fixed-size batches "
                "without replacement, each person in ≤ S examples")),
            S: int = typer.Option(20, "--S", help="node-level: appearances bound S"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """ε for DP-SGD with (n, b, steps|epochs, σ, δ), or σ for a target ε: example-level
    under RDP and PLD, or node-level (--node-level) under RDP."""
    from silofl.privacy import accounting as A
    if node_level:
        return _account_node(n, int(batch), delta, steps, epochs, sigma, epsilon, S, as_json)
    try:
        if delta is None:
            raise SiloflError("give --delta (e.g. 1e-5, well below 1/n)")
        if (steps is None) == (epochs is None):
            raise SiloflError("give exactly one of --steps or --epochs")
        if (sigma is None) == (epsilon is None):
            raise SiloflError("give exactly one of --sigma (to get ε) or --epsilon (to get σ)")
        if n < 2 or not 0 < batch < n:
            raise SiloflError(f"need n ≥ 2 and 0 < batch < n, got n={n}, batch={batch}")
        if not 0 < delta < 1:
            raise SiloflError(f"delta must be in (0, 1), got {delta}")
        T = _account_bounds(n, batch, delta, steps, epochs, sigma, epsilon,
                            lambda: A.steps_for_epochs(n, batch, epochs))
        q = batch / n
        out = {"n": n, "batch": batch, "q": q, "steps": T, "delta": delta}
        with _bounded_accounting():
            if sigma is not None:
                out.update(sigma=sigma, **{f"epsilon_{k}": v for k, v in A.epsilons(
                    A.dpsgd_event(q, sigma, T), delta).items()})
            else:
                out.update(target_epsilon=epsilon, **{
                    f"sigma_{k}": A.calibrate_dpsgd(epsilon, delta, q, T, k)
                    for k in A.ACCOUNTANTS})
    except SiloflError as e:
        _fail(e)
    _print_quantities("DP-SGD privacy accounting (Poisson-sampled Gaussian, add/remove one)",
                      out, as_json)


#: sane ranges for `silofl account`: beyond them the answer is meaningless (σ → 0, ε → ∞)
#: and the PLD grid or the σ search grows without bound
ACCOUNT_RANGES = {"n": (2, 10**9), "steps": (1, 10**6), "sigma": (0.3, 1e4),
                  "epsilon": (1e-3, 100.0), "delta": (1e-15, 0.5), "epochs": (1e-6, 1e5)}
#: the accounting itself is also capped: seconds and extra address space (bytes)
ACCOUNT_LIMITS = (60, 8 * 2**30)


def _in_range(name: str, value) -> None:
    import math
    lo, hi = ACCOUNT_RANGES[name]
    if value is None:
        return
    if not math.isfinite(value) or not lo <= value <= hi:
        raise SiloflError(f"--{name} must be a finite number in [{lo:g}, {hi:g}], got "
                          f"{value:g}")


def _account_bounds(n, batch, delta, steps, epochs, sigma, epsilon, to_steps) -> int:
    """Refuse inputs outside ACCOUNT_RANGES; returns the number of steps."""
    import math
    if sigma is not None and sigma <= 0:
        raise SiloflError(f"sigma must be positive, got {sigma}")
    if epsilon is not None and epsilon <= 0:
        raise SiloflError(f"epsilon must be positive, got {epsilon}")
    if not math.isfinite(batch):
        raise SiloflError(f"--batch must be a finite number, got {batch:g}")
    for name, v in (("n", n), ("sigma", sigma), ("epsilon", epsilon), ("delta", delta),
                    ("steps", steps), ("epochs", epochs)):
        _in_range(name, v)
    T = steps if steps is not None else to_steps()
    if T > ACCOUNT_RANGES["steps"][1]:
        raise SiloflError(f"--epochs {epochs:g} means {T} steps, more than "
                          f"{ACCOUNT_RANGES['steps'][1]}; give fewer epochs or a larger batch")
    return T


@contextlib.contextmanager
def _bounded_accounting():
    """Cap the accounting's time and memory (ACCOUNT_LIMITS): an extreme schedule is then a
    clean refusal instead of a hang or a machine out of memory."""
    import resource
    import signal
    secs, extra = ACCOUNT_LIMITS

    def _timeout(signum, frame):
        raise TimeoutError

    old_as = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        cap = used + extra
        if old_as[1] == resource.RLIM_INFINITY or cap < old_as[1]:
            resource.setrlimit(resource.RLIMIT_AS, (cap, old_as[1]))
    except (OSError, ValueError):
        old_as = None
    main = threading.current_thread() is threading.main_thread()
    old_alarm = signal.signal(signal.SIGALRM, _timeout) if main else None
    if main:
        signal.alarm(secs)
    try:
        yield
    except (MemoryError, TimeoutError):
        raise SiloflError(f"this schedule needs more than {secs} s or {extra // 2**30} GiB "
                          "to account: its σ is too small or its steps too many for an "
                          "answer that means anything; raise --sigma, lower --epsilon or "
                          "give fewer steps") from None
    finally:
        if main:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_alarm)
        if old_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, old_as)


def _print_quantities(title: str, out: dict, as_json: bool) -> None:
    if as_json:
        from silofl.io import dumps_strict, json_safe
        bad: list[str] = []
        json_safe(out, bad)
        # strict JSON: an infinite ε prints as null, named under "nonfinite"
        console.print_json(dumps_strict({**out, "nonfinite": bad} if bad else out))
        return
    t = Table(title=title)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in out.items():
        t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    console.print(t)


def _account_node(n, b, delta, steps, epochs, sigma, epsilon, S, as_json):
    from silofl.privacy import node_level as node_dp
    try:
        if (steps is None) == (epochs is None):
            raise SiloflError("give exactly one of --steps or --epochs")
        if (sigma is None) == (epsilon is None):
            raise SiloflError("give exactly one of --sigma (to get ε) or --epsilon (to get σ)")
        if not 1 <= b <= n:
            raise SiloflError(f"need 1 ≤ batch ≤ n, got n={n}, batch={b}")
        if not 1 <= S <= n:
            raise SiloflError(f"--S must be in [1, n], got {S}")
        d = delta if delta is not None else 1.0 / n
        if not 0 < d < 1:
            raise SiloflError(f"delta must be in (0, 1), got {d}")
        T = _account_bounds(n, b, d, steps, epochs, sigma, epsilon,
                            lambda: node_dp.node_steps(n, b, epochs))
        out = {"n": n, "S": S, "batch": b, "steps": T, "delta": d}
        with _bounded_accounting():
            # both adjacencies: "node+edges" (a person and their contacts: 2S − 1 examples
            # affected, the pipeline's default) and "node" (fixed public graph: S examples)
            for adj, key in (("node+edges", "node_edges"), ("node", "node")):
                out[f"affected_{key}"] = node_dp.affected_examples(n, S, adj)
                if sigma is not None:
                    out[f"epsilon_{key}_rdp"] = node_dp.node_epsilon(n, S, b, sigma, T, d,
                                                                     adjacency=adj)
                else:
                    out[f"sigma_{key}_rdp"] = node_dp.calibrate_node_sigma(
                        epsilon, n, S, b, T, d, adjacency=adj)
        if sigma is not None:
            out["sigma"] = sigma
        else:
            out["target_epsilon"] = epsilon
        out["assumption"] = node_dp.PRUNING_ASSUMPTION
    except SiloflError as e:
        _fail(e)
    _print_quantities("node-level DP-SGD accounting (Theorem 2.4.4, replacement; node_edges: "
                      "a person and their contacts, 2S − 1 examples affected; node: fixed "
                      "public graph, S examples)", out, as_json)
