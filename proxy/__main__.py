"""The ``kfan`` command's entry point (``python -m proxy`` and the ``kfan`` console script).

It exists apart from :mod:`proxy.cli` for one reason: kio registers
Hypothesis strategies for its types whenever Hypothesis can be imported, and
importing Hypothesis costs about half a second of CPU at every start (measured:
``import proxy.cli`` 1.25-1.52 s of CPU with it, 0.86-1.00 s without). kfan
never generates test data, so the command hides Hypothesis before anything
imports kio. Code that imports :mod:`proxy` as a library (the tests, the
Spark job) is left alone.
"""

import sys
from typing import Any, cast


def main() -> int:
    if "hypothesis" not in sys.modules:  # already imported: someone in this process wants it
        cast(dict[str, Any], sys.modules)["hypothesis"] = None  # import hypothesis now raises ImportError
    from proxy.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
