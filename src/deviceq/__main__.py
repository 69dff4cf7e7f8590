"""``python -m deviceq``: the ``deviceq`` command."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="deviceq")
