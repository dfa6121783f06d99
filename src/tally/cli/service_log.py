"""How a long-running tally process (`tally bookie`, `tally autorecovery`) logs: one line
per event on stderr, and every thread's stack there on SIGUSR1."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys


def log_as_a_service() -> None:
    """Log at INFO on stderr; `kill -USR1 PID` then writes every thread's stack there
    (faulthandler), what an operator needs to see where a process that will not stop waits."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
