"""Load, override, validate and serialize configs.

* ``load_config(spec)`` - ``spec`` is a ``.py`` file defining ``create_config()`` (relative, ``./``-prefixed or
  absolute, from any working directory), a run's ``config.yaml``, or a built-in recipe name such as
  ``Digits/config_sft_digits``.
* ``apply_overrides(config, ["trainer.max_iter=10", ...])`` - Hydra's grammar: ``key=value`` changes a key the
  config defines, ``+key=value`` adds one it does not, ``++key=value`` does either, ``key=null`` sets ``None``,
  ``~key`` (or ``~key=value``) deletes a key of a dict node. An unknown key fails with the closest valid names,
  a wrong type names the field and its expected type. Fields of the attrs classes cannot be added or deleted
  (the schema is strict); keys inside dict nodes (LazyCall arguments, ``trainer.callbacks``) can.
  To *replace* a whole dict rather than merge into it, assign it: ``trainer.callbacks={}`` then ``+...``.
* ``config_to_yaml`` / ``load_config("…/config.yaml")`` - a round trip that gives an equal config: typed values,
  targets as import paths, the config classes recorded in ``_class_`` where they differ from the schema.
  Secrets are redacted (see ``redact``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import attrs
from omegaconf import DictConfig, ListConfig, OmegaConf

from fastgen.configs.config import BaseConfig
from fastgen.configs.schema import (
    CoercionError,
    build_from_mapping,
    coerce,
    did_you_mean,
    field_types,
    to_plain,
    validate_tree,
)
from fastgen.utils.errors import ConfigError, FastGenError, first_line
from fastgen.utils import secrets as secrets_rule
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

EXPERIMENTS_PACKAGE = "fastgen.configs.experiments"
REDACTED = secrets_rule.REDACTED  # the marker config.yaml holds where a secret was


# --------------------------------------------------------------------------------------------------- loading
def experiments_root() -> Path:
    return Path(importlib.import_module(EXPERIMENTS_PACKAGE).__file__).parent  # type: ignore[arg-type]


def list_recipes() -> list[str]:
    """Built-in recipe names, e.g. ``Digits/config_sft_digits``."""
    root = experiments_root()
    return sorted(
        str(p.relative_to(root).with_suffix("")).replace(os.sep, "/")
        for p in root.rglob("config_*.py")
    )


def recipe_hint(name: str) -> str:
    """``did you mean ...?`` when a built-in recipe name is close to ``name``, else the recipe groups (the recipes
    are too many to list in one line) with the quick-start recipe as the example of the name form."""
    recipes = list_recipes()
    near = did_you_mean(name, recipes, noun="built-in recipes")
    if near.startswith("did you mean"):
        return near
    groups = sorted({recipe.split("/")[0] + "/" for recipe in recipes if "/" in recipe})
    example = "Digits/config_sft_digits" if "Digits/config_sft_digits" in recipes else recipes[0]
    return f"the {len(recipes)} built-in recipes are GROUP/config_NAME (e.g. {example}) in {', '.join(groups)}"


def resolve_recipe(name: str) -> Path | None:
    """Map a recipe name (``Digits/config_sft_digits``, ``Digits.config_sft_digits`` or a unique
    ``config_sft_digits``) to its file, or ``None``."""
    key = name.removesuffix(".py").replace(".", "/").strip("/")
    recipes = list_recipes()
    if key in recipes:
        return experiments_root() / f"{key}.py"
    matches = [r for r in recipes if r.split("/")[-1] == key or r.split("/")[-1] == f"config_{key}"]
    if len(matches) == 1:
        return experiments_root() / f"{matches[0]}.py"
    if len(matches) > 1:
        raise ConfigError(f"recipe name {name!r} is ambiguous: {', '.join(matches)}")
    return None


def _module_name_for(path: Path) -> str | None:
    """The dotted module name under which ``path`` is importable from the working directory, if any."""
    try:
        rel = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        rel = None
    if rel is not None and all(part.isidentifier() for part in rel.with_suffix("").parts):
        return ".".join(rel.with_suffix("").parts)
    # Built-in recipes are importable by their package path wherever the command runs.
    pkg_root = Path(importlib.import_module("fastgen").__file__).parent.parent  # type: ignore[arg-type]
    try:
        rel = path.resolve().relative_to(pkg_root.resolve())
    except ValueError:
        return None
    parts = rel.with_suffix("").parts
    if parts and parts[0] == "fastgen" and all(p.isidentifier() for p in parts):
        return ".".join(parts)
    return None


def _fresh(module: Any, path: Path) -> bool:
    """True when ``module`` was imported from ``path`` as it is now (an edited file is imported again)."""
    return getattr(module, "__fastgen_mtime__", None) == path.stat().st_mtime_ns


def _import_config_module(path: Path) -> Any:
    """Import a config file as a module. Under the working directory it gets its dotted path as its name (so
    classes defined in it have importable targets, and the seed's ``--config=fastgen/configs/...`` imports the
    real recipe module); elsewhere a stable synthetic name."""
    name = _module_name_for(path)
    if name is not None:
        cwd = str(Path.cwd())
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(name)
            if Path(module.__file__ or "").resolve() == path.resolve():
                if hasattr(module, "__fastgen_mtime__") and not _fresh(module, path):
                    module = importlib.reload(module)
                module.__fastgen_mtime__ = path.stat().st_mtime_ns
                return module
        except ImportError:
            pass
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    name = f"fastgen_user_config_{path.stem}_{digest}"
    if name in sys.modules and _fresh(sys.modules[name], path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import config file {path}")
    module = importlib.util.module_from_spec(spec)
    module.__fastgen_mtime__ = path.stat().st_mtime_ns  # type: ignore[attr-defined]
    sys.modules[name] = module
    # A config beside helper modules (``from my_helpers import ...``) imports them from its own folder.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(path.parent))
    return module


def _config_from_python(path: Path) -> BaseConfig:
    try:
        module = _import_config_module(path)
    except ConfigError:
        raise
    except SyntaxError as exc:
        raise ConfigError(f"config file {path} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except ImportError as exc:
        raise ConfigError(f"config file {path} failed to import: {exc}") from None
    create = getattr(module, "create_config", None)
    if not callable(create):
        raise ConfigError(f"config file {path} does not define create_config()")
    logger.debug("config: create_config() of %s (module %s)", path.resolve(), module.__name__)
    try:
        config = create()
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's config code: name where it failed, in one line
        raise ConfigError(f"create_config() in {path} raised {type(exc).__name__}{_where_in(exc, path)}: "
                          f"{first_line(exc)}") from None
    if not isinstance(config, BaseConfig):
        raise ConfigError(
            f"create_config() in {path} returned {type(config).__name__}, expected a BaseConfig"
        )
    if config.log_config.name is None:
        config.log_config.name = path.stem
    _record_import_paths(config, path)
    return config


def _record_import_paths(config: BaseConfig, path: Path) -> None:
    """A config file from outside the fastgen package may name modules beside it or under the working directory it
    was loaded from (``_import_config_module`` puts both on ``sys.path``): record those folders in
    ``import_paths`` so that the run's ``config.yaml`` finds the modules again from anywhere."""
    package_root = Path(__file__).resolve().parents[1]
    if path.resolve().is_relative_to(package_root):
        return
    for folder in (str(path.resolve().parent), str(Path.cwd())):
        if folder not in config.import_paths:
            config.import_paths.append(folder)


def use_import_paths(folders: Iterable[str]) -> None:
    """Put ``folders`` (a config's ``import_paths``) at the front of ``sys.path``, keeping their order."""
    for folder in reversed([str(f) for f in folders]):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def _where_in(exc: BaseException, path: Path) -> str:
    """`` at line N`` of the innermost traceback frame that is in ``path`` (empty if none is)."""
    import traceback

    target = str(path.resolve())
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if str(Path(f.filename).resolve()) == target]
    return f" at line {lines[-1]}" if lines else ""


def config_from_yaml(path: Path) -> BaseConfig:
    """Load a ``config.yaml`` written by ``config_to_yaml`` (e.g. a run's ``config.yaml``)."""
    logger.debug("config: %s", path.resolve())
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as exc:  # omegaconf/yaml raise several types for malformed files
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise ConfigError(f"cannot parse {path}{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a config mapping")
    paths = data.get("import_paths") or []
    if isinstance(paths, list):
        use_import_paths(paths)  # before any LazyCall target of the file is looked up
    return build_from_mapping(BaseConfig, data)


def load_config(spec: str | os.PathLike[str]) -> BaseConfig:
    """Load a config from a ``.py`` file, a ``config.yaml`` or a built-in recipe name."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.is_dir() and resolve_recipe(text) is None:
        inside = path / "config.yaml"
        hint = f"this run's config is {inside}" if inside.is_file() else "give a config .py file, a run's config.yaml or a recipe name"
        raise ConfigError(f"config {text} is a folder: {hint}")
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"config file not found: {text}")
        return config_from_yaml(path)
    if path.suffix == ".py" or os.sep in text or path.exists():
        if path.is_file():
            return _config_from_python(path)
        recipe = resolve_recipe(text) if path.suffix != ".py" or not path.is_absolute() else None
        if recipe is None:
            recipe = _recipe_from_package_path(text)
        if recipe is not None:
            return _config_from_python(recipe)
        hint = ""
        if path.suffix != ".py":
            hint = "; " + recipe_hint(text)
        raise ConfigError(f"config file not found: {text}{hint}")
    recipe = resolve_recipe(text)
    if recipe is None:
        raise ConfigError(
            f"no config file or built-in recipe named {text!r}; {recipe_hint(text)}"
        )
    return _config_from_python(recipe)


def _recipe_from_package_path(text: str) -> Path | None:
    """``fastgen/configs/experiments/X/config_y.py`` names a built-in recipe from any working directory."""
    marker = "fastgen/configs/experiments/"
    norm = text.replace(os.sep, "/")
    if marker in norm:
        return resolve_recipe(norm.split(marker, 1)[1])
    return None


# ------------------------------------------------------------------------------------------------- overrides
def strip_separator(args: Iterable[str]) -> list[str]:
    """Drop the seed's lone ``-`` separator (``--config=f.py - key=value``); it is accepted, not required."""
    return [a for a in args if a != "-"]


def _parse(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except OverrideParseException as exc:
            message = str(exc).splitlines()[0]
            raise ConfigError(f"cannot parse override {text!r}: {message}") from None
    return parsed


def _children(node: Any) -> list[str]:
    if attrs.has(type(node)):
        return [f.name for f in attrs.fields(type(node))]
    if isinstance(node, (DictConfig, Mapping)):
        return [str(k) for k in node.keys()]
    return []


def _family(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple, ListConfig)):
        return "list"
    if isinstance(value, (Mapping, DictConfig)):
        return "dict"
    return type(value).__name__


def _set_in_dict(node: MutableMapping[str, Any] | DictConfig, key: str, value: Any, where: str) -> None:
    """Set a key of a dict node; the current value's type is the schema (ints stay ints: ``1e4`` -> 10000)."""
    old = node[key] if key in node else None
    if old is not None and value is not None:
        old_family, new_family = _family(old), _family(value)
        if old_family != new_family and old_family != "str":
            raise ConfigError(
                f"{where}: expected {old_family} like the current value {old!r}, got {value!r}"
            )
        if isinstance(old, int) and not isinstance(old, bool) and isinstance(value, float):
            if not value.is_integer():
                raise ConfigError(f"{where}: expected int like the current value {old!r}, got {value!r}")
            value = int(value)
    if isinstance(node, DictConfig):
        with _open_struct(node):
            node[key] = value
    else:
        node[key] = value


class _open_struct:
    def __init__(self, node: DictConfig) -> None:
        self.node = node

    def __enter__(self) -> None:
        self.flag = self.node._get_node_flag("struct")  # noqa: SLF001 - omegaconf's public flag API is per key
        OmegaConf.set_struct(self.node, False)

    def __exit__(self, *exc: object) -> None:
        OmegaConf.set_struct(self.node, self.flag)


def _apply_one(config: BaseConfig, override: Any, raw: str) -> None:
    key: str = override.key_or_group
    if override.package is not None:
        raise ConfigError(f"override {raw!r}: package syntax '@' is not supported")
    parts = key.split(".")
    node: Any = config
    walked: list[str] = []
    for i, part in enumerate(parts[:-1]):
        walked.append(part)
        where = ".".join(walked)
        if attrs.has(type(node)):
            if part not in attrs.fields_dict(type(node)):
                raise ConfigError(f"unknown key {where!r}; {did_you_mean(part, _children(node))}")
            child = getattr(node, part)
        elif isinstance(node, (DictConfig, Mapping)):
            if part not in node:
                if override.is_add() or override.is_force_add():
                    node[part] = OmegaConf.create({}) if isinstance(node, DictConfig) else {}
                else:
                    raise ConfigError(f"unknown key {where!r}; {did_you_mean(part, _children(node))}")
            child = node[part]
        else:
            raise ConfigError(f"cannot set {key!r}: {'.'.join(walked[:-1]) or 'config'} is not a config node")
        if child is None:
            raise ConfigError(
                f"cannot set {key!r}: {where} is null; set the whole node first, e.g. {where}={{...}}"
            )
        node = child
    leaf = parts[-1]
    value = override.value()
    has_value = "=" in raw
    if isinstance(value, (dict, list)):
        value = _plain_value(value)

    if attrs.has(type(node)):
        fields = field_types(type(node))
        if leaf not in fields:
            if override.is_add():
                raise ConfigError(
                    f"cannot add {key!r}: {type(node).__name__} is a strict config class and has no such field; "
                    f"{did_you_mean(leaf, fields)}"
                )
            raise ConfigError(f"unknown key {key!r}; {did_you_mean(leaf, fields)}")
        if override.is_delete():
            raise ConfigError(f"cannot delete {key!r}: it is a field of {type(node).__name__}; set {key}=null instead")
        if override.is_add():
            raise ConfigError(f"cannot add {key!r}: it already exists; use {key}=... or ++{key}=...")
        try:
            setattr(node, leaf, coerce(value, fields[leaf]))
        except CoercionError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        return

    if not isinstance(node, (DictConfig, MutableMapping)):
        raise ConfigError(f"cannot set {key!r}: its parent is not a config node")
    exists = leaf in node
    if override.is_delete():
        if not exists:
            raise ConfigError(f"cannot delete {key!r}: no such key; {did_you_mean(leaf, _children(node))}")
        if has_value and node[leaf] != value:
            raise ConfigError(f"cannot delete {key!r}: its value is {node[leaf]!r}, not {value!r}")
        del node[leaf]
        return
    if override.is_add() and exists:
        raise ConfigError(f"cannot add {key!r}: it already exists; use {key}=... or ++{key}=...")
    if not exists and not (override.is_add() or override.is_force_add()):
        raise ConfigError(
            f"unknown key {key!r}; {did_you_mean(leaf, _children(node))} (use +{key}=... to add a new key)"
        )
    _set_in_dict(node, leaf, value, key)


def _plain_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_value(v) for v in value]
    return value


def apply_overrides(config: BaseConfig, overrides: Iterable[str]) -> BaseConfig:
    """Apply Hydra-grammar overrides in order (in place) and return the config."""
    raw = strip_separator(overrides)
    for text in raw:
        if text.startswith("-"):
            raise ConfigError(f"unexpected option {text!r} among the overrides")
    for text, parsed in zip(raw, _parse(raw)):
        _apply_one(config, parsed, text)
        logger.debug("override %s", text)
    return config


# --------------------------------------------------------------------------------------------- validation
def validate_config(config: BaseConfig) -> BaseConfig:
    """Check types everywhere and the cross-field rules a run depends on; raise ``ConfigError``."""
    if not isinstance(config, BaseConfig):
        raise ConfigError(f"expected a BaseConfig, got {type(config).__name__}")
    validate_tree(config)
    t = config.trainer
    for name in ("max_iter", "logging_iter", "save_ckpt_iter", "max_val_iter"):
        if getattr(t, name) < (0 if name == "max_iter" else 1):
            raise ConfigError(f"trainer.{name} must be positive, got {getattr(t, name)}")
    if t.validation_iter is not None and t.validation_iter < 1:
        raise ConfigError(f"trainer.validation_iter must be positive or null, got {t.validation_iter}")
    if t.batch_size_global is not None and t.batch_size_global < 1:
        raise ConfigError(f"trainer.batch_size_global must be positive or null, got {t.batch_size_global}")
    if config.model.net is None:
        raise ConfigError("model.net is not set: the config must say which network to train")
    if config.dataloader_train is None:
        raise ConfigError("dataloader_train is not set")
    for name, node in (t.callbacks or {}).items():
        if not (isinstance(node, (DictConfig, Mapping)) and "_target_" in node):
            raise ConfigError(f"trainer.callbacks.{name} is not a LazyCall node (it needs a _target_)")
    if config.log_config.name is not None and ("/" in config.log_config.name or config.log_config.name in ("", ".", "..")):
        raise ConfigError(f"log_config.name must be a plain folder name, got {config.log_config.name!r}")
    _check_pretrained_model_path(config)
    if t.ddp and t.fsdp:
        raise ConfigError("trainer.ddp and trainer.fsdp are both set: choose one (ddp replicates the networks, fsdp "
                          "shards them)")
    if t.dist_timeout_s < 1:
        raise ConfigError(f"trainer.dist_timeout_s must be positive, got {t.dist_timeout_s}")
    if t.fsdp_shard_size is not None and t.fsdp_shard_size < 1:
        raise ConfigError(f"trainer.fsdp_shard_size must be positive or null, got {t.fsdp_shard_size}")
    m = config.model
    from fastgen.configs.config import COMPILE_MODES

    if m.torch_compile_mode is not None and m.torch_compile_mode not in COMPILE_MODES:
        raise ConfigError(f"model.torch_compile_mode={m.torch_compile_mode!r}: expected null (eager) or one of "
                          f"{', '.join(COMPILE_MODES)}")
    if m.precision_amp is not None and m.precision != "float32":
        raise ConfigError(f"model.precision_amp={m.precision_amp} computes in {m.precision_amp} from float32 weights: "
                          f"set model.precision=float32 (it is {m.precision})")
    from fastgen.configs.checks import check_lazy_calls

    use_import_paths(config.import_paths)  # an override may have added one
    check_lazy_calls(config)
    _check_url_values(config_to_dict(config, redact_secrets=False))
    return config


def _check_url_values(node: Any, key: str = "") -> None:
    """Every string of the config that is almost an S3 URL (``s3:/bucket/key``) is refused, naming its key."""
    from fastgen.utils.io import check_url_form

    if isinstance(node, dict):
        for k, v in node.items():
            _check_url_values(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for v in node:
            _check_url_values(v, key)
    elif isinstance(node, str):
        try:
            check_url_form(node, key)
        except FastGenError as exc:
            raise ConfigError(str(exc)) from None


# the modules of diffusers-backed backbones (``fastgen.networks.diffusers_nets.BACKBONE_MODULES``)
DIFFUSERS_BACKBONES = ("fastgen.networks.diffusers_nets.", "fastgen.networks.causal_wan.", "fastgen.networks.ltx2.",
                       "fastgen.networks.cosmos3.", "fastgen.networks.cosmos_predict2.",
                       "fastgen.networks.cosmos_predict25.")


def _check_pretrained_model_path(config: BaseConfig) -> None:
    """``model.pretrained_model_path`` is a diffusers weights folder: only diffusers-backed networks read it, and a
    distillation takes its teacher from it or from ``model.teacher_ckpt``, not both."""
    m = config.model
    if not m.pretrained_model_path:
        return
    backbone = (m.net or {}).get("backbone") if isinstance(m.net, (DictConfig, Mapping)) else None
    target = str(backbone.get("_target_", "")) if isinstance(backbone, (DictConfig, Mapping)) else ""
    if not target.startswith(DIFFUSERS_BACKBONES):
        raise ConfigError("model.pretrained_model_path is read by diffusers-backed networks only "
                          "(fastgen.configs.net_diffusers); this model.net starts from "
                          "trainer.checkpointer.pretrained_ckpt_path or a distillation method's model.teacher_ckpt")
    if getattr(m, "teacher_ckpt", None):
        raise ConfigError("model.pretrained_model_path and model.teacher_ckpt both name the teacher's weights: "
                          "set one of them")


# ------------------------------------------------------------------------------------------- serialization
def redact(node: Any, secrets: set[str] | None = None, key: str = "") -> Any:
    """Replace secrets in a plain tree by rule (``fastgen.utils.secrets``): any string under a key that names a
    secret (``api_key``, ``accessToken``, ``private_key``...), and inside any string the values of the environment
    variables that name secrets (``HF_TOKEN``, ``*_KEY``...) and URL passwords (``user:password@host``)."""
    secrets = secrets_rule.secret_values() if secrets is None else secrets
    if isinstance(node, dict):
        return {k: redact(v, secrets, str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact(v, secrets, key) for v in node]
    if isinstance(node, str) and node:
        return REDACTED if secrets_rule.is_secret_name(key) else secrets_rule.redact_text(node, secrets)
    return node


def config_to_dict(config: BaseConfig, redact_secrets: bool = True) -> dict[str, Any]:
    plain = to_plain(config)
    return redact(plain) if redact_secrets else plain


def config_to_yaml(config: BaseConfig, redact_secrets: bool = True) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(config_to_dict(config, redact_secrets)))


def save_config_yaml(config: BaseConfig, path: str | os.PathLike[str]) -> None:
    """Write ``config.yaml`` atomically (temp file + rename), secrets redacted."""
    from fastgen.utils.io import atomic_write_text

    atomic_write_text(Path(path), config_to_yaml(config))
