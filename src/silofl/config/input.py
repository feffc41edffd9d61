"""How a run config is put together from its file and the command line.

* Paths written in a config file (`PATH_KEYS`: data.path, data.schema, budget.store,
  sweep.results) are relative to that file's folder, for every command
  (`resolve_config_paths`); paths given with ``--set`` on the command line are relative
  to the working directory, like any other command-line path, and so is [output] dir.
* ``--set SECTION.KEY=VALUE`` overrides one key (`apply_overrides`): VALUE is read as a
  TOML value (``3``, ``0.5``, ``true``, ``["local", "fedavg"]``, ``'text'``), and as plain
  text when it is not valid TOML.
* `check_writable_file` refuses a file path that cannot be created because a folder
  above it is a regular file (e.g. ``store = "notes.txt/budget.sqlite"``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from silofl.config.base import did_you_mean, read_toml
from silofl.config.run import Config, config_from_dict
from silofl.errors import ConfigError

#: (section, key) of every config key that names a file the job reads or keeps. Not
#: [output] dir: like --out it is where runs are written, relative to the working
#: directory (a run folder's saved config.toml must not move it into the run folder).
PATH_KEYS = (("data", "path"), ("data", "schema"), ("budget", "store"), ("sweep", "results"),
             ("tuning", "proxy_path"), ("privacy", "linkage_key_file"))


def _resolve(root: Path, value: str) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else Path(os.path.normpath(Path(root) / p)))


def resolve_config_paths(raw: dict, root: str | Path) -> dict:
    """Make the non-empty path keys (`PATH_KEYS`) of a raw config absolute, relative to
    `root` (the config file's folder, or the working directory for ``--set``); in place.

    Parameters
    ----------
    raw : the parsed TOML (section -> {key: value}); other keys are left alone.
    root : the folder relative paths are read from.

    Returns
    -------
    The same dict, for chaining.
    """
    for sec, key in PATH_KEYS:
        part = raw.get(sec)
        if isinstance(part, dict) and isinstance(part.get(key), str) and part[key].strip():
            part[key] = _resolve(Path(root), part[key])
    return raw


def check_config_paths(raw: dict) -> dict:
    """Refuse a [budget] store that cannot be created (a folder above it is a regular
    file) when the config is read, before any command opens it; returns `raw`."""
    store = (raw.get("budget") or {}).get("store") if isinstance(raw.get("budget"), dict) \
        else None
    if isinstance(store, str) and store.strip() and not raw["budget"].get("scratch"):
        check_writable_file(store, "[budget] store")
    return raw


def parse_override(item: str) -> tuple[list[str], object]:
    """``"training.rounds=5"`` -> (["training", "rounds"], 5); ConfigError if malformed."""
    key, eq, value = item.partition("=")
    parts = _key_parts(key) if eq else []
    if len(parts) < 2:
        raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. "
                          "training.rounds=5 or privacy.epsilon=0.5 (quote a key with "
                          "spaces or dots: privacy.silos.\"VA Long Beach\".epsilon=0.5)")
    return parts, toml_value(value, value.strip())


def toml_value(text: str, fallback: object) -> object:
    """A `--set` value read as TOML (5, 0.5, true, "a", [1, 2]); `fallback` when `text` is
    not a TOML value (e.g. a bare word)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return fallback


def _key_parts(key: str) -> list[str]:
    """A dotted TOML key as its parts (quoted parts may hold dots and spaces); [] if it
    is not a valid key."""
    try:
        node = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError:
        return []
    parts = []
    while isinstance(node, dict) and len(node) == 1:
        (k, node), = node.items()
        parts.append(k)
    return parts


def _check_key(parts: list[str], item: str, model: type[BaseModel] = Config) -> None:
    sections = model.model_fields
    sec = parts[0]
    if sec not in sections:
        near = did_you_mean(sec, list(sections))
        hint = f" Did you mean {near!r}?" if near else ""
        raise ConfigError(f"--set {item!r}: unknown config section {sec!r}; valid sections: "
                          f"{', '.join(sections)}.{hint}")
    ann = sections[sec].annotation
    keys = list(ann.model_fields) if isinstance(ann, type) and issubclass(ann, BaseModel) \
        else []
    if parts[1] not in keys:
        near = did_you_mean(parts[1], keys, f"{sec}.")
        hint = f" Did you mean {near!r}?" if near else ""
        raise ConfigError(f"--set {item!r}: unknown key '{sec}.{parts[1]}'; valid keys of "
                          f"[{sec}]: {', '.join(keys)}.{hint}")


def apply_overrides(raw: dict, items: list[str] | tuple[str, ...],
                    cwd: str | Path | None = None, model: type[BaseModel] = Config) -> dict:
    """Apply ``--set SECTION.KEY=VALUE`` items to a raw config, in place (later items win).
    Path keys given this way are relative to `cwd` (default: the working directory).

    Parameters
    ----------
    raw : the parsed config (paths already resolved against the config file).
    items : the ``--set`` arguments as typed.
    cwd : the folder relative paths on the command line are read from.
    model : the configuration model whose sections and keys may be set (default: a run's).

    Returns
    -------
    The same dict. ConfigError for a malformed item or an unknown section or key (with the
    valid ones listed).
    """
    for item in items:
        parts, value = parse_override(item)
        _check_key(parts, item, model)
        node = raw
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: {p!r} is a value, not a table")
            node = nxt
        node[parts[-1]] = value
        if len(parts) == 2 and tuple(parts) in PATH_KEYS:
            resolve_config_paths({parts[0]: node}, cwd or Path.cwd())
    return raw


def check_writable_file(path: str | Path, what: str) -> None:
    """Refuse a file path whose folder cannot exist because a part of it is a regular
    file (or that is itself a folder); nothing is created.

    Parameters
    ----------
    path : the file to be created or opened later.
    what : how to name the setting in the message, e.g. "budget store ([budget] store)".
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is a directory; name a file in it "
                          "(e.g. budget.sqlite)")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(
                    f"{what} {str(p)!r} cannot be created: {str(parent)!r} is a regular file, "
                    "not a folder; choose a path inside a folder")
            return


def where_set(path: str | Path | None, items: list[str] | tuple[str, ...],
              what: str = "config file") -> Callable[[str], str]:
    """Name where a dotted key was set: the ``--set`` item that set it (the last one
    wins), else the config file; for error messages.

    Parameters
    ----------
    path : the config file (None: no file).
    items : the ``--set`` arguments.
    what : how to name the file ("config file", "sweep config").

    Returns
    -------
    key -> ``"--set 'training.rounds=x'"`` or ``"config file 'run.toml'"`` ("" when neither).
    """
    given = {}
    for item in items:
        given[".".join(parse_override(item)[0])] = item
    file = "" if path is None else f"{what} {str(path)!r}"

    def source(key: str) -> str:
        hits = [k for k in given if key == k or key.startswith(k + ".")]
        return f"--set {given[hits[-1]]!r}" if hits else file
    return source


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()
                ) -> Config:
    """Read and validate a job's TOML configuration.

    Parameters
    ----------
    path : str, Path or None
        The TOML file (None: all defaults, the built-in heart-disease job). Paths in the
        file are relative to its folder.
    overrides : sequence of str, default ()
        ``SECTION.KEY=VALUE`` items applied on top, as ``--set`` does (their paths
        relative to the working directory).

    Returns
    -------
    Config
        The validated configuration.

    Raises
    ------
    ConfigError
        An unknown key (with the nearest valid one) or an invalid value, naming the file
        or the ``--set`` item and the key.
    """
    raw = {} if path is None else resolve_config_paths(read_toml(path, "config file"),
                                                         Path(path).resolve().parent)
    raw = check_config_paths(apply_overrides(raw, overrides))
    return config_from_dict(raw, where_set(path, overrides))
