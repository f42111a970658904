"""``fastgen env``: versions, devices, resolved paths and which credentials were found (never their values)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from fastgen.cli.common import out

EPILOG = """\b
Examples:

\b
  fastgen env
  fastgen env --json                          # machine-readable
  fastgen env --credentials-dir /secrets/fastgen
"""


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def collect(credentials_dir: str) -> dict[str, dict[str, str]]:
    import platform

    import torch

    from fastgen import __version__
    from fastgen.utils.env import data_root, describe_credentials, load_credentials, output_root

    load_credentials(credentials_dir)
    versions = {
        "fastgen": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "wandb": _version("wandb"),
        "omegaconf": _version("omegaconf"),
        "hydra-core": _version("hydra-core"),
        "platform": platform.platform(),
    }
    devices = {"cuda": "available" if torch.cuda.is_available() else "not available",
               "cpu threads": str(torch.get_num_threads())}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            devices[f"cuda:{i}"] = torch.cuda.get_device_name(i)
    paths = {
        "working directory": str(Path.cwd()),
        ".env": str(Path(".env").resolve()) + (" (loaded)" if Path(".env").is_file() else " (none)"),
        "FASTGEN_OUTPUT_ROOT": str(output_root().resolve()),
        "DATA_ROOT_DIR": str(Path(data_root()).resolve()) + ("" if os.environ.get("DATA_ROOT_DIR") else " (default)"),
        "CKPT_ROOT_DIR": os.environ.get("CKPT_ROOT_DIR", "(not set)"),
        "credentials_dir": str(Path(credentials_dir).resolve()) + ("" if Path(credentials_dir).is_dir() else " (missing)"),
    }
    credentials = {k: v for k, v in describe_credentials().items() if k not in ("FASTGEN_OUTPUT_ROOT", "DATA_ROOT_DIR", "CKPT_ROOT_DIR")}
    return {"versions": versions, "devices": devices, "paths": paths, "credentials": credentials}


def env(
    credentials_dir: str = typer.Option("./credentials/", "--credentials-dir", help="Folder of credential files to check."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Show versions, devices, resolved paths and which credentials are set (values are never shown)."""
    report = collect(credentials_dir)
    console = out()
    if as_json:
        import json

        console.print_json(json.dumps(report))
        return
    from rich.table import Table

    for section, rows in report.items():
        table = Table(title=section, show_header=False, show_edge=False, title_justify="left")
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in rows.items():
            table.add_row(key, value)
        console.print(table)
        console.print()


def register(app: typer.Typer) -> None:
    app.command("env", epilog=EPILOG)(env)
