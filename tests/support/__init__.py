"""Test-only stand-ins and helpers shared by integration tests."""
