"""A code worker: runs model-written programs for the process that started it (JSON lines
on stdin and stdout), until that process closes stdin. Started by a CodeRunner with workers."""

import signal

from . import _native


def main():
    # Ctrl-C in a terminal reaches the whole process group: the parent decides what it
    # means and ends this worker by closing its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _native.serve_code_worker()


if __name__ == "__main__":
    main()
