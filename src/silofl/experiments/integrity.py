"""Integrity of saved models (`silofl.experiments.artifacts`) and of `predict`'s output.

Each manifest entry records the SHA-256 of its silo's model file and model card. On load
every file is checked against it, so a truncated file, a deleted card or a model file
copied over from another silo or method is a specific error naming the file, never a
wrong prediction. Hashes cover released models and cards only (DP outputs and public
metadata), never training records. Runs saved before hashes were recorded are checked by
what their files say about themselves (the card's silo and method, a loadable model).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from silofl.errors import ConfigError, DataError
from silofl.io import sha256_file

_FIX = ("restore the run directory from a backup, or run the job again (a released model "
        "cannot be rebuilt from a damaged copy)")


def verify_file(path: Path, expected: str | None, what: str) -> None:
    """DataError if `path` is missing or (with `expected`) its hash differs."""
    if not path.is_file():
        raise DataError(f"{what} {str(path)!r} is missing (deleted or moved): the run "
                        f"directory is incomplete; {_FIX}")
    if expected is not None and sha256_file(path) != expected:
        raise DataError(f"{what} {str(path)!r} does not match the SHA-256 recorded in "
                        "manifest.json: it was changed, truncated, or swapped with another "
                        f"silo's or method's file; {_FIX}")


def verify_entry(folder: Path, entry: dict, silo: str, label: str) -> None:
    """Check one manifest entry's model file and card (see the module docstring)."""
    hashes = entry.get("sha256") or {}
    where = f"of silo {silo!r} (method {label!r})"
    verify_file(folder / entry["params"], hashes.get("params"), f"model file {where}")
    verify_file(folder / entry["card"], hashes.get("card"), f"model card {where}")
    if hashes:
        return
    try:  # an older run without hashes: the card must describe this silo and method
        card = json.loads((folder / entry["card"]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise DataError(f"model card {where} {str(folder / entry['card'])!r} is damaged "
                        f"(not valid JSON); {_FIX}") from None
    said_silo = card.get("silo", silo)  # only what the card states is compared
    said_label = (card.get("method") or {}).get("label", label)
    if said_silo != silo or said_label != label:
        raise DataError(f"model card {str(folder / entry['card'])!r} describes silo "
                        f"{said_silo!r} (method {said_label!r}), not silo {silo!r} "
                        f"(method {label!r}): files were swapped; {_FIX}")


def load_params(path: Path, what: str) -> np.ndarray:
    """The ``params`` array of a saved ``.npz``; DataError naming `path` if unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return np.array(z["params"])
    except (OSError, ValueError, KeyError, EOFError) as e:
        raise DataError(f"{what} {str(path)!r} is damaged ({type(e).__name__}); "
                        f"{_FIX}") from None
    except Exception as e:  # zipfile.BadZipFile and other reader errors
        raise DataError(f"{what} {str(path)!r} is damaged ({type(e).__name__}); "
                        f"{_FIX}") from None


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return Path(os.path.realpath(a)) == Path(os.path.realpath(b))


def check_out_not_input(out: Path, data: Path, run_dir: Path) -> None:
    """`predict --out` must not be its input table (also via a symlink or another
    spelling of the path), a folder, or a file inside the run directory's models."""
    if _same(Path(out), Path(data)):
        raise ConfigError(f"--out {str(out)!r} is the input table --data {str(data)!r}; "
                          "writing predictions there would destroy the rows being scored. "
                          "Choose another file, e.g. --out predictions.csv")
    if Path(out).is_dir():
        raise ConfigError(f"--out {str(out)!r} is a directory; name a CSV file to write")
    models = Path(os.path.realpath(Path(run_dir) / "models"))
    if models in Path(os.path.realpath(out)).parents:
        raise ConfigError(f"--out {str(out)!r} lies inside the run's saved models "
                          f"({str(models)!r}); write predictions elsewhere")
