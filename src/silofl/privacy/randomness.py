"""Sources of randomness for sampling and noise.

- `Randomness.secure()` (alias `os_entropy()`): a cryptographically secure stream, the
  AES-256-CTR keystream under a key and counter block drawn from the operating system's
  entropy pool (`os.urandom`) for each instance. Nothing about the noise can be predicted or
  recovered from released models or from other draws — for deployments.
- `Randomness.seeded(seed)`: NumPy PCG64, reproducible — for experiments only: anyone who
  knows the seed can subtract the noise.

`Randomness.for_mode(mode, seed)` picks one by name ("secure" | "seeded").

Both modes expose the same draws; batch sampling and the Gumbel noise of private selection
are built on `uniform`, so both modes sample exactly the same distributions. Like most DP
libraries we add floating-point Gaussians; Mironov (2012, "On significance of the least
significant bits for differential privacy") shows that the rounding pattern of textbook
floating-point noise can in principle leak; that theoretical caveat applies to both modes.

How the secure stream draws (all vectorized, from 64-bit keystream words w):
- uniform: (m + 1)·2⁻⁵³ with m ∈ [0, 2⁵³) the top 53 bits of w (an arithmetic shift plus
  2⁵², a bijection), i.e. 53 random bits, in (0, 1] (never 0, so logs are finite).
- normal: Marsaglia's polar method, an exact transformation: (u, v) uniform in the square
  (u = w·2⁻⁶³ for odd w, rounded to the nearest double, so the grid is symmetric and never
  0), kept when s = u² + v² < 1, then z = (u, v)·√(−2 ln s / s). No trigonometry (float64
  sin/cos are scalar in NumPy) and float64 resolution all the way into the tails: the
  smallest s is ≈ 2⁻¹²⁶, so |z| reaches ≈ 12.8 (P(|Z| > 12.8) ≈ 2e-37); Box–Muller on
  53-bit uniforms would stop at √(2·53·ln 2) ≈ 8.57.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

import numpy as np

from silofl.errors import ConfigError

MODES = ("secure", "seeded")

#: keystream words per cipher call and per transformation chunk: 256 KiB, so that a
#: chunk and its temporaries stay in a 1 MiB L2 cache
_CHUNK_WORDS = 1 << 15
#: fresh OS key after this many keystream bytes (64 GiB): far inside AES-CTR's bounds, and
#: it makes the stream's safety independent of how OpenSSL carries the counter
_REKEY_BYTES = 1 << 36
#: draw secure noise blocks ahead in a background thread: True, False, or None = only when
#: a core is spare (`spare_core`): on a busy core the thread takes its time from training
PREFETCH: bool | None = None
#: the environment variable naming how many training processes run side by side (a
#: parallel sweep's workers; default 1): each needs a core of its own
WORKERS_ENV = "SILOFL_WORKERS"
#: noise blocks up to this size (bytes) are drawn ahead; bigger blocks (large neural
#: models) are drawn when asked, so memory is not doubled
PREFETCH_MAX_BYTES = 64 << 20
_ACCEPT = math.pi / 4  # the polar method keeps a point of the square with probability π/4
#: the plaintext: encrypting zeros in CTR mode yields the bare keystream (shared, read-only)
_ZEROS = memoryview(bytes(8 * _CHUNK_WORDS))


def spare_core() -> bool:
    """Whether a core is spare for drawing noise ahead: the rule is
    usable CPUs − workers ≥ 2, i.e. one core per training process (workers: the
    `WORKERS_ENV` variable, default 1) plus one for everything else on the machine (the
    OS, BLAS helpers, other jobs) and then one more for the noise thread. A 2-core
    machine never prefetches (the thread competes with training and loses: measured
    ≈ 5 % slower, `benchmarks/bench_engine.py`); a 4-core one does for one worker.

    Returns
    -------
    bool
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        workers = max(1, int(os.environ.get(WORKERS_ENV, "1")))
    except ValueError:
        workers = 1
    return cpus - workers >= 2


def _prefetching() -> bool:
    return spare_core() if PREFETCH is None else PREFETCH


#: What seeds a reproducible stream (`numpy.random.default_rng` accepts each).
Seed = int | np.integer | Sequence[int]


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = np.asarray(shape)
    return (int(dims),) if dims.ndim == 0 else tuple(int(s) for s in dims)


class _Secureness:
    """`Randomness.secure` is two things: on the class, the factory `Randomness.secure()`;
    on an instance, the bool "is this a secure stream" (as before the factory existed)."""

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return _Secure
        return obj.mode == "secure"


class Randomness:
    #: "secure" or "seeded"
    mode: str = ""
    secure = _Secureness()

    @staticmethod
    def seeded(seed: Seed) -> Randomness:
        """Reproducible NumPy PCG64 stream (experiments only)."""
        return _Seeded(seed)

    @staticmethod
    def os_entropy() -> Randomness:
        """Alias of `Randomness.secure()`."""
        return _Secure()

    @staticmethod
    def for_mode(mode: str, seed: Seed | None = None) -> Randomness:
        """The stream for a noise mode: "secure" (seed ignored: nothing about a secure
        stream may follow from a config value) or "seeded" (needs `seed`)."""
        if mode == "secure":
            return _Secure()
        if mode == "seeded":
            if seed is None:
                raise ConfigError("noise mode 'seeded' needs a seed (an int or a sequence "
                                  "of ints); without one it would not be reproducible")
            return _Seeded(seed)
        raise ConfigError(f"unknown noise mode {mode!r}; use 'secure' (CSPRNG keyed from OS "
                          "entropy, for deployments) or 'seeded' (reproducible, experiments "
                          "only: not a privacy guarantee)")

    def uniform(self, shape: int | Sequence[int]) -> np.ndarray:
        """float64 array of `shape`, uniform in (0, 1]."""
        raise NotImplementedError

    def normal(self, shape: int | Sequence[int]) -> np.ndarray:
        """float64 array of `shape`, standard normal N(0, 1)."""
        raise NotImplementedError

    def normal_prefetched(self, shape: int | Sequence[int]) -> np.ndarray:
        """Like `normal(shape)`; a stream may have drawn the block in the background and
        start drawing the next block of the same shape on return (for a training loop
        that asks for one same-shaped noise block per round). Seeded streams draw in place,
        so their sequence is exactly that of `normal`."""
        return self.normal(shape)

    def gumbel(self, shape: int | Sequence[int]) -> np.ndarray:
        """Standard Gumbel(0, 1) draws, −log(−log U) with U uniform in (0, 1): the noise of
        report-noisy-max, which samples the exponential mechanism exactly."""
        u = np.asarray(self.uniform(shape), dtype=float)
        while np.any(top := u >= 1.0):  # U = 1 (probability 2^-53) would give +∞: redraw
            u[top] = self.uniform(int(top.sum()))
        return -np.log(-np.log(u))

    def spawn(self) -> Randomness:
        """An independent stream (for an independent component, e.g. evaluation)."""
        raise NotImplementedError


class _Seeded(Randomness):
    mode = "seeded"

    def __init__(self, seed: Seed) -> None:
        self.gen = np.random.Generator(np.random.PCG64(seed))

    def uniform(self, shape: int | Sequence[int]) -> np.ndarray:
        return 1.0 - self.gen.random(shape)  # [0,1) → (0,1]

    def normal(self, shape: int | Sequence[int]) -> np.ndarray:
        return self.gen.standard_normal(shape)

    def spawn(self) -> Randomness:
        return _Seeded(self.gen.integers(2**63))


class _Secure(Randomness):
    """AES-256-CTR keystream keyed from os.urandom (see the module docstring).

    Thread-safe: each draw holds the instance's lock, so concurrent draws get disjoint
    keystream. After a fork the child rekeys from os.urandom before its first draw, so a
    forked copy never repeats its parent's keystream; copying or pickling is refused."""

    mode = "secure"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # scratch for one chunk: keystream words, then their float64 transform
        self._words_buf = np.empty(_CHUNK_WORDS + 2, np.int64)  # +16 B: cipher output slack
        self._bytes = self._words_buf.data.cast("B")  # ndarray.data: its buffer's memoryview
        self._floats = np.empty(_CHUNK_WORDS)
        self._ahead_lock = threading.Lock()
        self._forked()

    def _forked(self) -> None:
        """(Re)start: a fresh key, and no prefetching state (a forked child has no worker)."""
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None
        self._child: _Secure | None = None
        self._ahead: tuple[tuple[int, ...], Future] | None = None
        self._rekey()

    def _rekey(self) -> None:
        # imported here: seeded runs (experiments, benchmarks) never need OpenSSL
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        self._enc = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(os.urandom(16))).encryptor()
        self._left = _REKEY_BYTES

    def _keystream(self, m: int) -> np.ndarray:
        """The next 8·m keystream bytes as int64 (m ≤ _CHUNK_WORDS), in the scratch buffer
        (valid until the next call). Caller holds the lock."""
        if self._pid != os.getpid():
            self._forked()
        elif self._left < 8 * m:
            self._rekey()
        self._enc.update_into(_ZEROS[: 8 * m], self._bytes[: 8 * m + 16])
        self._left -= 8 * m
        return self._words_buf[:m]

    def uniform(self, shape: int | Sequence[int]) -> np.ndarray:
        shape = _shape(shape)
        out = np.empty(math.prod(shape))
        with self._lock:
            for a in range(0, out.size, _CHUNK_WORDS):
                o = out[a:a + _CHUNK_WORDS]
                w = self._keystream(o.size)
                np.right_shift(w, 11, out=w)     # top 53 bits, signed: −2⁵²…2⁵²−1
                np.add(w, 2.0**52 + 1.0, out=o)  # 1…2⁵³, exact in float64
                o *= 2.0**-53
        return out.reshape(shape)

    def normal(self, shape: int | Sequence[int]) -> np.ndarray:
        shape = _shape(shape)
        n = math.prod(shape)
        out = np.empty(n + (n & 1))  # whole pairs; an odd n drops the last value
        done = 0
        with self._lock:
            while done < n:
                pairs = (out.size - done) // 2
                # candidates for `pairs` accepted points with ≈ 3 sd to spare: one pass, usually
                m = min(_CHUNK_WORDS // 2, int(pairs / _ACCEPT + 2 * math.sqrt(pairs)) + 8)
                w = self._keystream(2 * m)
                np.bitwise_or(w, 1, out=w)  # odd: symmetric grid without 0, so s > 0
                f = np.multiply(w, 2.0**-63, out=self._floats[:2 * m])
                u, v = f[:m], f[m:]  # halves, not (m, 2) rows: 2-D masks are slow in NumPy
                s = u * u
                s += v * v
                keep = np.flatnonzero(s < 1.0)[:pairs]
                k = len(keep)
                s = s.take(keep)
                r = np.log(s)
                r *= -2.0
                r /= s
                np.sqrt(r, out=r)
                np.multiply(u.take(keep), r, out=out[done:done + k])
                np.multiply(v.take(keep), r, out=out[done + k:done + 2 * k])
                done += 2 * k
        return out[:n].reshape(shape)

    def normal_prefetched(self, shape: int | Sequence[int]) -> np.ndarray:
        """`normal(shape)`, drawn ahead in a background thread from a child stream with its
        own OS key: the worker never touches this stream's keystream, each block is handed
        out once, and a block of another shape is dropped unused (never reused)."""
        shape = _shape(shape)
        if 8 * math.prod(shape) > PREFETCH_MAX_BYTES or not _prefetching():
            return self.normal(shape)
        with self._ahead_lock:
            if self._pid != os.getpid():  # forked: the worker thread did not come along
                with self._lock:
                    self._forked()
            pool, child = self._pool, self._child  # set and reset together (_forked)
            if pool is None or child is None:
                pool = self._pool = ThreadPoolExecutor(1, thread_name_prefix="silofl-noise")
                child = self._child = _Secure()
            pending, self._ahead = self._ahead, None
            if pending is not None and pending[0] == shape:
                z = pending[1].result()
            else:  # the child's lock serializes this with a still-running stale block
                z = child.normal(shape)
            self._ahead = (shape, pool.submit(child.normal, shape))
            return z

    def spawn(self) -> Randomness:
        return _Secure()

    def __reduce__(self) -> NoReturn:
        raise TypeError("a secure Randomness cannot be copied or pickled: the copy would "
                        "repeat its keystream; create one with Randomness.secure() or spawn()")
