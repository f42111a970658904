"""Deferred construction: ``LazyCall`` records a call, ``instantiate`` performs it.

``LazyCall(SomeClass)(a=1)`` returns an OmegaConf ``DictConfig`` ``{"_target_": "pkg.mod.SomeClass", "a": 1}``.
Targets are stored as import paths (strings), never as objects, so that a config prints, serializes to
``config.yaml`` and loads back unchanged, and so that Hydra-style overrides can edit any argument
(``dataloader_train.batch_size=32``). ``instantiate`` imports the target and calls it, building nested
``LazyCall`` nodes first; extra keyword arguments are passed through as they are (e.g. the attrs model config in
``instantiate(config.model_class, config=config.model)``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

TARGET_KEY = "_target_"


def target_path(target: Callable[..., Any] | str) -> str:
    """Return the import path ``module.QualName`` of a callable (strings are returned unchanged)."""
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not module or not qualname or "<" in qualname:  # <locals>, <lambda>: not importable by path
        raise TypeError(
            f"LazyCall needs an importable target (a module-level class or function), got {target!r}"
        )
    return f"{module}.{qualname}"


def locate(path: str) -> Any:
    """Import ``pkg.module.Attr.Nested`` and return the object; raise ``ImportError`` naming the path."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                raise  # the module exists but one of *its* imports is missing: report that
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError as exc:
            raise ImportError(f"cannot find {path!r}: module {module_name!r} has no {exc.name!r}") from None
        return obj
    raise ImportError(f"cannot import {path!r}: no such module")


class LazyCall:
    """``LazyCall(target)(**kwargs)`` -> a ``DictConfig`` describing the call ``target(**kwargs)``."""

    def __init__(self, target: Callable[..., Any] | str) -> None:
        self._target = target_path(target)

    def __call__(self, **kwargs: Any) -> DictConfig:
        node = {TARGET_KEY: self._target}
        node.update(kwargs)
        return OmegaConf.create(node)


def is_lazy(node: Any) -> bool:
    """True for a mapping with a ``_target_`` key (a LazyCall node)."""
    return isinstance(node, (Mapping, DictConfig)) and TARGET_KEY in node


def _to_plain(node: Any) -> Any:
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _build(node: Any) -> Any:
    """Instantiate nested LazyCall nodes inside plain containers (depth-first)."""
    if is_lazy(node):
        return instantiate(node)
    if isinstance(node, Mapping):
        return {key: _build(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_build(value) for value in node]
    return node


def instantiate(node: Any, /, **overrides: Any) -> Any:
    """Build the object a LazyCall node describes; ``overrides`` replace or add keyword arguments.

    Non-LazyCall values are returned unchanged, so optional components (``None``) pass through.
    """
    if node is None:
        return None
    if not is_lazy(node):
        raise TypeError(f"instantiate expects a LazyCall node (a mapping with '{TARGET_KEY}'), got {type(node)!r}")
    plain = _to_plain(node)
    target = plain.pop(TARGET_KEY)
    factory = locate(target) if isinstance(target, str) else target
    kwargs = {key: _build(value) for key, value in plain.items()}
    kwargs.update(overrides)
    return factory(**kwargs)
