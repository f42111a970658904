"""``python -m fastgen ...`` (and ``torchrun -m fastgen train ...``): the ``fastgen`` command."""

from fastgen.cli.main import main

if __name__ == "__main__":
    main()
