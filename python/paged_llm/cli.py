"""The ``paged-llm`` console script: the Rust program (``paged-llm serve|run|bench|plan|…``)
run in this interpreter's process, its exit code the process's."""

from __future__ import annotations

import sys

from ._core import cli_main


def main() -> None:
    sys.exit(cli_main(["paged-llm", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
