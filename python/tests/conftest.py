"""Paths of the repository's plugins (built by scripts/build-plugins) for the tests."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUST_PLUGINS = os.path.join(ROOT, "plugins", "target", "wasm32-wasip2", "release")


def rust_plugin(name):
    path = os.path.join(RUST_PLUGINS, f"{name}.wasm")
    if not os.path.isfile(path):
        pytest.fail(f"{path} is missing: run `bash scripts/build-plugins` first")
    return path


@pytest.fixture(scope="session")
def hostile():
    return rust_plugin("hostile")


def run_script(source, timeout=120, **kwargs):
    """Run a Python program in a child interpreter (for signals, forks and exits)."""
    return subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout, **kwargs
    )
