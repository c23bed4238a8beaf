"""`python -m driver`: the CLI. Ctrl-C ends it quietly with status 130 (the shell's code for SIGINT).

While the CLI's modules load (numpy, onnx, onnxruntime: most of a second) a Ctrl-C exits at once:
nothing has started that could be lost, and an interrupt raised inside a C extension's
initialisation would surface as a traceback, even as an ImportError. From then on Ctrl-C is
Python's KeyboardInterrupt, which main() turns into status 130 after ending the line it printed.
Only the standard library is imported here, so the handler is in place before those modules load.
"""

import os
import signal
import sys

INTERRUPTED = 130


def _exit_interrupted(signum, frame):
    os._exit(INTERRUPTED)


def run() -> int:
    signal.signal(signal.SIGINT, _exit_interrupted)
    from .cli import main

    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main()
    except KeyboardInterrupt:  # one that arrives outside main()'s own handler, as it returns
        return INTERRUPTED


sys.exit(run())
