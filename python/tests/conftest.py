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


def interrupted(source, after=1.0, timeout=120):
    """Run a Python program in a child, send it SIGINT `after` seconds after it prints
    "ready", and wait for it: (returncode, stdout, stderr). Every wait is bounded — the
    "ready" line too, which a child stuck before it (a plugin still compiling on a loaded
    machine) would otherwise keep the test waiting for for ever — and the child is killed if
    a wait fails, so a failed test leaves nothing spinning (one once held two cores for
    minutes and failed a later timed test)."""
    import selectors
    import signal
    import time

    child = subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with selectors.DefaultSelector() as waiting:
            waiting.register(child.stdout, selectors.EVENT_READ)
            if not waiting.select(timeout):
                raise AssertionError(f"the child printed nothing within {timeout} s")
        # The child prints "ready" whole and flushed: one line is there to read.
        line = child.stdout.readline().strip()
        assert line == "ready", f"the child said {line!r} before it was ready"
        time.sleep(after)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, out, err
