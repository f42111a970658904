"""Static checks of a config's LazyCall nodes: what ``fastgen train`` would reject, found without building anything.

``check_lazy_calls(config)`` walks every LazyCall node of the config tree (the method, its networks, optimizers and
schedulers, the data loaders, the callbacks, and the nodes nested in their arguments) and checks, for each one:

* its ``_target_`` imports;
* its keyword arguments fit the target's signature (``inspect.signature(target).bind``), counting the arguments
  the trainer supplies when it builds the node (``params`` for an optimizer, ``optimizer`` for a scheduler, the
  model config for ``model_class``);
* a field whose default is a LazyCall node still is one: ``'model.net_optimizer={lr:0.1}'`` replaces the whole
  node and drops its ``_target_`` - the user almost always meant ``model.net_optimizer.lr=0.1``;
* each callback's target is a ``fastgen`` ``Callback`` class.

Every failure is a ``ConfigError`` (exit code 2) that names the config key. ``validate_config`` runs these checks,
so ``fastgen dryrun`` and ``fastgen train`` refuse the same configs, before a run directory exists.

``check_data_paths(config)`` (run by ``fastgen train`` only: a dry run needs no data) checks that the data loaders'
paths exist - see its docstring.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
from omegaconf import DictConfig, ListConfig, OmegaConf

from fastgen.configs.instantiate import TARGET_KEY, is_lazy, locate
from fastgen.configs.schema import did_you_mean
from fastgen.utils.errors import ConfigError


def _supplied_at_build(path: str) -> set[str]:
    """Keyword arguments the trainer adds when it instantiates the node at ``path``."""
    leaf = path.rsplit(".", 1)[-1]
    if path == "model_class":
        return {"config"}
    if leaf.endswith("_optimizer"):
        return {"params"}
    if leaf.endswith("_scheduler"):
        return {"optimizer"}
    return set()


def _attrs_default(cls: type, name: str) -> Any:
    field = attrs.fields_dict(cls)[name]
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory(None) if default.takes_self else default.factory()  # type: ignore[call-arg]
    return default


def _lazy_fields(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """``(path, value, default)`` for every DictConfig-valued field of the attrs tree (and the callback entries)."""
    for field in attrs.fields(type(node)):
        where = f"{path}.{field.name}" if path else field.name
        value = getattr(node, field.name)
        if attrs.has(type(value)):
            yield from _lazy_fields(value, where)
        elif where == "trainer.callbacks":
            for name, entry in (value or {}).items():
                yield f"{where}.{name}", entry, {TARGET_KEY: "<callback>"}
        elif isinstance(value, (DictConfig, Mapping)) or value is None:
            yield where, value, _attrs_default(type(node), field.name)


def check_lazy_calls(config: Any) -> None:
    """Raise ``ConfigError`` for the first LazyCall node of ``config`` that ``instantiate`` would fail on."""
    for path, value, default in _lazy_fields(config):
        if value is None:
            continue
        if not is_lazy(value):
            if is_lazy(default) or path in ("model.net", "dataloader_train", "dataloader_val"):
                plain = OmegaConf.to_container(value) if isinstance(value, DictConfig) else dict(value)
                shown = ", ".join(f"{k}: {v!r}" for k, v in list(plain.items())[:3])
                hint = f"; to change one argument write {path}.{next(iter(plain))}=..." if plain else ""
                raise ConfigError(f"{path} is {{{shown}}}, not a LazyCall node (it has no _target_){hint}; to "
                                  "replace the whole node, give its _target_ too")
            continue
        if path.startswith("trainer.callbacks."):
            _check_callback_class(path, value)
        _check_node(path, value, _supplied_at_build(path))


def _check_node(path: str, node: Any, supplied: set[str]) -> None:
    plain = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else dict(node)
    target = plain.pop(TARGET_KEY)
    if not isinstance(target, str):
        return  # an object set in Python: nothing to import
    try:
        factory = locate(target)
    except ImportError as exc:
        raise ConfigError(f"{path}._target_: {exc}") from None
    if not callable(factory):
        raise ConfigError(f"{path}._target_: {target} is not callable")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have no signature: nothing to check
        signature = None
    if signature is not None:
        params = signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        if not takes_any:
            for key in plain:
                if key not in params or params[key].kind is inspect.Parameter.POSITIONAL_ONLY:
                    accepted = [n for n, p in params.items()
                                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in supplied]
                    raise ConfigError(f"{path}.{key}: {target} takes no argument {key!r}; "
                                      f"{did_you_mean(str(key), accepted, noun='its arguments')}")
        missing = [n for n, p in params.items()
                   if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                   and n not in plain and n not in supplied]
        if missing:
            raise ConfigError(f"{path}: {target} needs the argument(s) {', '.join(missing)}, which the config does "
                              f"not give (set {path}.{missing[0]}=...)")
    hints = _type_hints(factory)
    for key, value in plain.items():
        expected = hints.get(str(key))
        if isinstance(value, Mapping) and not is_lazy(value) and _wants_an_object(expected):
            raise ConfigError(f"{path}.{key}: {target} expects a {getattr(expected, '__name__', expected)}, but the "
                              f"config gives a mapping with no _target_; to change one argument write "
                              f"{path}.{key}.<argument>=..., to replace the node give its _target_ too")
        _check_nested(f"{path}.{key}", value)


def _type_hints(factory: Any) -> dict[str, Any]:
    """The resolved annotations of ``factory``'s arguments (its ``__init__`` for a class); empty if unresolvable."""
    import typing

    try:
        return typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory)
    except Exception:  # noqa: BLE001 - forward references the module cannot resolve: no hints, no check
        return {}


def _wants_an_object(annotation: Any) -> bool:
    """True for an annotation that is a class other than a mapping type (e.g. ``nn.Module``): a plain mapping
    cannot be it."""
    return (isinstance(annotation, type) and annotation is not object
            and not issubclass(annotation, (Mapping, DictConfig, dict)))


def _check_nested(path: str, value: Any) -> None:
    if is_lazy(value):
        _check_node(path, value, set())
    elif isinstance(value, (Mapping, DictConfig)):
        for key, item in value.items():
            _check_nested(f"{path}.{key}", item)
    elif isinstance(value, (list, tuple, ListConfig)):
        for i, item in enumerate(value):
            _check_nested(f"{path}[{i}]", item)


# The config system sits below the layers it configures and names their classes by dotted path, as every
# ``_target_`` does (docs/architecture.md): it reaches them through ``locate``, never by an import.
CALLBACK_BASE = "fastgen.callbacks.callback.Callback"
PREPARE_HINT = "fastgen.datasets.prepare.prepare_hint"


def _check_callback_class(path: str, node: Any) -> None:
    Callback = locate(CALLBACK_BASE)  # noqa: N806 - a class
    try:
        factory = locate(str(node[TARGET_KEY]))
    except ImportError as exc:
        raise ConfigError(f"{path}._target_: {exc}") from None
    if isinstance(factory, type) and not issubclass(factory, Callback):
        raise ConfigError(f"{path}._target_: {node[TARGET_KEY]} is not a fastgen Callback "
                          "(subclass fastgen.callbacks.callback.Callback)")


# ------------------------------------------------------------------------------------------------ data paths
DATA_LOADER_KEYS = ("dataloader_train", "dataloader_val")


def check_data_paths(config: Any) -> None:
    """Raise ``ConfigError`` (exit 2) for the first data path of the data loaders that does not exist.

    A dataset class lists its path arguments in ``DATA_PATH_ARGUMENTS`` (e.g. ``ImageZipDataset``: ``path``); each
    such argument of a LazyCall node under ``dataloader_train`` / ``dataloader_val`` must name something that
    exists. Values may be one path or a list; a ``TAG:`` prefix (``WDS:/data/shards``) is dropped and URLs
    (``s3://...``) are left to the loader. The message names the config key to override and, when a dataset of
    ``fastgen download-data`` writes that file, the command that prepares it - so a recipe's placeholder path
    fails at start-up, in one line, before a run directory exists. ``fastgen train`` runs this check; ``dryrun``
    lists every such problem as a warning (``data_path_problems``) and goes on (it needs no data).
    """
    problems = data_path_problems(config)
    if problems:
        raise ConfigError(problems[0])


def data_path_problems(config: Any) -> list[str]:
    """Every file ``fastgen train`` would refuse to start without (``check_data_paths``), one line each, in the
    order the checks run (data loaders, then the weight files)."""
    found: list[str] = []
    for key in DATA_LOADER_KEYS:
        node = getattr(config, key, None)
        if node is not None:
            _check_paths_in(key, node, found)
    _check_weight_paths(config, found)
    return found


def _check_weight_paths(config: Any, found: list[str]) -> None:
    """The files a diffusers-backed recipe starts from: ``model.pretrained_model_path`` (the weights folder) and
    the networks' ``prompt_embeddings`` files - a placeholder is one line naming the key, before a 12B model is
    built only to fail on its first read."""
    model = getattr(config, "model", None)
    checkpointer = getattr(getattr(config, "trainer", None), "checkpointer", None)
    for key, owner, field in (("model.teacher_ckpt", model, "teacher_ckpt"),
                              ("model.student_ckpt", model, "student_ckpt"),
                              ("model.stage1_ckpt", model, "stage1_ckpt"),
                              ("trainer.checkpointer.pretrained_ckpt_path", checkpointer, "pretrained_ckpt_path")):
        value = getattr(owner, field, None)
        if not value or "://" in str(value):
            continue  # unset, or a URL (s3://): the reader names it
        location = os.path.expanduser(str(value))
        if field == "student_ckpt" and os.path.isdir(location):
            continue  # a run directory or checkpoints folder: its newest checkpoint (the method resolves it)
        if os.path.isdir(location):
            found.append(f"{key}: {value} is a folder; name the checkpoint file in it (a .pth, e.g. a run's "
                         f"checkpoints/NNNNNNN.pth; for a sharded one its marker .pth), or set {key}=<file>")
        elif not os.path.exists(location):
            found.append(f"{key}: {value} does not exist; set {key}=<checkpoint file>")
    weights = getattr(model, "pretrained_model_path", None)
    if weights and "://" not in str(weights) and not os.path.exists(os.path.expanduser(str(weights))):
        found.append(f"model.pretrained_model_path: {weights} does not exist; download the model's diffusers "
                     "weights there, or set model.pretrained_model_path=<folder>")
    for name in ("net", "teacher", "fake_score"):
        node = getattr(model, name, None)
        backbone = node.get("backbone") if isinstance(node, (Mapping, DictConfig)) else None
        prompts = backbone.get("prompt_embeddings") if isinstance(backbone, (Mapping, DictConfig)) else None
        if prompts and not os.path.isfile(os.path.expanduser(str(prompts))):
            found.append(f"model.{name}.backbone.prompt_embeddings: {prompts} does not exist; write the encoded "
                         f"prompts there (one (num_prompts, tokens, width) tensor), or set it to another file")


def _check_paths_in(path: str, node: Any, found: list[str]) -> None:
    if is_lazy(node):
        target = node[TARGET_KEY]
        try:
            factory = locate(target) if isinstance(target, str) else target
        except ImportError:
            factory = None  # check_lazy_calls reports it
        for argument in getattr(factory, "DATA_PATH_ARGUMENTS", ()):
            if argument in node:
                _check_path_value(f"{path}.{argument}", node[argument], found)
    if isinstance(node, (Mapping, DictConfig)):
        for key, value in node.items():
            if key != TARGET_KEY and isinstance(value, (Mapping, DictConfig)):
                _check_paths_in(f"{path}.{key}", value, found)


def _check_path_value(key: str, value: Any, found: list[str]) -> None:
    from pathlib import Path

    values = list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]
    for item in values:
        if item is None:
            continue
        text = str(item)
        tag, sep, rest = text.partition(":")
        if sep and tag.isupper() and not rest.startswith("//"):
            text = rest  # WDS:/data/shards -> /data/shards
        if "://" in text:
            continue
        location = Path(text).expanduser()
        if location.exists():
            continue
        hint = locate(PREPARE_HINT)(location)
        how = f"prepare it with `{hint}`, or set {key}=<path>" if hint else f"set {key}=<path to your data>"
        found.append(f"{key}: {location} does not exist; {how}")
