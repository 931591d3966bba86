"""Failpoints: where the fault-injection tests kill a run at a step of its own progress.

``IMAGE_BUILDER_FAIL_AT=<text>`` makes a run send SIGKILL to its own process group the first time it reaches a step
whose description contains ``<text>``: what an operator's reboot or the out-of-memory killer does at that moment (no
clean-up handler runs), at a point a test names instead of guessing it by timing. A vCenter import takes half a
second on the simulator; a delay could not hit the moment between two of its calls. Unset, in every real run, a
step costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

#: the variable that names the step to be killed at (tests/integration/test_fault_injection.py)
FAIL_ENV = "IMAGE_BUILDER_FAIL_AT"


def step(description: str) -> str:
    """Mark a step just done (``description`` as the progress says it); returns it."""
    want = os.environ.get(FAIL_ENV)
    if want and want in description:
        # its whole group when it leads one (a task started as a user starts it); else itself alone, never a group
        # it shares with whoever started it
        me = os.getpid()
        os.killpg(me, signal.SIGKILL) if os.getpgrp() == me else os.kill(me, signal.SIGKILL)
    return description
