"""Ctrl-C during ``run``: the results folder is left old, partial or complete, never torn.

A SIGINT can arrive at any byte code. Without a plan, one landing after the simulation
stopped (while the folder is being staged, or between the two renames of
:meth:`sim.resultsdir.ResultsFolder.commit`) aborted the write, or left the target
renamed away and the new folder not yet in place. :class:`InterruptGuard` gives the
run three phases:

* before :meth:`arm` (loading the workload, building the engine): Python's default,
  ``KeyboardInterrupt`` propagates and the run leaves nothing (an earlier folder stays);
* armed (the simulation): the first SIGINT raises ``KeyboardInterrupt`` once and
  switches to deferring, so the run stops and its partial folder is written;
* deferring (stage, write, commit, release): a SIGINT is only recorded; the folder
  is committed whole and the caller exits 130 afterwards.

``HICACHE_SIM_INTERRUPT_AT=<phase>`` sends the process a SIGINT at the named phase
(:func:`checkpoint`): the tests deliver Ctrl-C at each phase deterministically
instead of racing a timer against the run.
"""

from __future__ import annotations

import os
import signal
import threading

INTERRUPT_ENV = "HICACHE_SIM_INTERRUPT_AT"
# The phases at which checkpoint() can deliver a SIGINT, in the order a run meets them.
PHASES = ("locked", "simulating", "simulated", "staging", "committing", "committed")


def checkpoint(phase: str) -> None:
    """SIGINT this process now if ``HICACHE_SIM_INTERRUPT_AT`` names ``phase``."""
    if os.environ.get(INTERRUPT_ENV) == phase:
        os.kill(os.getpid(), signal.SIGINT)


class InterruptGuard:
    """The SIGINT handler of one run (a no-op off the main thread, where Python cannot
    install handlers and SIGINT is not delivered anyway)."""

    def __init__(self) -> None:
        self.deferring = False
        self.pending = False
        self._old = None
        self._installed = False

    def _handler(self, signum, frame) -> None:
        if self.deferring:
            self.pending = True
            return
        self.deferring = True  # any later SIGINT waits for the folder to be written
        raise KeyboardInterrupt

    def arm(self) -> "InterruptGuard":
        # Only over Python's own Ctrl-C handler: a sweep or census worker ignores SIGINT
        # (its parent handles Ctrl-C), and keeps ignoring it.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._old = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def defer(self) -> None:
        self.deferring = True

    def restore(self) -> None:
        """Put the previous handler back; a SIGINT recorded meanwhile is reported by
        ``pending``."""
        if self._installed:
            signal.signal(signal.SIGINT, self._old)
            self._installed = False
