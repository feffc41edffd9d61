"""The shared base of every configuration section: a pydantic model that refuses unknown
keys and wrong types, and turns pydantic's errors into one precise `ConfigError`.

Every section (the run's [data] … [tuning], the sweep's [sweep], the silo and server files,
the pandemic track's options) derives from `Section`, so a mistake reads the same
everywhere: which file, which ``section.key``, what was given, what is allowed, and a
"did you mean" when a key is close to a valid one.

Types are strict, as TOML is typed: ``rounds = "10"`` is an error, not 10; an integer is
accepted (and stored as a float) where a float is expected; ``true`` is never a number.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import re
import tomllib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar, dataclass_transform, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from silofl.errors import ConfigError

__all__ = ["Section", "config_error", "did_you_mean", "read_toml", "section_dataclass",
           "validate"]


def did_you_mean(word: str, choices: list[str], prefix: str = "",
                 cutoff: float = 0.5) -> str | None:
    """The valid choice closest to a mistyped `word` (difflib), prefixed; None if none is.

    Parameters
    ----------
    word : what was written.
    choices : the valid names.
    prefix : put before the match, e.g. ``"training."``.
    cutoff : difflib's similarity threshold in [0, 1].

    Returns
    -------
    ``prefix + match`` or None.
    """
    near = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=cutoff)
    return prefix + near[0] if near else None


warnings.filterwarnings(  # `schema` is a key of [data] and [server]; pydantic's deprecated
    # .schema() method, which such a field hides, is not used
    "ignore", message='Field name "schema" in ".*" shadows an attribute', category=UserWarning)


#: how many `Section` constructions are under way in this thread: pydantic builds nested
#: sections through their ``__init__``, and only the outermost turns errors into messages
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("silofl_config_depth", default=0)


class Section(BaseModel):
    """Base of every configuration section: unknown keys and wrong types are refused.

    `section` names the TOML table a class is read from (``"data"``); errors of a section
    validated on its own are reported under it. Constructing a section in Python with bad
    values raises the same `ConfigError` as the TOML file would.
    """

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True,
                              defer_build=True)  # built on first use: cheap imports
    section: ClassVar[str] = ""
    #: said after "missing key 'section.key'": where a complete file comes from
    missing_hint: ClassVar[str] = ""

    def __init__(self, /, **data: Any) -> None:
        token = _DEPTH.set(_DEPTH.get() + 1)
        try:
            super().__init__(**data)
        except ValidationError as e:
            if _DEPTH.get() > 1:  # nested: pydantic merges it into the outer error
                raise
            raise config_error(e, type(self), data, self.section) from None
        finally:
            _DEPTH.reset(token)

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any):
        """Validate a nested dict (e.g. parsed TOML); `ConfigError` on a bad key or value."""
        return validate(cls, obj, cls.section)


#: where a configuration came from: a file's name, or a function of the dotted key at
#: fault (``--set`` items name themselves)
Source = str | Callable[[str], str]


_C = TypeVar("_C")


@dataclass_transform()  # type checkers see the dataclass __init__ the decorator builds
def section_dataclass(section: str, *, frozen: bool = False) -> Callable[[type[_C]], type[_C]]:
    """Make a class a checked dataclass with `Section`'s rules (strict types, no unknown
    keys, `ConfigError` messages), for value objects that code builds and copies with
    `dataclasses.replace` (e.g. the engine's `TrainingConfig`).

    Parameters
    ----------
    section : the dotted name errors are reported under, e.g. ``"training"``.
    frozen : as `dataclasses.dataclass`'s.

    Returns
    -------
    The class decorator.
    """
    def wrap(cls: type[_C]) -> type[_C]:
        out: Any = pydantic_dataclass(  # built now: a deferred build would replace __init__
            cls, frozen=frozen, config=ConfigDict(**{**Section.model_config, "defer_build": False}))
        checked = out.__init__

        def __init__(self: Any, *args: Any, **data: Any) -> None:
            try:
                checked(self, *args, **data)
            except ValidationError as e:
                raise config_error(e, out, data, section) from None
        __init__.__doc__ = checked.__doc__
        out.__init__ = __init__
        out.section = section
        return out
    return wrap


def validate(cls: type[Section], raw: Any, where: str = "", source: Source = ""):
    """Validate `raw` (a dict, e.g. a parsed TOML table) into `cls`.

    Parameters
    ----------
    cls : the section model.
    raw : the table as read.
    where : the dotted name of the table (``"data"``, ``"privacy.silos.A"``); "" for a
        whole file.
    source : the file it came from, named in the message ("" when not from a file), or
        a function of the dotted key at fault that names where it was set.

    Returns
    -------
    The validated model. ConfigError naming the file, the key, what was given and what is
    allowed.
    """
    if not isinstance(raw, dict):
        raise ConfigError(_prefix(source, where) + f"[{where}] must be a table of keys, got "
                          f"{type(raw).__name__}")
    token = _DEPTH.set(_DEPTH.get() + 1)
    try:
        return BaseModel.model_validate.__func__(cls, raw)  # type: ignore[attr-defined]
    except ValidationError as e:
        raise config_error(e, cls, raw, where, source) from None
    except ConfigError as e:  # raised by a validator: name its key's source
        key = re.search(r"'([A-Za-z_][\w.]*)'", str(e))
        pre = _prefix(source, key.group(1) if key else "")
        if pre and not str(e).startswith(pre):
            raise ConfigError(pre + str(e)) from None
        raise
    finally:
        _DEPTH.reset(token)


def _prefix(source: Source, key: str) -> str:
    name = source(key) if callable(source) else source
    return f"{name}: " if name else ""


def _order(loc: tuple, raw: Any) -> tuple:
    """Sort key: where an error's key sits in the input (the first bad key in the file is
    the one reported, as a reader goes through it)."""
    out, node = [], raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            out.append(list(node).index(part))
            node = node[part]
        else:
            out.append(len(node) if isinstance(node, dict) else 0)
            node = None
    return tuple(out)


def _fields(cls: Any) -> dict | None:
    """The pydantic fields of a model or checked dataclass; None for anything else."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return cls.model_fields
    return getattr(cls, "__pydantic_fields__", None) if isinstance(cls, type) else None


def _model_at(cls: Any, loc: tuple) -> tuple[Any, Any]:
    """The model class holding the last part of `loc`, and that field's default."""
    model: Any = cls
    i = 0
    while i < len(loc):
        fields = _fields(model)
        if fields is None:
            return None, None
        field = fields.get(str(loc[i]))
        if i == len(loc) - 1:
            return model, None if field is None or field.is_required() else \
                field.get_default(call_default_factory=True)
        if field is None:
            return None, None
        ann = field.annotation
        args = [a for a in get_args(ann) if _fields(a) is not None]
        if _fields(ann) is not None:
            model = ann
        elif get_origin(ann) is dict and args:
            model, i = args[-1], i + 1  # dict[str, Model]: the next part is a name
        elif args:  # Model | None
            model = args[0]
        else:
            return None, None
        i += 1
    return model, None


_TYPE_NAMES = {"int_type": "int", "float_type": "float", "string_type": "str",
               "bool_type": "bool", "list_type": "list", "dict_type": "dict",
               "int_from_float": "int"}


def config_error(e: ValidationError, cls: type[BaseModel], raw: Any, where: str = "",
                 source: Source = "") -> ConfigError:
    """One `ConfigError` for pydantic's first error (in file order).

    Parameters
    ----------
    e : pydantic's errors.
    cls : the model validated.
    raw : its input.
    where : the dotted table name of `cls` ("" for a whole file).
    source : the file, named in the message.

    Returns
    -------
    The error to raise.
    """
    err = min(e.errors(), key=lambda x: _order(tuple(x["loc"]), raw))
    loc = tuple(str(p) for p in err["loc"])
    full = ".".join(p for p in (where, *loc) if p)
    kind = err["type"]
    pre = _prefix(source, full)
    owner, default = _model_at(cls, loc)
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        table = full.rpartition(".")[0]
        known = list(_fields(owner) or {})
        if not table:  # a whole file's unknown table
            near = did_you_mean(loc[-1], known)
            hint = f"; did you mean [{near}]?" if near else f"; sections: {', '.join(known)}"
            return ConfigError(f"{pre}unknown config section [{loc[-1]}]{hint}")
        near = did_you_mean(loc[-1], known, f"{table}.")
        hint = f"; did you mean '{near}'?" if near else f"; valid keys: {', '.join(known)}"
        return ConfigError(f"{pre}unknown config key '{full}'{hint}")
    if kind == "missing":
        hint = getattr(owner, "missing_hint", "") or getattr(cls, "missing_hint", "")
        ann = (_fields(owner) or {})[loc[-1]].annotation if owner is not None else None
        what = f"section [{full}]" if isinstance(ann, type) and issubclass(ann, BaseModel) \
            else f"key '{full}'"
        return ConfigError(f"{pre}missing {what}" + (f" ({hint})" if hint else ""))
    if kind in ("model_type", "model_attributes_type") or \
            kind == "dict_type" and isinstance(default, BaseModel):
        return ConfigError(f"{pre}[{full}] must be a table of keys, got "
                           f"{type(err['input']).__name__}")
    if kind in ("value_error", "assertion_error"):
        msg = str(err.get("ctx", {}).get("error", err["msg"]))
        return ConfigError(f"{pre}'{full}': {msg}" if full else pre + msg)
    if kind in _TYPE_NAMES or kind == "float_parsing":
        value = err["input"]
        if default is None and _TYPE_NAMES.get(kind) == "float":
            return ConfigError(f"{pre}'{full}' must be a number, got {value!r}")
        type_name = type(default).__name__ if default is not None else _TYPE_NAMES[kind]
        hint = ""
        if type_name == "list" and isinstance(value, str):  # `--set training.methods=local`
            hint = (f"; write a list, e.g. {loc[-1]} = [{json.dumps(value)}] "
                    f"(on the command line: --set '{full}=[{json.dumps(value)}]')")
        like = f" (like {default!r})" if default is not None else ""
        return ConfigError(f"{pre}'{full}' must be of type {type_name}{like}, got "
                           f"{value!r}{hint}")
    if kind == "literal_error":
        return ConfigError(f"{pre}'{full}' must be one of {err['ctx']['expected']}, got "
                           f"{err['input']!r}")
    return ConfigError(f"{pre}'{full}': {err['msg']}, got {err.get('input')!r}")


def read_toml(path: str | Path, what: str) -> dict:
    """Parse a TOML file; a missing or malformed file is a ConfigError naming `what`.

    Parameters
    ----------
    path : the file.
    what : how to name it in a message ("config file", "silo config").

    Returns
    -------
    The parsed tables.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is a directory; pass a .toml file")
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} does not exist; pass an existing .toml file")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as e:
        raise ConfigError(f"cannot read {what} {str(p)!r}: {e}") from None
