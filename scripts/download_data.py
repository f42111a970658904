"""Kept for the seed's ``python scripts/download_data.py DATASET...``: the same as ``fastgen download-data``.

The code lives in ``fastgen.datasets.prepare`` (and the command in ``cli/download_data.py``), so an installed
fastgen prepares data without this repository checkout; see ``fastgen download-data --help``.
"""

import sys

from fastgen.cli.main import main

if __name__ == "__main__":
    main(["download-data", *sys.argv[1:]])
