"""Shared pytest configuration for perflab's own tests."""

# Out-of-tree example plugins carry their own test suites, run against the *installed*
# plugin by tests/plugin_kit; they are not collected as part of perflab's suite.
collect_ignore_glob = ["external_plugins/*"]
