"""``fastgen init``: scaffold a custom experiment config (and optionally a callback and a .env)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from string import Template

import typer

from fastgen.cli.common import DEFAULT_RECIPE, console

EPILOG = """\b
Examples:

\b
  fastgen init my_digits                              # my_digits.py from the digits recipe
  fastgen init configs/toy_run --from Toy/config_sft_toy
  fastgen init my_exp --callback --env                # also a custom callback and a .env
  fastgen init my_lr_sweep --from my_digits.py        # start from a config file of your own
  fastgen train --config=my_digits.py - trainer.max_iter=500
"""


def _template(name: str) -> Template:
    from importlib import resources

    return Template(resources.files("fastgen.templates").joinpath(name).read_text())


def _write_new(path: Path, text: str, force: bool) -> None:
    from fastgen.utils.errors import UsageError
    from fastgen.utils.io import atomic_write_text

    if path.exists() and not force:
        raise UsageError(f"{path} exists already; use --force to overwrite it")
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def init(
    name: str = typer.Argument(..., help="Path of the new config (the .py suffix is added when missing)."),
    from_recipe: str = typer.Option(DEFAULT_RECIPE, "--from", help="What to start from: a built-in recipe name, or any config file (.py, or a run's config.yaml)."),
    callback: bool = typer.Option(False, "--callback", help="Also scaffold a custom callback and register it."),
    env: bool = typer.Option(False, "--env", help="Also write .env from the template (an existing .env is kept unless --force)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Scaffold a custom experiment config from a built-in recipe."""
    from fastgen.configs.config_utils import recipe_hint, resolve_recipe
    from fastgen.utils.errors import UsageError

    if Path(name).is_dir():
        raise UsageError(f"{name} is a folder: name the new config inside it, e.g. {Path(name) / 'my_run'}")
    path = Path(name if name.endswith(".py") else f"{name}.py")
    stem = path.stem
    if not stem.isidentifier():
        raise UsageError(f"{stem!r} is not a valid Python module name (use letters, digits and underscores)")
    from fastgen.configs.config_utils import load_config

    source = Path(from_recipe).expanduser()
    if source.suffix in (".py", ".yaml", ".yml") and source.is_file():  # any config file: load it by path
        if source.resolve() == path.resolve():
            raise UsageError(f"--from {from_recipe} is the file init would write: name the new config differently")
        recipe = source.as_posix()
        relative = os.path.relpath(source.resolve(), path.resolve().parent)
        base_import = (
            "from pathlib import Path\n\n"
            "from fastgen.configs.config_utils import load_config\n\n"
            f"BASE = Path(__file__).resolve().parent / {Path(relative).as_posix()!r}  # the config this one starts from\n\n\n"
            "def base_create_config():\n"
            "    return load_config(BASE)\n"
        )
        batch_size = load_config(str(source)).dataloader_train.batch_size
    else:
        recipe_file = resolve_recipe(from_recipe)
        if recipe_file is None:
            raise UsageError(f"--from {from_recipe}: no built-in recipe or config file of that name; "
                             f"{recipe_hint(from_recipe)}")
        recipe = str(recipe_file.relative_to(recipe_file.parents[1]).with_suffix("")).replace("\\", "/")
        base_import = ("from fastgen.configs.experiments." + recipe.replace("/", ".")
                       + " import create_config as base_create_config\n")
        batch_size = load_config(recipe).dataloader_train.batch_size
    files: list[tuple[Path, str]] = []
    callback_import = callback_registration = ""
    if callback:
        class_name = "".join(part.capitalize() for part in re.split(r"_+", stem) if part) + "Callback"
        callback_path = path.with_name(f"{stem}_callback.py")
        files.append((callback_path, _template("callback.py.tmpl").substitute(name=stem, class_name=class_name)))
        callback_import = (
            "from fastgen.configs.instantiate import LazyCall\n"
            f"from {stem}_callback import {class_name}\n"
        )
        callback_registration = (
            f"    config.trainer.callbacks.update({{\"{stem}\": LazyCall({class_name})(every=100)}})\n"
        )
    files.insert(0, (path, _template("experiment.py.tmpl").substitute(
        name=stem, recipe=recipe, base_import=base_import, config_path=path.as_posix(), batch_size=batch_size,
        callback_import=callback_import, callback_registration=callback_registration,
    )))
    if env:
        if Path(".env").exists() and not force:
            console().print("kept the existing .env (use --force to overwrite it)")
        else:
            files.append((Path(".env"), _template("env.example").template))
    for target, _ in files:  # refuse before writing anything
        if target.exists() and not force:
            raise UsageError(f"{target} exists already; use --force to overwrite it")
    for target, text in files:
        _write_new(target, text, force=True)
        console().print(f"wrote {target}")
    console().print(f"next: fastgen train --config={path.as_posix()} - trainer.max_iter=100")


def register(app: typer.Typer) -> None:
    app.command("init", epilog=EPILOG)(init)
