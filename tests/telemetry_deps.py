"""The telemetry extra's packages for the tests: skipped on a laptop without them, a failure
in CI (CI=true), where scripts/setup.sh installs them (the dev extra)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def need(module: str) -> ModuleType:
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason="pip install 'rdmasched[telemetry]'")
