"""Ctrl-C during training: the first interrupt lets the running optimizer step finish and asks
the loop to save a checkpoint and stop (a step cut in half would leave the weights and the
optimizer state out of step with each other); a second one stops at once, without saving."""

from __future__ import annotations

import signal
import sys
import threading


class StopRequest:
    """A context manager that catches SIGINT (in the main thread) and sets ``requested``."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt("stopped at once, without saving a checkpoint")
        self.requested = True
        print("\ninterrupted: the checkpoint is saved after this step (Ctrl-C again to stop without saving)",
              file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
