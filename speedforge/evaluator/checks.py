"""Every runtime check of the evaluator, in one list: what it catches and the status it gives.

One function per check, returning what it found (a line, or None / an empty list when the check
holds); the line carries the check's id in brackets, as a screen finding carries its rule's, so a
result's reason names the check that gave it. Where they run (the table's `place`):

- `guards`: in the sandbox after every phase, against a baseline taken before the candidate loaded;
- `outputs`: in the sandbox on every output of every correctness trial and timed call;
- `state`: in the sandbox before every reference call (process_state, fingerprint);
- `outcome`: in the parent, on how a stage ended without a result, or misused its verdict channel;
- `record`: in the parent, on the figures of a result, which need no trust in the child;
- `tripwire`: in the parent, the reference's time beside the candidate against its pristine time;
- `ann`: in the sandbox, on the ann family's searches (speedforge.ann.family).

No module here imports torch or numpy at import time: the parent reads this list too.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import types


@dataclasses.dataclass(frozen=True)
class Check:
    id: str  # named in the reasons it gives, as "[id]"
    status: str  # the result's status when it fails
    where: str  # guards | outputs | state | outcome | record | tripwire | ann
    catches: str  # what it catches, one line


CHECKS = (
    # guards: after every phase, against the baseline
    Check(
        "patched-functions",
        "hack_detected",
        "guards",
        "a function of time, torch, torch.Tensor, nn.Module, torch.cuda.Event, or of the evaluator's own modules and "
        "classes (the timer's clock, its methods), replaced or shadowed; or a module-level value of the evaluator's "
        "(a table, a constant, a frozen record, a function's code or defaults) rebound or changed in place. The run "
        "then sends no result, which would pass through what changed",
    ),
    Check(
        "global-settings",
        "hack_detected",
        "guards",
        "a process-wide torch setting changed (threads, grad mode, default dtype, deterministic algorithms)",
    ),
    Check("started-from-python", "hack_detected", "guards", "a thread or process started from Python (audit hook)"),
    Check("python-threads", "hack_detected", "guards", "Python threads alive that were not before"),
    Check("native-threads", "hack_detected", "guards", "native threads that are not torch's or the driver's"),
    Check("child-processes", "hack_detected", "guards", "child processes alive"),
    Check("cuda-stream", "hack_detected", "guards", "the current CUDA stream switched"),
    Check(
        "candidate-company",
        "hack_detected",
        "guards",
        "on the CPU with one torch thread, the candidate's timed calls keeping other threads of the process at work "
        "(a second CPU the reference's calls never get)",
    ),
    Check(
        "precision-downgrade",
        "hack_detected",
        "guards",
        "float32 precision lowered below the reference's (TF32, reduced-precision reductions, autocast), "
        "unless allow_precision_downgrade",
    ),
    # state: before every reference call
    Check(
        "reference-state",
        "hack_detected",
        "state",
        "process-wide state the reference depends on changed in a way that cannot be put back",
    ),
    Check(
        "reference-changed",
        "hack_detected",
        "state",
        "the reference's own module changed between its calls (its class, attributes, hooks, or the values of its "
        "tensors): reached and rewritten by the candidate",
    ),
    # outputs: every output of every checked call
    Check("output-count", "incorrect", "outputs", "a different number of output tensors than the reference's"),
    Check("output-type", "incorrect", "outputs", "an output that is not a tensor"),
    Check("tensor-subclass", "hack_detected", "outputs", "an output that is a tensor subclass (lazy results)"),
    Check("output-layout", "incorrect", "outputs", "an output that is not a dense strided tensor"),
    Check("output-signature", "incorrect", "outputs", "an output of another dtype, shape or device"),
    Check("aliases-input", "hack_detected", "outputs", "an output sharing storage with an input"),
    Check(
        "aliases-earlier-output",
        "hack_detected",
        "outputs",
        "an output sharing storage with an earlier call's output (re-returned results)",
    ),
    Check(
        "values",
        "incorrect",
        "outputs",
        "values off the reference's beyond tolerance, NaN where it has none, integers that differ",
    ),
    Check(
        "flushed-subnormals",
        "hack_detected",
        "outputs",
        "the reference's subnormal values flushed to zero (FTZ/DAZ, however set: a precision downgrade), unless "
        "allow_precision_downgrade",
    ),
    # outcome: how a sandboxed stage ended without a result
    Check(
        "verdict-channel",
        "hack_detected",
        "outcome",
        "the result channel misused: a record the harness did not send, a nonce asked for twice, bytes out of "
        "order or beyond the channel's bounds",
    ),
    Check("time-limit", "timeout", "outcome", "did not finish within its time limit"),
    Check("memory-limit", "crashed", "outcome", "exceeded the memory limit"),
    Check("disk-limit", "crashed", "outcome", "wrote more than its disk quota"),
    Check("process-limit", "hack_detected", "outcome", "started more processes than allowed"),
    Check("cpu-time-limit", "timeout", "outcome", "exceeded its CPU-time limit"),
    Check("ended-without-result", "crashed", "outcome", "died or exited without writing a result"),
    # record: a run's figures, checked in the parent
    Check(
        "record-figures",
        "hack_detected",
        "record",
        "a result whose figures the harness cannot have measured: fewer timed pairs or trials than the config "
        "allows, a time that is not positive, an estimate outside its interval, a speedup that is not the ratio "
        "of its times, or more timed work than the device's turn the run held",
    ),
    # tripwire: the reference beside the candidate against a pristine sandbox
    Check(
        "reference-slowdown",
        "hack_detected",
        "tripwire",
        "the reference ran slower beside the candidate than in a sandbox that never loaded one",
    ),
    Check(
        "reference-company",
        "hack_detected",
        "tripwire",
        "on the CPU, the process's other threads working during the reference's timed calls more than in a sandbox "
        "that never loaded a candidate (work the candidate left running)",
    ),
    # ann: the candidate's searches
    Check("ann-neighbour-count", "incorrect", "ann", "not k neighbours per query"),
    Check("ann-id-range", "incorrect", "ann", "an id outside the data set"),
    Check("ann-duplicate-ids", "incorrect", "ann", "the same id twice in one query's answer"),
    Check("ann-same-answers", "hack_detected", "ann", "different queries given the same answer (query-blind results)"),
    Check(
        "ann-off-thread",
        "hack_detected",
        "ann",
        "search work on threads other than the measured one (one search thread)",
    ),
    Check(
        "ann-off-cpu",
        "hack_detected",
        "ann",
        "searches that ran on the calling thread for a small share of their wall-clock time",
    ),
    Check("ann-recall", "incorrect", "ann", "recall at the largest ef trailing the baseline's beyond the tolerance"),
    Check("ann-band", "incorrect", "ann", "a recall curve that never reaches the reward band"),
)
# read-only: the sandbox reads it after candidate code ran
CHECK = types.MappingProxyType({check.id: check for check in CHECKS})


def named(check_id: str, text: str) -> str:
    """`text`, naming the check that found it."""
    return f"{text} [{CHECK[check_id].id}]"


class Verdict(Exception):
    """Ends a sandboxed run early with a status other than ok."""

    def __init__(self, status: str, reason: str, log: str = "") -> None:
        super().__init__(reason)
        self.status, self.reason, self.log = status, reason, log


def fail(check_id: str, text: str, log: str = "") -> Verdict:
    """The Verdict of a failed check: its status, and its text naming it."""
    return Verdict(CHECK[check_id].status, named(check_id, text), log)


# -- guards ---------------------------------------------------------------------------------------


def patched_functions(
    baseline,
    now: dict[str, int],
    watched_classes: frozenset[str],
    modules_changed: list[str] = (),
    values_changed: list[str] = (),
) -> str | None:
    """`modules_changed`: the callables of torch's and the standard library's modules that changed
    (guards.changed_module_functions); `values_changed`: the module-level bindings of the
    evaluator's own modules that were rebound or changed in place (guards.changed_harness_values)."""
    patched = sorted(k for k, v in baseline.functions.items() if now.get(k, v) != v)
    patched += sorted(k for k in now.keys() - baseline.functions.keys() if k.rsplit(".", 1)[0] in watched_classes)
    patched += sorted(modules_changed)
    found = [f"patched functions: {', '.join(patched[:5])}"] if patched else []
    if values_changed:
        found.append(f"changed the evaluator's module-level values: {', '.join(sorted(values_changed)[:5])}")
    return named("patched-functions", "; ".join(found)) if found else None


def global_settings(baseline, settings: dict[str, object]) -> str | None:
    changed = sorted(k for k, v in baseline.settings.items() if settings.get(k) != v)
    return named("global-settings", f"changed global torch settings: {', '.join(changed)}") if changed else None


def started_from_python(baseline) -> list[str]:
    started = baseline.starts()
    return [
        named("started-from-python", f"started {kind} from Python ({started[kind] - baseline.started[kind]})")
        for kind in ("threads", "processes")
        if started[kind] > baseline.started[kind]
    ]


def python_threads(baseline) -> str | None:
    new = threading.active_count() - baseline.python_threads
    return named("python-threads", f"started Python threads ({new} new)") if new > 0 else None


def native_threads(baseline, now: dict[int, str], torch_names: tuple[str, ...]) -> str | None:
    python_tids = {t.native_id for t in threading.enumerate()}
    native = {
        tid: name
        for tid, name in now.items()
        if tid not in baseline.threads and tid not in python_tids and not name.startswith(torch_names)
    }
    if not native:
        return None
    return named(
        "native-threads", f"started native threads ({len(native)} new, named {', '.join(sorted(set(native.values())))})"
    )


def child_processes(pids: list[int]) -> str | None:
    return named("child-processes", f"started child processes ({len(pids)})") if pids else None


def cuda_stream(baseline, device, current_stream) -> str | None:
    if device.type == "cuda" and current_stream(device) != baseline.stream:
        return named("cuda-stream", "switched the current CUDA stream")
    return None


def precision_downgrade(lowered: list[str], allowed: bool) -> str | None:
    """`lowered`: the candidate's settings that lower float32 precision, one line each."""
    if not lowered or allowed:
        return None
    return named(
        "precision-downgrade",
        "lowered float32 precision, a precision downgrade the config does not allow "
        f"(allow_precision_downgrade): {'; '.join(lowered)}",
    )


def autocast_downgrades(ref_state: dict[str, object], cand_state: dict[str, object]) -> list[str]:
    """Autocast the candidate left on where the reference had it off, one line each."""
    return [
        f"{name} {cand_state[name]}, the reference's {ref_state[name]} (autocast runs float32 work in lower precision)"
        for name in ref_state
        if name.startswith("torch.is_autocast_enabled(") and cand_state[name] and not ref_state[name]
    ]


def patched_since(baseline) -> str | None:
    """`patched_functions` of the functions, classes and module-level values as they are now."""
    from speedforge.evaluator import guards

    return patched_functions(
        baseline,
        guards.function_table(),
        guards.classes_without_additions(),
        guards.changed_module_functions(baseline.module_functions),
        guards.changed_harness_values(baseline.values),
    )


def guard_findings(
    baseline,
    device,
    current_stream,
    ref_state: dict,
    cand_state: dict,
    allow_precision_downgrade: bool,
) -> list[str]:
    """Every guard check against `baseline`, in CHECKS order; what they found, one line each."""
    from speedforge.evaluator import guards

    found = [
        patched_since(baseline),
        global_settings(baseline, guards.global_settings()),
        *started_from_python(baseline),
        python_threads(baseline),
        native_threads(baseline, guards.native_threads(), guards.TORCH_THREAD_NAMES),
        child_processes(guards.child_pids()),
        cuda_stream(baseline, device, current_stream),
        precision_downgrade(
            guards.precision_downgrades(ref_state, cand_state) + autocast_downgrades(ref_state, cand_state),
            allow_precision_downgrade,
        ),
    ]
    return [line for line in found if line]


# -- state ----------------------------------------------------------------------------------------


def reference_state(failed: list[str]) -> Verdict | None:
    """`failed`: what process_state.apply could not put back for a reference call."""
    if not failed:
        return None
    return fail(
        "reference-state",
        "changed process-wide state the reference's calls depend on, which cannot be put "
        "back for them: " + "; ".join(failed[:3]),
    )


def reference_changed(what: str) -> Verdict | None:
    """`what`: how the reference's module differs from its fingerprint after its last call
    (speedforge.evaluator.fingerprint.changed), "" when it does not."""
    if not what:
        return None
    return fail(
        "reference-changed", f"the reference's module changed between its calls, where only the candidate ran: {what}"
    )


# -- outputs --------------------------------------------------------------------------------------


def output_count(flat_c: list, flat_r: list, where: str) -> Verdict | None:
    if len(flat_c) != len(flat_r):
        return fail("output-count", f"{where}: returned {len(flat_c)} tensors, the reference {len(flat_r)}")
    return None


def output_type(torch, c, label: str) -> Verdict | None:
    if not isinstance(c, torch.Tensor):
        return fail("output-type", f"{label}: not a tensor ({type(c).__name__})")
    return None


def tensor_subclass(torch, c, label: str) -> Verdict | None:
    if type(c) is not torch.Tensor:
        return fail("tensor-subclass", f"{label}: a tensor subclass ({type(c).__name__}), not a plain tensor")
    return None


def output_layout(torch, c, label: str) -> Verdict | None:
    if c.layout != torch.strided or c.is_nested:
        return fail("output-layout", f"{label}: layout {c.layout}, expected a dense tensor")
    return None


def output_signature(c, r, label: str) -> Verdict | None:
    if c.device != r.device or c.dtype != r.dtype or c.shape != r.shape:
        return fail(
            "output-signature",
            f"{label}: got {c.dtype} {tuple(c.shape)} on {c.device}, expected {r.dtype} {tuple(r.shape)} on {r.device}",
        )
    return None


def aliases_input(c, index: int, inputs: list, where: str) -> Verdict | None:
    """`inputs`: (position, tensor) of the call's tensor inputs."""
    for j, x in inputs:
        if overlaps(c, x):
            return fail(
                "aliases-input",
                f"{where}: output {index} is a view of input {j} (shares its storage; outputs must be fresh tensors)",
            )
    return None


def aliases_earlier_output(c, earlier: list, label: str) -> Verdict | None:
    if any(overlaps(c, x) for x in earlier):
        return fail(
            "aliases-earlier-output",
            f"{label}: shares storage with an earlier call's output (outputs must be fresh tensors)",
        )
    return None


def values(torch, c, r, label: str, atol: float, rtol: float, exact_error: bool) -> tuple[float, Verdict | None]:
    """(max |diff|, or 0.0 when not exact_error and all close; the verdict when off)."""
    if not (c.is_floating_point() or c.is_complex()):
        if not torch.equal(c, r):
            return 0.0, fail("values", f"{label}: values differ from the reference")
        return 0.0, None
    if not exact_error and bool(torch.isclose(c, r, rtol=rtol, atol=atol, equal_nan=True).all()):
        return 0.0, None
    c64, r64 = c.detach().to(torch.float64), r.detach().to(torch.float64)
    nan_c, nan_r = torch.isnan(c64), torch.isnan(r64)
    if not torch.equal(nan_c, nan_r):
        return 0.0, fail("values", f"{label}: NaN where the reference has none (or the reverse)")
    diff = (c64 - r64).abs().masked_fill(nan_r, 0.0)
    err = float(diff.max()) if diff.numel() else 0.0
    bad = diff > atol + rtol * r64.abs().masked_fill(nan_r, 0.0)
    if bool(bad.any()):
        return err, fail(
            "values",
            f"{label}: max |diff| {err:.3g} over tolerance (atol {atol:g}, rtol {rtol:g}); "
            f"{int(bad.sum())} of {bad.numel()} elements off",
        )
    return err, None


# An output flushes subnormals when at least this many of the reference's subnormal values, and
# more than this share of them, are exactly zero in it: what FTZ/DAZ (set by torch.set_flush_denormal,
# _mm_setcsr or a fast-math library, and switched off again before the call returns) does to them.
FLUSHED_SUBNORMALS_MIN = 16
FLUSHED_SUBNORMALS_SHARE = 0.5


def flushed_subnormals(torch, c, r, label: str) -> Verdict | None:
    """The candidate's output is zero where the reference's is subnormal, for most of them: denormals
    flushed, which is faster where they occur and lower precision (a state no capture sees when it
    is set and cleared inside the candidate's own call)."""
    if not c.is_floating_point() or c.shape != r.shape:
        return None
    tiny = torch.finfo(r.dtype).tiny
    subnormal = (r != 0) & (r.abs() < tiny)
    count = int(subnormal.sum())
    if count < FLUSHED_SUBNORMALS_MIN:
        return None
    flushed = int((subnormal & (c == 0)).sum())
    if flushed < FLUSHED_SUBNORMALS_MIN or flushed <= FLUSHED_SUBNORMALS_SHARE * count:
        return None
    return fail(
        "flushed-subnormals",
        f"{label}: {flushed} of the reference's {count} subnormal values are zero in the "
        "candidate's output: denormals flushed (FTZ/DAZ), a precision downgrade the config "
        "does not allow (allow_precision_downgrade)",
    )


def overlaps(a, b) -> bool:
    """Whether two tensors share storage (an output overwritten by a CUDA graph replay does)."""
    if a.device != b.device:
        return False
    try:
        sa, sb = a.untyped_storage(), b.untyped_storage()
    except RuntimeError as exc:
        if "overwritten by a subsequent run" in str(exc):  # a CUDA graph replay reused this output's memory
            return True
        raise
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    if sa.nbytes() == 0 or sb.nbytes() == 0:
        return False
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


# -- outcome --------------------------------------------------------------------------------------


# The exit code of a run whose guards found the evaluator's own functions or values changed (or
# torch's, or the standard library's): the harness ends it without a result, since its record
# would pass through what changed (speedforge.evaluator.harness, `_leave_unheard`). A candidate
# that exits so itself is taken at its word.
CHANGED_HARNESS_EXIT = 4


def outcome(
    result: object | None,
    timed_out: bool,
    for_memory: bool,
    for_disk: bool,
    for_processes: bool,
    signal_name: str,
    returncode: int | None,
    channel_problem: str = "",
) -> tuple[str, str] | None:
    """(status, why, naming the check) for a stage that ended without a usable result; None when
    it sent one and was not killed. The first that applies, in CHECKS order."""
    if returncode == CHANGED_HARNESS_EXIT:  # whatever it sent was not the harness's
        why = (
            "changed the evaluator's own functions or values, or torch's or Python's, so the harness sent no "
            "result, which would have passed through them (its log names what changed)"
        )
        return CHECK["patched-functions"].status, named("patched-functions", why)
    if result is not None and not (timed_out or for_memory or for_disk or for_processes or channel_problem):
        return None
    if channel_problem:
        check, why = "verdict-channel", f"misused its result channel ({channel_problem}) and was killed"
    elif timed_out:
        check, why = "time-limit", "did not finish in time and was killed"
    elif for_memory:
        check, why = "memory-limit", "exceeded the memory limit (its processes and its /dev/shm) and was killed"
    elif for_disk:
        check, why = "disk-limit", "wrote more than its disk quota (evaluator.disk_limit_mb) and was killed"
    elif for_processes:
        check, why = "process-limit", "started more processes than allowed and was killed"
    elif signal_name == "SIGXCPU":
        check, why = "cpu-time-limit", "exceeded its CPU-time limit and was killed"
    else:
        how = f"died of {signal_name}" if signal_name else f"exited with code {returncode}"
        check, why = "ended-without-result", f"process {how} without a result"
    return CHECK[check].status, named(check, why)


# -- record ---------------------------------------------------------------------------------------

# How far the timed work may exceed the turn the parent saw held: both clocks' granularity, and the
# turn's grant and release messages on either side of the timed phase.
TURN_SLACK_S = 0.25


def record_figures(result, fewest_pairs: int, fewest_trials: int, main_turn_s: float | None) -> str | None:
    """The reason when an ok run's figures cannot be the harness's (`record-figures`), else None.
    `fewest_pairs`: the fewest timed pairs the config lets a run stop at; `fewest_trials`: the
    correctness trials it asks for; `main_turn_s`: seconds the parent saw the run hold the device's
    turn for its own timing (None: not known). A result without a speedup (another family's) is
    not judged here."""
    if not result.ok or result.speedup is None:
        return None
    problems = []
    if result.timed_calls < fewest_pairs:
        problems.append(f"{result.timed_calls} timed pairs, fewer than the {fewest_pairs} the config allows")
    if result.trials < fewest_trials or not result.correct:
        problems.append(f"ok after {result.trials} correct trial(s) of the {fewest_trials} the config asks for")
    times = {
        "ref_us": result.ref_us,
        "cand_us": result.cand_us,
        "ref_lo_us": result.ref_lo_us,
        "ref_hi_us": result.ref_hi_us,
        "speedup": result.speedup,
        "timed_s": result.timed_s,
    }
    bad = [name for name, value in times.items() if value is not None and not (0 < value < float("inf"))]
    if bad or result.ref_us is None or result.cand_us is None:
        problems.append(f"times that are missing or not positive ({', '.join(bad) or 'ref_us, cand_us'})")
    else:
        ratio = result.ref_us / result.cand_us
        if abs(result.speedup - ratio) > 1e-6 * ratio:
            problems.append(f"a speedup of {result.speedup:.4g} where its times give {ratio:.4g}")
        if (
            None not in (result.ref_lo_us, result.ref_hi_us)
            and not result.ref_lo_us <= result.ref_us <= result.ref_hi_us
        ):
            problems.append("a reference time outside its own interval")
        if None not in (result.speedup_lo, result.speedup_hi) and not (
            result.speedup_lo <= result.speedup <= result.speedup_hi
        ):
            problems.append(
                f"a speedup of {result.speedup:.4g} outside its interval "
                f"{result.speedup_lo:.4g}-{result.speedup_hi:.4g}"
            )
        host_wait = getattr(result, "host_wait", None)
        if host_wait is not None and not 0 <= host_wait <= 1:
            problems.append(f"a host-wait share of {host_wait:.4g}, outside 0-1")
        work_s = result.timed_s or 0.0
        if main_turn_s is not None and work_s > main_turn_s + TURN_SLACK_S:
            problems.append(f"{work_s:.2f} s of timed calls in a turn of {main_turn_s:.2f} s on the device")
    if not problems:
        return None
    return named("record-figures", "the result's figures are not the harness's: " + "; ".join(problems))


# -- tripwire -------------------------------------------------------------------------------------


def reference_slowdown(beside, clean, limit: float) -> str | None:
    """The reason when the reference's time beside the candidate (`beside`) lies wholly above its
    pristine interval (`clean`) and beyond `limit` times its pristine time; None otherwise. A CPU
    run marked unstable for contention is judged by its median alone: work a candidate leaves on
    the timed CPU widens the reference's interval until it overlaps the pristine one (+-33-50% on
    a 2-core box, where it then read ok at up to 1.5x for identical work), and an interval the
    scheduler widened is no evidence of a clean reference. The confirming fresh pristine run and
    the second sandbox (speedforge.evaluator.evaluate) keep load alone from tripping it."""
    if None in (beside.ref_lo_us, beside.ref_us, clean.ref_hi_us, clean.ref_us):
        return None
    apart = beside.ref_lo_us > clean.ref_hi_us or beside.contended
    if not (apart and beside.ref_us > limit * clean.ref_us):
        return None
    return named(
        "reference-slowdown",
        f"the reference ran slower beside this candidate: {beside.ref_us:.1f} us (95% {beside.ref_lo_us:.1f}-"
        f"{beside.ref_hi_us:.1f}) against {clean.ref_us:.1f} us (95% {clean.ref_lo_us:.1f}-"
        f"{clean.ref_hi_us:.1f}) in a pristine sandbox, {beside.ref_us / clean.ref_us:.2f}x (limit {limit:g}x)"
        + _host_wait(beside, clean),
    )


def _host_wait(beside, clean) -> str:
    """What the host took from the timer's CPU beside the candidate and in pristine, where both say:
    a slowdown that came with the host's load, not the candidate's doing, shows here."""
    if getattr(beside, "host_wait", None) is None or getattr(clean, "host_wait", None) is None:
        return ""
    return f"; other processes held the timer's CPU {beside.host_wait:.0%} of the round here, {clean.host_wait:.0%} in pristine"


# The work the process's other threads may do beside a side's timed calls, in CPU seconds for each
# CPU second of the calling thread (timing.company_share), over what they do beside the reference
# in pristine (`reference_company`) or in the same run (`candidate_company`).
COMPANY_MARGIN = 0.25


def candidate_company(cand: float | None, ref: float | None, margin: float = COMPANY_MARGIN) -> str | None:
    """The reason when, beside the candidate's timed calls, the process's other threads worked more
    than `margin` CPU seconds for each of the calling thread's over what they did beside the
    reference's calls of the same run (`cand`, `ref`: timing's cand_company and ref_company); None
    otherwise, and where either has no figure (the GPU, more than one torch thread, too few calls).

    With one torch thread a call's work is the calling thread's. A candidate that hands half of its
    rows to torch's inter-op thread with `torch.jit.fork` and joins them before it returns runs on
    a second CPU wherever the sandbox is not pinned to one: the reference's own matmul, split so,
    read 1.56-1.73x unpinned on the 2-core box (0.89x pinned, where both halves share the CPU). Its
    other thread works about as long as its calling thread: about 1."""
    if cand is None or ref is None or cand <= ref + margin:
        return None
    return named(
        "candidate-company",
        f"the candidate's timed calls kept other threads at work: {cand:.2f} s for each second of its calling "
        f"thread's, against {ref:.2f} beside the reference's (margin {margin:g}); with one torch thread "
        "(evaluator.cpu_threads) a call's work is its calling thread's",
    )


def reference_company(beside, clean, margin: float = COMPANY_MARGIN) -> str | None:
    """The reason when, beside the reference's timed calls in the candidate's sandbox, the
    process's other threads worked more than `margin` CPU seconds for each of the calling
    thread's over what they did in its pristine sandbox; None otherwise, and where either has no
    figure (the GPU, more than one torch thread, too few calls).

    Work a candidate leaves running between its calls (tests/sabotage/background_work.py hands a
    loop of matmuls to torch's inter-op pool and returns) runs beside the reference's calls too.
    Where it shares the reference's CPU the reference runs slower (`reference_slowdown`); where the
    sandbox runs unpinned on a 2-core box it takes the other core, the reference's median moved by
    less than the limit, and the result read ok at up to 1.43x for identical work in 11 of 22
    evaluations. Its CPU time is there either way. An honest candidate's work ends with its call:
    its threads, if any, are idle by the time the reference's call starts."""
    if beside.ref_company is None or clean.ref_company is None:
        return None
    if beside.ref_company <= clean.ref_company + margin:
        return None
    return named(
        "reference-company",
        f"work ran beside the reference: the process's other threads worked {beside.ref_company:.2f} s for "
        f"each second of its calling thread's in its timed calls, against {clean.ref_company:.2f} in a "
        f"pristine sandbox (margin {margin:g}): work the candidate left running",
    )


# -- ann ------------------------------------------------------------------------------------------

ANN_SAME_ANSWER_LIMIT = 0.5  # share of queries whose answer equals another query's
ANN_OFF_CPU_LIMIT = 0.5  # the candidate's share of wall-clock time on the calling thread, over the baseline's
ANN_OFF_THREAD_MARGIN = 0.10  # the candidate's CPU time off the calling thread, over the baseline's share


def ann_answers(runs, n: int, k: int) -> dict | None:
    """The answer checks on every run, in CHECKS order; the first failure as {status, reason}."""
    for run in runs:
        for check in (ann_neighbour_count, ann_id_range, ann_duplicate_ids):
            found = check(run.labels["cand"], n, k, run.ef)
            if found:
                return found
        found = ann_same_answers(run.labels["cand"], run.labels["base"], run.ef)
        if found:
            return found
    return None


def _ann(check_id: str, text: str) -> dict:
    return {"status": CHECK[check_id].status, "reason": named(check_id, text)}


def ann_neighbour_count(labels, n: int, k: int, ef: int) -> dict | None:
    if labels.shape[1] != k:
        return _ann("ann-neighbour-count", f"the candidate returned {labels.shape[1]} neighbours, not k={k}")
    return None


def ann_id_range(labels, n: int, k: int, ef: int) -> dict | None:
    if (labels >= n).any() or (labels < -1).any():
        bad = labels[(labels >= n) | (labels < -1)][0]
        return _ann("ann-id-range", f"the candidate returned id {int(bad)} outside [0, {n})")
    return None


def ann_duplicate_ids(labels, n: int, k: int, ef: int) -> dict | None:
    import numpy as np

    ordered = np.sort(np.where(labels >= 0, labels, -np.arange(1, k + 1)), axis=1)
    if (ordered[:, 1:] == ordered[:, :-1]).any():
        return _ann("ann-duplicate-ids", f"the candidate returned the same id twice for a query (ef={ef})")
    return None


def ann_same_answers(labels, base_labels, ef: int) -> dict | None:
    same, base_same = same_answer_share(labels), same_answer_share(base_labels)
    if same > ANN_SAME_ANSWER_LIMIT and same > base_same + 0.25:
        return _ann(
            "ann-same-answers",
            f"the candidate gave {same:.0%} of different queries the same answer as another "
            f"query (baseline {base_same:.0%}) at ef={ef}: precomputed or query-blind results",
        )
    return None


def same_answer_share(labels) -> float:
    """Share of rows whose (sorted) answer equals another row's."""
    import numpy as np

    rows = np.sort(labels, axis=1)
    _, inverse, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    return float((counts[inverse.ravel()] > 1).mean())


def ann_time(runs, threads: int) -> dict | None:
    """Work a candidate's searches did where the measure does not see it, where the baseline's
    did not: off the calling thread's CPU altogether (another process, or time waited for: the
    median chunk's share of wall-clock time on the calling thread's CPU), and, with one search thread (whose
    measure is the calling thread's CPU time), on other threads of the process (their share of
    the process's CPU time). With more threads the measure is wall-clock time, which work moved
    elsewhere does not shorten."""
    share, elsewhere = {}, {}
    for side in ("base", "cand"):
        # the median chunk's share, as the reward takes the median chunk: a few chunks that waited
        # for the CPU on a loaded machine (the shortest calls most) once read hack_detected
        shares = [seconds / max(wall, 1e-9) for r in runs for seconds, wall in zip(r.seconds[side], r.wall[side])]
        share[side] = statistics.median(shares) if shares else 0.0
        own, everything = (sum(sum(getattr(r, f)[side]) for r in runs) for f in ("thread_cpu", "process_cpu"))
        elsewhere[side] = max(0.0, everything - own) / max(everything, 1e-9)
    if threads == 1 and elsewhere["cand"] > elsewhere["base"] + ANN_OFF_THREAD_MARGIN:
        return _ann(
            "ann-off-thread",
            f"{elsewhere['cand']:.0%} of the CPU time of the candidate's searches was spent "
            f"on threads other than the calling thread (baseline {elsewhere['base']:.0%}), whose CPU time is "
            "what is measured: work done outside the measured thread",
        )
    if share["cand"] < ANN_OFF_CPU_LIMIT * share["base"]:
        return _ann(
            "ann-off-cpu",
            f"the candidate's searches ran on the calling thread for only {share['cand']:.0%} of "
            f"their wall-clock time in the median chunk (baseline {share['base']:.0%}): work done outside the "
            "measured thread",
        )
    return None


def ann_recall(top_cand: float, top_base: float, tolerance: float, k: int, ef: int) -> dict | None:
    if top_cand < top_base - tolerance:
        return _ann(
            "ann-recall",
            f"recall@{k} {top_cand:.3f} at ef={ef} trails the baseline's {top_base:.3f} by more than {tolerance}",
        )
    return None


def ann_band(cand_auc: float, best: float, k: int, low: float) -> dict | None:
    if cand_auc <= 0.0:
        return _ann("ann-band", f"the candidate never reaches recall@{k} {low} (best {best:.3f})")
    return None


def checks_table() -> str:
    """CHECKS as the Markdown table the documentation shows (docs/hooks.py)."""
    rows = ["| Check | Status | Where | Catches |", "|---|---|---|---|"]
    rows += [f"| `{check.id}` | `{check.status}` | {check.where} | {check.catches} |" for check in CHECKS]
    return "\n".join(rows) + "\n"
