"""Test helpers for perflab and for plugin authors (registered as a pytest plugin)."""
