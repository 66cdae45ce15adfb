"""Stretches of a sandboxed run in which only the harness's code runs in its thread: the guards'
checks, and everything from the run's last check until the process exits.

Candidate code can run without being called: a profile or trace hook it set (process state the
harness keeps on the candidate's side, speedforge.evaluator.process_state, so in effect whenever
the candidate's state is), a finalizer the collector runs (of a cycle it left behind), a handler
of a signal it arranged. Inside a guard such code could undo what it did before the check reads
it; after the last check it could rewrite what the harness sends. `enter` turns all three off
(signals blocked: one that arrives waits), `leave` puts back what the candidate had, and
`for_good` turns them off until the process exits, dropping the signals' Python handlers too (one
already pending would run at the next bytecode). Everything called here is taken when this
module is imported, in the zygote, before any candidate code.

What this cannot stop: a thread of the candidate's, which runs beside the harness (the guards
find it), and an audit hook, which cannot be removed once added (the screen names both).
"""

from __future__ import annotations

import gc
import signal
import sys

_block_signals, _signal_handler = signal.pthread_sigmask, signal.signal
_gc_disable, _gc_enable, _gc_isenabled = gc.disable, gc.enable, gc.isenabled
_get_profile, _set_profile, _get_trace, _set_trace = sys.getprofile, sys.setprofile, sys.gettrace, sys.settrace
_SIGNALS, _SIG_BLOCK, _SIG_SETMASK, _SIG_IGN = (
    tuple(signal.valid_signals()),
    signal.SIG_BLOCK,
    signal.SIG_SETMASK,
    signal.SIG_IGN,
)


def enter() -> tuple:
    """Turn off the profile and trace hooks, the collector and signal delivery in this thread;
    returns what `leave` puts back. The hook in effect on entry sees this call, before the checks."""
    profile, trace = _get_profile(), _get_trace()
    _set_profile(None)
    _set_trace(None)
    collecting = _gc_isenabled()
    _gc_disable()
    return profile, trace, collecting, _block_signals(_SIG_BLOCK, _SIGNALS)


def leave(saved: tuple) -> None:
    """Put back what `enter` turned off (`saved`, what it returned)."""
    profile, trace, collecting, mask = saved
    _block_signals(_SIG_SETMASK, mask)
    if collecting:
        _gc_enable()
    _set_trace(trace)
    if profile is None or callable(profile):
        _set_profile(profile)
    else:  # a profiler of C's (cProfile's, as the phase log's profile uses), which sys.getprofile shows as itself
        profile.enable()


def for_good() -> None:
    """From here until the process exits, no code of the candidate's runs in this thread: no hook,
    no collection, no signal (blocked, and its Python handler dropped)."""
    enter()
    for number in _SIGNALS:
        try:
            _signal_handler(number, _SIG_IGN)
        except (OSError, ValueError, RuntimeError):
            pass
