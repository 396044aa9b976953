"""`kfan replay DIR --report OUT` with a deliberately broken core (tests only).

    python -m tests.support.broken_replay {drop-partition,double-prefix,swap-responses} DIR --report OUT

Run from the repository root: the Spark job, its exit status and its output
are `kfan replay --report`'s; only the core under test is one of
:data:`tests.support.broken_cores.BROKEN_CORES`.
"""

from __future__ import annotations

import sys

from spark.replay import main as spark_replay
from tests.support.broken_cores import BROKEN_CORES


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in BROKEN_CORES:
        raise SystemExit(f"usage: python -m tests.support.broken_replay {{{','.join(BROKEN_CORES)}}} DIR --report OUT")
    return spark_replay(args[1:], core=BROKEN_CORES[args[0]])


if __name__ == "__main__":
    sys.exit(main())
