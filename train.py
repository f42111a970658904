"""The seed's entry point: ``python train.py --config=path/to/config.py [--log_level LEVEL] [--dryrun] - key=value``.

Equivalent to ``fastgen train ...``.
"""

import sys

from fastgen.cli.main import main

if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
