"""Repo repair: fix injected bugs in small Python repositories, in a sandbox, graded by their tests."""
