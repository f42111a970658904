"""Strict config classes: the machinery shared by every config node.

``StrictConfig`` subclasses are attrs classes with slots: assigning a field that does not exist raises
``AttributeError`` naming the closest valid fields, instead of silently creating a new attribute. Every mutable
default comes from a factory, so two configs never share a list or dict.

``coerce`` checks a value against a field's annotated type (and makes the harmless conversions a command line
needs: ``1e4`` to ``10000`` for an int, ``3`` to ``3.0`` for a float, a dict to a nested config class). It is
what makes ``trainer.max_iter=abc`` fail with the field's name and expected type.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

import attrs
from omegaconf import DictConfig, ListConfig, OmegaConf

from fastgen.utils.errors import ConfigError


def closest(name: str, candidates: typing.Iterable[str], n: int = 3) -> list[str]:
    """Names among ``candidates`` that look like ``name`` (for 'did you mean' hints)."""
    candidates = list(candidates)
    found = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    if not found:
        lower = name.lower()
        found = [c for c in candidates if lower in c.lower() or c.lower() in lower][:n]
    return found


def did_you_mean(name: str, candidates: typing.Iterable[str], noun: str = "valid keys") -> str:
    """``did you mean 'x' or 'y'?`` when something is close, else the list of ``noun``."""
    candidates = sorted(candidates)
    near = closest(name, candidates)
    if near:
        return "did you mean " + " or ".join(repr(c) for c in near) + "?"
    return f"{noun}: " + ", ".join(candidates[:25]) + (" ..." if len(candidates) > 25 else "")


class StrictConfig:
    """Mixin for attrs config classes: unknown attributes are errors with suggestions."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        fields = attrs.fields_dict(type(self))
        if name not in fields:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}; {did_you_mean(name, fields)}"
            )
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup failed, i.e. for a misspelled field.
        if name.startswith("__"):
            raise AttributeError(name)
        fields = attrs.fields_dict(type(self))
        raise AttributeError(f"{type(self).__name__} has no field {name!r}; {did_you_mean(name, fields)}")


def config_class(cls: type) -> type:
    """Decorator: a strict, slotted, keyword-only attrs class (``@config_class`` on every config node)."""
    if not issubclass(cls, StrictConfig):
        raise TypeError(f"{cls.__name__} must inherit from StrictConfig (or another config class)")
    return attrs.define(cls, slots=True, kw_only=True, eq=True)


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type annotations of an attrs class's fields (cached by attrs after the first call)."""
    attrs.resolve_types(cls)
    return {f.name: f.type for f in attrs.fields(cls)}


def type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("omegaconf.dictconfig.", "")


class CoercionError(ValueError):
    """Raised by ``coerce``; the caller adds the field path."""


def coerce(value: Any, tp: Any) -> Any:
    """Return ``value`` checked against (and minimally converted to) the annotated type ``tp``."""
    if tp is Any or tp is None:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise CoercionError(f"expected {type_name(tp)}, got null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg)
            except CoercionError as exc:
                errors.append(str(exc))
        raise CoercionError(f"expected {type_name(tp)}, got {value!r}")
    if value is None:
        raise CoercionError(f"expected {type_name(tp)}, got null (this field is not optional)")
    if origin is typing.Literal:
        if value in args:
            return value
        raise CoercionError(f"expected one of {', '.join(repr(a) for a in args)}, got {value!r}")
    if origin in (list, tuple) or tp in (list, tuple):
        if isinstance(value, (ListConfig,)):
            value = OmegaConf.to_container(value, resolve=True)
        if not isinstance(value, (list, tuple)):
            raise CoercionError(f"expected a list, got {value!r}")
        item_type = args[0] if args else Any
        return [coerce(v, item_type) for v in value]
    if tp in (dict, DictConfig) or origin is dict:
        plain_values = origin is dict and len(args) == 2 and (args[1] in (int, float, str, bool)
                                                              or typing.get_origin(args[1]) is list)
        if isinstance(value, DictConfig) and plain_values:  # a mapping of numbers, strings or lists: check each value
            value = OmegaConf.to_container(value, resolve=True)
        if isinstance(value, DictConfig):
            return value
        if isinstance(value, Mapping):
            if plain_values:
                value = {str(key): coerce(item, args[1]) for key, item in value.items()}
            return OmegaConf.create(dict(value))
        raise CoercionError(f"expected a mapping, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise CoercionError(f"expected bool (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise CoercionError(f"expected int, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise CoercionError(f"expected int, got {value!r}")
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CoercionError(f"expected float, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool) or isinstance(value, (list, tuple, Mapping, ListConfig, DictConfig)):
            raise CoercionError(f"expected str, got {value!r}")
        return value if isinstance(value, str) else str(value)
    if attrs.has(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, (Mapping, DictConfig)):
            return build_from_mapping(tp, value)
        raise CoercionError(f"expected {type_name(tp)} (a mapping), got {value!r}")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise CoercionError(f"expected {type_name(tp)}, got {value!r}")
    return value


CLASS_KEY = "_class_"


def build_from_mapping(cls: type, data: Mapping[str, Any] | DictConfig, path: str = "") -> Any:
    """Build the attrs config ``cls`` (or the subclass named by ``_class_``) from a mapping, strictly."""
    from fastgen.configs.instantiate import locate

    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data, resolve=True)  # type: ignore[assignment]
    data = dict(data)
    class_path = data.pop(CLASS_KEY, None)
    if class_path is not None:
        try:
            named = locate(class_path)
        except ImportError as exc:
            raise ConfigError(f"{path or 'config'}: {exc}") from None
        if not (isinstance(named, type) and issubclass(named, cls)):
            raise ConfigError(f"{path or 'config'}: {class_path} is not a {cls.__name__}")
        cls = named
    types_by_field = field_types(cls)
    unknown = [key for key in data if key not in types_by_field]
    if unknown:
        key = unknown[0]
        where = f"{path}.{key}" if path else key
        raise ConfigError(f"unknown key {where!r}; {did_you_mean(key, types_by_field)}")
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else key
        tp = types_by_field[key]
        try:
            if attrs.has(tp) and isinstance(value, Mapping):
                kwargs[key] = build_from_mapping(tp, value, where)
            else:
                kwargs[key] = coerce(value, tp)
        except CoercionError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return cls(**kwargs)


def to_plain(node: Any, declared: Any = None) -> Any:
    """Convert a config tree to plain dicts/lists/scalars; attrs nodes record ``_class_`` when it is not
    the declared type (so a method config subclass loads back as itself)."""
    if attrs.has(type(node)):
        out: dict[str, Any] = {}
        if declared is None or type(node) is not declared:
            out[CLASS_KEY] = f"{type(node).__module__}.{type(node).__qualname__}"
        declared_types = field_types(type(node))
        for f in attrs.fields(type(node)):
            out[f.name] = to_plain(getattr(node, f.name), declared_types[f.name])
        return out
    if isinstance(node, (DictConfig, ListConfig)):
        # Unresolved: a ${...} interpolation is kept as written (it resolves when the node is instantiated).
        return OmegaConf.to_container(node, resolve=False)
    if isinstance(node, Mapping):
        return {k: to_plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [to_plain(v) for v in node]
    return node


def validate_tree(node: Any, path: str = "") -> None:
    """Check every field of an attrs config tree against its annotation (catches wrong types set in Python)."""
    for name, tp in field_types(type(node)).items():
        where = f"{path}.{name}" if path else name
        value = getattr(node, name)
        if attrs.has(type(value)):
            validate_tree(value, where)
            continue
        try:
            coerced = coerce(value, tp)
        except CoercionError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if coerced is not value and not isinstance(value, (list, tuple)):
            object.__setattr__(node, name, coerced)
