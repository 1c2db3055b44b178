"""A system tool a test needs: skipped on a machine without it, a failure in CI (CI=true),
where scripts/setup.sh installs it."""

from __future__ import annotations

import os
import shutil

import pytest


def need_tool(name: str, installed_by: str) -> str:
    """The path of the executable ``name``; ``installed_by`` says what installs it."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing: {installed_by}")
        pytest.skip(f"{name} is not installed ({installed_by})")
    return path
