"""Test-only stand-ins and helpers shared by the tests; test modules import from here, never from each other."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
