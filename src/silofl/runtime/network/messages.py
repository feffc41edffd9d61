"""The wire schema between server and silos: strict, versioned, size-limited, signed.

Every message is a flat dict of scalars (Flower's config/metrics) plus at most one float64
array (Flower's parameters). Nothing else is accepted: unknown or missing keys, wrong
types, another protocol version, non-finite or wrongly shaped arrays and arrays over
`MAX_ARRAY_BYTES` are rejected with `ProtocolError` before anything is done with them.

A silo proves who it is by signing what it sends with its ECDSA P-256 key (made by
`silofl deploy init`, library `cryptography`); the server checks the signature against the
public key registered for that silo name, so a client without the key cannot join or
inject updates. Signed text: the canonical JSON of the fields plus the SHA-256 of the array.
"""

from __future__ import annotations

import hashlib
import json
from typing import overload

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from silofl.errors import SiloflError

PROTOCOL = "silofl-net/1"
#: the largest array accepted in one message (64 MiB of float64: 8M parameters); the gRPC
#: transport is capped at the same size plus headroom
MAX_ARRAY_BYTES = 64 << 20
GRPC_MAX_MESSAGE = MAX_ARRAY_BYTES + (1 << 20)
STATUSES = ("ok", "refused", "exhausted")

#: field → type, per message kind
JOIN_REQUEST = {"protocol": str, "kind": str, "job": str, "nonce": str}
JOIN_REPLY = {"protocol": str, "kind": str, "silo": str, "status": str, "reason": str,
              "job_hash": str, "n_train": int, "q": float, "steps": int, "sigma": float,
              "nonce": str, "signature": str}
HELLO_REQUEST = {"protocol": str, "kind": str, "nonce": str}
HELLO_REPLY = {"protocol": str, "kind": str, "silo": str, "public_key": str, "dim": int,
               "nonce": str, "signature": str}
ROUND_REQUEST = {"protocol": str, "kind": str, "job_hash": str, "round": int, "method": str,
                 "steps": int, "q": float, "sigma": float, "silo": str}
ROUND_REPLY = {"protocol": str, "kind": str, "silo": str, "status": str, "reason": str,
               "job_hash": str, "round": int, "signature": str}


class ProtocolError(SiloflError):
    """A message that does not follow the schema (rejected, nothing done with it)."""


def check_fields(msg: dict, schema: dict, kind: str) -> dict:
    """`msg` with exactly `schema`'s keys and types, protocol and kind checked."""
    if not isinstance(msg, dict):
        raise ProtocolError(f"{kind}: expected a dict of fields, got {type(msg).__name__}")
    keys, want = set(msg), set(schema)
    if keys != want:
        raise ProtocolError(f"{kind}: fields {sorted(keys ^ want)} are missing or unknown "
                            f"(expected exactly {sorted(want)})")
    for k, t in schema.items():
        v = msg[k]
        ts = t if isinstance(t, tuple) else (t,)  # a tuple: any of its types
        ok = isinstance(v, ts) and not (int in ts and isinstance(v, bool))
        if float in ts and isinstance(v, int) and not isinstance(v, bool):
            ok = True
        if not ok:
            raise ProtocolError(f"{kind}: field {k!r} must be "
                                f"{' or '.join(x.__name__ for x in ts)}, got "
                                f"{type(v).__name__}")
        if isinstance(v, str) and len(v) > 4096:
            raise ProtocolError(f"{kind}: field {k!r} is longer than 4096 characters")
    if msg["protocol"] != PROTOCOL:
        raise ProtocolError(f"{kind}: protocol {msg['protocol']!r}, this silofl speaks "
                            f"{PROTOCOL!r}; run the same silofl version on server and silos")
    if msg["kind"] != kind:
        raise ProtocolError(f"expected a {kind!r} message, got {msg['kind']!r}")
    if "status" in msg and msg["status"] not in STATUSES:
        raise ProtocolError(f"{kind}: status must be one of {STATUSES}, got {msg['status']!r}")
    return dict(msg)


@overload
def check_array(arrays: list, shape: tuple[int, ...], kind: str) -> np.ndarray: ...


@overload
def check_array(arrays: list, shape: None, kind: str) -> None: ...


def check_array(arrays: list, shape: tuple[int, ...] | None, kind: str) -> np.ndarray | None:
    """The one float64 array of a message (None when `shape` is None and none is sent)."""
    if shape is None:
        if len(arrays):
            raise ProtocolError(f"{kind}: carries {len(arrays)} array(s), expected none")
        return None
    if len(arrays) != 1:
        raise ProtocolError(f"{kind}: carries {len(arrays)} arrays, expected exactly one")
    a = arrays[0]
    if not isinstance(a, np.ndarray) or a.dtype != np.float64:
        raise ProtocolError(f"{kind}: array must be float64, got "
                            f"{getattr(a, 'dtype', type(a).__name__)}")
    if a.nbytes > MAX_ARRAY_BYTES:
        raise ProtocolError(f"{kind}: array of {a.nbytes} bytes exceeds the limit of "
                            f"{MAX_ARRAY_BYTES} bytes")
    if a.shape != tuple(shape):
        raise ProtocolError(f"{kind}: array has shape {a.shape}, expected {tuple(shape)}")
    if not np.all(np.isfinite(a)):
        raise ProtocolError(f"{kind}: array holds NaN or infinite values")
    return a


def job_hash(job: dict) -> str:
    """SHA-256 of the job description's canonical JSON (what both sides agree on)."""
    return hashlib.sha256(canonical(job)).hexdigest()


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def signed_bytes(fields: dict, array: np.ndarray | None) -> bytes:
    body = {k: v for k, v in fields.items() if k != "signature"}
    digest = "" if array is None else hashlib.sha256(
        np.ascontiguousarray(array).tobytes() + str(array.shape).encode()).hexdigest()
    return canonical(body) + b"|" + digest.encode()


def sign(key: ec.EllipticCurvePrivateKey, fields: dict, array: np.ndarray | None) -> str:
    return key.sign(signed_bytes(fields, array), ec.ECDSA(hashes.SHA256())).hex()


def verify(public: ec.EllipticCurvePublicKey, fields: dict, array: np.ndarray | None) -> None:
    """ProtocolError unless `fields["signature"]` signs `fields` and `array` under `public`."""
    try:
        public.verify(bytes.fromhex(fields["signature"]), signed_bytes(fields, array),
                      ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise ProtocolError(f"message claiming to be from silo {fields.get('silo')!r} has no "
                            "valid signature of that silo's registered key; rejected") from None


def load_private_key(path) -> ec.EllipticCurvePrivateKey:
    from pathlib import Path
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise ProtocolError(f"cannot read the silo's private key {str(path)!r}: {e}; use the "
                            "key `silofl deploy init` wrote for this silo") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ProtocolError(f"{path}: not an elliptic-curve private key")
    return key


def public_pem(key: ec.EllipticCurvePrivateKey) -> str:
    """The PEM text of a private key's public half."""
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def public_key_from_pem(text: str) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(text.encode())
    except ValueError as e:
        raise ProtocolError(f"not a PEM public key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ProtocolError("not an elliptic-curve public key")
    return key


def load_public_key(path) -> ec.EllipticCurvePublicKey:
    from pathlib import Path
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise ProtocolError(f"cannot read the public key {str(path)!r}: {e}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ProtocolError(f"{path}: not an elliptic-curve public key")
    return key
