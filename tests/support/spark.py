"""Spark's JVMs in the tests: started with the client compiler only.

A replay in the suite is a handful of short jobs; on a busy 2-core machine C2
compiling their hot code first costs more than it saves (one local replay:
98-105 s with it, 25-46 s without, measured side by side)."""

from __future__ import annotations

import os

QUICK_JVM = "-XX:TieredStopAtLevel=1"


def quick_jvm_env(**extra: str) -> dict[str, str]:
    """This process's environment, with JAVA_TOOL_OPTIONS set for the Spark JVMs a child starts, and ``extra``."""
    return {**os.environ, "JAVA_TOOL_OPTIONS": QUICK_JVM, **extra}
