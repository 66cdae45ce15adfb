"""The cpp/cuda harness: the `cpp` and `cuda` task families inside the sandbox.

`build(job)` imports the candidate module, which compiles its inline C++/CUDA with `load_inline`
into the job's build directory. `run(job)` loads reference and candidate into this (sandboxed)
process and measures them: both models built under one seed, in the task's mode, called in
lockstep on fresh inputs from `get_inputs()` drawn under a hidden seed of their own
(speedforge.evaluator.seeds, `fresh_inputs`) and cloned for each side; correctness trials
(speedforge.evaluator.correctness); timing (speedforge.evaluator.timing, the CPU's buffer rotation
in speedforge.evaluator.rotation); each side under its own process-wide state (`_Harness.switch`,
speedforge.evaluator.process_state); the guards after every phase (speedforge.evaluator.guards).
Loading and the first calls run without the device's turn (speedforge.evaluator.turns). A
"pristine" job times the reference against a second instance of itself, for the tripwire. The
contracts, and why each holds, are in docs/concepts/evaluator.md.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import random
import sys
import time
import traceback
from pathlib import Path

from speedforge.errors import first_line
from speedforge.evaluator import checks, fingerprint, harness_only, phases, process_state, turns
from speedforge.evaluator.host_faults import exception_fault, host_fault_reason
from speedforge.evaluator.checks import Verdict
from speedforge.evaluator.correctness import Correctness, flatten
from speedforge.evaluator.job import Job
from speedforge.evaluator.seeds import hidden_seed
from speedforge.evaluator.timing import Timer, pristine_settings, result_fields

_perf_counter = time.perf_counter  # captured before any candidate code is imported
_PATCHED = f"[{checks.CHECK['patched-functions'].id}]"  # how a guard's line that found a patch ends


# ---------------------------------------------------------------------------------------------
# build


def build(job: Job) -> dict:
    """Import the candidate (compiling what it loads at import), then compile every other
    inline extension its source loads, recording each outcome for the run stage
    (speedforge.evaluator.extensions). A compile the host failed (`_host_fault`) makes the build
    an infra_error, also where the candidate caught it or left it to the run stage."""
    from speedforge.evaluator import extensions

    _prepare_environment(job)
    start = _perf_counter()
    recorder = extensions.install(job.build_dir, replay=False)
    try:
        verdict = _compile_all(job, extensions)
    finally:
        extensions.save(recorder)
    # a compile the host failed outweighs whatever the candidate made of it (a fallback, an error)
    host_faults = [found for found in (_host_fault(failure, job) for failure in recorder.failures) if found]
    verdict = host_faults[0] if host_faults else verdict
    if verdict is not None:
        return {
            "status": verdict.status,
            "reason": verdict.reason,
            "log": verdict.log,
            "build_s": _perf_counter() - start,
        }
    return {"status": "ok", "build_s": _perf_counter() - start}


def _compile_all(job: Job, extensions) -> Verdict | None:
    """Import the candidate, construct ModelNew and prebuild the loads its source names; the
    verdict of a candidate that does not import, None for one that does."""
    try:
        module = _load_candidate(job)
        model = extensions.construct(module, job.task.source, job.workdir, _load_module)
        extensions.prebuild(job.candidate.source, vars(module), model)
    except Verdict as verdict:
        return verdict
    return None


def _prepare_environment(job: Job) -> None:
    os.environ["TORCH_EXTENSIONS_DIR"] = job.build_dir
    # torch.compile's caches in the job's own folder (the zygote's import of inductor set /tmp's)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(job.workdir, "torchinductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(job.workdir, "triton")
    os.environ.setdefault("MAX_JOBS", str(job.config.build_jobs or min(len(os.sched_getaffinity(0)), 8)))
    if job.cuda_arch_list:
        os.environ["TORCH_CUDA_ARCH_LIST"] = job.cuda_arch_list


def _load_module(source: str, name: str, workdir: str):
    path = Path(workdir) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


CANDIDATE_MODULE = "sf_candidate"  # the candidate's module, written to the job's folder as <name>.py


def _load_candidate(job: Job):
    try:
        return _load_module(job.candidate.source, CANDIDATE_MODULE, job.workdir)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        log = traceback.format_exc()[-6000:]
        host = _host_fault(exc, job)
        if host is not None:
            raise host from None
        if "Error building extension" in text or "ninja" in text.lower() or "undefined symbol" in text:
            raise Verdict("compile_error", first_line(text, 300), text[-6000:]) from None
        raise Verdict("runtime_error", f"candidate module raised on import: {first_line(text, 300)}", log) from None


def _host_fault(exc: BaseException, job: Job) -> Verdict | None:
    """The infra_error of an exception that reports a host fault (a full disk, an exceeded quota,
    an I/O error, a killed compiler: host_faults.exception_fault), when it comes from where the
    candidate cannot simply raise it: an inline-extension loader (the very exception it raised),
    or harness code before the candidate's module ran (no frame of it in the traceback). What
    the candidate raises itself is its own failure, whatever it says. A compiler's output can
    still carry the candidate's words (its flags, its source), so in the build stage the parent
    believes the claim only where it sees the host in that state (host_faults.HostWatch)."""
    from speedforge.evaluator import extensions

    if not extensions.raised_by_loader(exc) and _ran_candidate(exc, job):
        return None
    fault = exception_fault(exc)
    if fault is None:
        return None
    text = f"{type(exc).__name__}: {exc}"
    return Verdict("infra_error", host_fault_reason(*fault, stage=job.kind), text[-6000:])


def _ran_candidate(exc: BaseException, job: Job) -> bool:
    """Whether the exception passed through the candidate's module (raised by its code, or by
    what its code called)."""
    module_file = str(Path(job.workdir) / f"{CANDIDATE_MODULE}.py")
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == module_file:
            return True
        tb = tb.tb_next
    return False


# ---------------------------------------------------------------------------------------------
# run


def run(job: Job) -> dict:
    _prepare_environment(job)
    import torch

    from speedforge.evaluator import blas_threads, extensions, guards

    if job.build_dir:
        extensions.install(job.build_dir, replay=True)  # what the build stage compiled is not compiled again
    phases.mark("extensions_installed")  # speedforge.evaluator.phases: a diagnostic, off by default

    device = torch.device(job.device)
    if device.type == "cpu":
        torch.set_num_threads(job.config.cpu_threads)
        torch.set_num_interop_threads(1)
        blas_threads.limit(job.config.cpu_threads)  # numpy's OpenBLAS too: a thread per CPU by default
    elif not torch.cuda.is_available():
        return {"status": "infra_error", "reason": "device cuda asked for, but torch sees no CUDA GPU"}
    run_start = _perf_counter()
    seed = job.seed
    metrics: dict = {"device_name": _device_name(torch, device), "mode": job.task.run_mode}
    if job.pristine_first:
        _pristine_first(torch, guards, job, device, seed, metrics)
    harness = None
    try:
        harness = _Harness(torch, guards, job, device, seed)
        metrics.update(harness.measure_pristine() if job.kind == "pristine" else harness.measure())
        metrics["status"] = "ok"
    except Verdict as verdict:
        harness_only.for_good()  # nothing of the candidate's runs again (the last guard did so on an ok run)
        metrics.update(status=verdict.status, reason=verdict.reason, log=verdict.log)
        if harness is not None:
            harness.check_own_state()
    if harness is not None:
        metrics.update(harness.spent)  # where the turn went, a rejected run's too
        _HELD.append(harness)  # with the candidate's model: its finalizers never run (the process leaves with os._exit)
        if harness.changed:
            _leave_unheard(harness.changed)
    metrics["run_inner_s"] = _perf_counter() - run_start
    phases.mark("harness_done")
    return metrics


# The harnesses of this process's runs, held until it exits, and the candidate's objects with them.
# Let go, the candidate's model would be collected as the run ends, after the last guard, and its
# finalizer (a __del__, a weakref.finalize) would run beside the harness's record
# (tests/adversarial/escape_table_rewritten_by_finalizer.py); the process ends with os._exit, which
# runs none.
_HELD: list = []


def _leave_unheard(reason: str) -> None:
    """End the process without a result: the guards found the evaluator's own functions or values,
    or torch's or the standard library's, changed, and a record would pass through them on its way
    out (its encoder, the channel's framing and MAC). The parent reads the exit code as
    hack_detected [patched-functions]; the reason goes to stderr, which the parent keeps as the
    result's log."""
    os.write(2, f"speedforge harness: {reason}\n".encode(errors="replace"))
    os._exit(checks.CHANGED_HARNESS_EXIT)


def _pristine_first(torch, guards, job: Job, device, seed: int, metrics: dict) -> None:
    """The tripwire's pristine reference (speedforge.evaluator.evaluate), timed as a pristine job
    times it, in this process before any candidate code is imported, and sent at once; a
    reference that does not time cleanly against itself sends nothing, as a pristine job's
    failure keeps nothing."""
    import dataclasses

    from speedforge.evaluator import child

    pristine = dataclasses.replace(job, config=pristine_settings(job.config, device.type == "cuda"))
    try:
        harness = _Harness(torch, guards, pristine, device, seed)
        child.send_first({**metrics, "status": "ok", **harness.measure_pristine(), **harness.spent})
    except Verdict:
        pass
    finally:
        turns.end_pristine()  # the turn back before the candidate is imported: it may take it again


def _device_name(torch, device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()


class _Harness:
    """Loads the reference and the candidate and runs the phases: the first call in lockstep,
    correctness, timing, guards after each. It is the `Sides` of speedforge.evaluator.timing:
    fresh inputs, copies, and each side's calls under its own process state."""

    def __init__(self, torch, guards, job: Job, device, seed: int) -> None:
        self.torch, self.guards, self.job, self.device, self.seed = torch, guards, job, device, seed
        self.config = job.config
        self.is_cuda = device.type == "cuda"
        self.input_seed = hidden_seed(seed, self.config.seed, "inputs")  # the inputs' (speedforge.evaluator.seeds)
        self.rng = random.Random(self.input_seed ^ 0x5EED)  # the pairs' order: unknown to the candidate too
        # captured before the candidate is imported, as the timer uses them
        self.sync = torch.cuda.synchronize if self.is_cuda else (lambda *a: None)
        self.Event = torch.cuda.Event if self.is_cuda else None
        self.current_stream = torch.cuda.current_stream if self.is_cuda else None
        # the generators the inputs are drawn from (`fresh_inputs`): the CPU's now, this GPU's at the first
        # inputs, drawn before the candidate is imported; seeded through these objects, never through
        # a module attribute a candidate could have pointed at a generator of its own
        self.generators = [torch.default_generator]
        self.training = job.task.mode == "train"
        self.state = {"ref": process_state.capture()}  # the reference's process state; the candidate's once it loads
        self.active = "ref"  # whose state is in effect
        self.spent: dict[str, float] = {}  # seconds of the turn's phases (`spending`)
        self.correctness = Correctness(torch, self.config)
        # [model, fingerprint after its last call, sums of the tensors its own calls never changed]
        self.references: list = []
        self.values_between_calls = True  # off during the timed calls: structure only (`timed_calls`)
        self.held: list = []  # the candidate's models, held as long as the process lives (`_HELD`)
        self.baseline = None  # the guards' baseline, taken before the candidate is imported
        self.checked_last = False  # a guard ran with nothing of the candidate's running since, nor after
        self.changed = ""  # why the evaluator's, torch's or Python's own functions or values read as changed

    # -- setup ---------------------------------------------------------------------------------

    def call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Verdict:
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            raise Verdict(
                "runtime_error", f"{what} raised {first_line(text, 300)}", traceback.format_exc()[-6000:]
            ) from None

    def _reference(self):
        torch = self.torch
        try:
            ref = _load_module(self.job.task.source, "sf_reference", self.job.workdir)
            torch.manual_seed(self.seed)
            self.init_inputs = ref.get_init_inputs()
            torch.manual_seed(self.seed)
            model = ref.Model(*copy.deepcopy(self.init_inputs)).to(self.device)
            model.train(self.training)
            self.state["ref"] = process_state.capture()
            taken = fingerprint.take(torch, model)
            self.references.append([model, taken, taken[1]])
        except Exception as exc:  # the task itself is broken: not the candidate's fault
            raise Verdict(
                "infra_error",
                f"the task's reference failed: {type(exc).__name__}: {exc}",
                traceback.format_exc()[-4000:],
            ) from None
        self.get_inputs = ref.get_inputs
        self.ref_module = ref
        return model

    def _twin(self):
        """A second instance of the reference, built the same way (a pristine run's other side)."""
        self.torch.manual_seed(self.seed)
        model = self.ref_module.Model(*copy.deepcopy(self.init_inputs)).to(self.device)
        model.train(self.training)
        return model

    def _candidate(self):
        torch = self.torch
        self._reference_ran()  # its first call is its own
        self.active = "cand"  # knobs its module or constructor sets are its own
        self.guards.seal_harness()  # speedforge's modules, from here on not the candidate's to change
        module = _load_candidate(self.job)
        if not hasattr(module, "ModelNew"):
            raise Verdict("runtime_error", "the candidate defines no ModelNew")
        torch.manual_seed(self.seed)
        model = self.call("ModelNew(*get_init_inputs())", lambda: module.ModelNew(*copy.deepcopy(self.init_inputs)))
        self.held.append(model)
        if not isinstance(model, torch.nn.Module):
            raise Verdict("runtime_error", "ModelNew(...) did not produce a torch.nn.Module")
        model = self.call("ModelNew.to(device)", model.to, self.device)
        self.held.append(model)
        self.call("ModelNew.train(mode)", model.train, self.training)
        return model

    def fresh_inputs(self, index: int) -> list:
        """The inputs of draw `index`, from the hidden input seed, the generators left as they were.

        Seeded, saved and restored through the generator objects themselves, kept before the
        candidate is imported (`generators`): torch.manual_seed and torch.random.fork_rng reach the
        CPU's generator through module attributes a candidate can point at a generator of its own
        (tests/adversarial/swaps_the_default_generator.py), and torch.manual_seed also seeds every
        other device type's (xpu, mps), each first recording the Python stack: 1.3 ms of every
        timed pair on an H100 host (docs/benchmarks/overhead.md)."""
        torch = self.torch
        if self.is_cuda and len(self.generators) == 1:  # the first draw, before the candidate is imported
            torch.cuda.init()
            gpu = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.generators.append(torch.cuda.default_generators[gpu])
        seed = self.input_seed + 7919 * (index + 1)
        saved = [generator.get_state() for generator in self.generators]
        try:
            for generator in self.generators:
                generator.manual_seed(seed)
            with torch.device(self.device):
                inputs = self.get_inputs()
        finally:
            for generator, state in zip(self.generators, saved):
                generator.set_state(state)
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]

    def clone(self, inputs: list) -> list:
        torch = self.torch
        return [x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]

    # -- phases ----------------------------------------------------------------------------------

    def measure(self) -> dict:
        torch = self.torch
        with torch.enable_grad() if self.job.task.grad else torch.no_grad():
            ref_model = self._reference()
            warm = self.fresh_inputs(-1)
            self.switch("ref")
            ref_out = self.call("the reference", ref_model, *self.clone(warm))  # initialises CUDA
            self.sync()
            self.out_bytes = sum(t.numel() * t.element_size() for t in flatten(torch, ref_out))
            del ref_out
            self.guards.warm_thread_pools()  # torch's own threads, all started before the baseline
            baseline = self.baseline = self.guards.Baseline.take(self.device)
            cand_model = self._candidate()
            self._guard(baseline, "loading ModelNew")
            self.switch("cand")  # lockstep: the candidate's first call is the reference's first call
            self.first_out = self.call("ModelNew.forward", cand_model, *self.clone(warm))  # held: an earlier output
            self.sync()
            self.take_turn()  # prepared: from here on the run holds the device (speedforge.evaluator.turns)
            with self.spending("correctness_s"):
                max_err, trials = self.correctness.trials(
                    self, ref_model, cand_model, [self.first_out], self.out_bytes, self.device, self.sync
                )
            self._guard(baseline, "the correctness trials")
            with self.spending("timing_s"), self.timed_calls():
                timing = Timer(torch, self.config, self.device, self.rng, self).measure(ref_model, cand_model)
            self._guard(baseline, "the timed calls", last=True)
            elsewhere = checks.candidate_company(timing.cand_company, timing.ref_company)
            if elsewhere:
                raise Verdict(checks.CHECK["candidate-company"].status, elsewhere)
            # into plain values here, while the candidate's objects are still held: none of its code
            # (a finalizer) has run since the guards above, nor takes part (timing.result_fields)
            return {"correct": True, "max_abs_err": max_err, "trials": trials, **result_fields(timing)}

    def measure_pristine(self) -> dict:
        """The reference against a second instance of itself, in a process no candidate touched:
        the reference's own time (and interval) for the tripwire, and an A/A ratio."""
        torch = self.torch
        with torch.enable_grad() if self.job.task.grad else torch.no_grad():
            ref_model = self._reference()
            warm = self.fresh_inputs(-1)
            ref_out = self.call("the reference", ref_model, *self.clone(warm))
            self.sync()
            self.out_bytes = sum(t.numel() * t.element_size() for t in flatten(torch, ref_out))
            del ref_out
            twin = self._twin()
            self.call("the reference", twin, *self.clone(warm))
            self.sync()
            self.take_turn()
            with self.spending("correctness_s"):
                max_err, trials = self.correctness.trials(
                    self, ref_model, twin, [], self.out_bytes, self.device, self.sync
                )
            with self.spending("timing_s"), self.timed_calls():
                timing = Timer(torch, self.config, self.device, self.rng, self).measure(ref_model, twin)
        return {"correct": True, "max_abs_err": max_err, "trials": trials, **result_fields(timing)}

    def take_turn(self) -> None:
        """The device's turn (speedforge.evaluator.turns); on the CPU it pins every thread, a
        scheduling both sides then run under (recorded in their process states)."""
        turns.take()
        process_state.refresh_scheduling(list(self.state.values()))

    @contextlib.contextmanager
    def spending(self, name: str):
        """Seconds of a phase of the turn into `spent[name]`, also when it raises (a rejection)."""
        start = _perf_counter()
        try:
            yield
        finally:
            self.spent[name] = _perf_counter() - start

    def _guard(self, baseline, phase: str, last: bool = False) -> None:
        """hack_detected naming every guard check that failed since `baseline` (checks.guard_findings).

        The checks run with only the harness's code running (speedforge.evaluator.harness_only: no
        hook, collection or signal of the candidate's in between), and the last guard of a run, or
        one that finds something, leaves it so until the process exits: what the harness then
        sends is what its checks saw."""
        self.switch("cand")  # the checks below read the candidate's own process state
        saved = harness_only.enter()
        found = checks.guard_findings(
            baseline,
            self.device,
            self.current_stream,
            self.state["ref"],
            self.state["cand"],
            self.config.allow_precision_downgrade,
        )
        if not (found or last):
            harness_only.leave(saved)
            return
        harness_only.for_good()
        self.checked_last = True
        if found:
            reason = f"during {phase}: " + "; ".join(found)
            self.changed = reason if any(line.endswith(_PATCHED) for line in found) else ""
            raise Verdict("hack_detected", reason)

    def check_own_state(self) -> None:
        """After a rejection, once nothing of the candidate's runs any more: whether what it ran
        since the last guard (its calls, and what ran as the rejection unwound: a finalizer, a
        hook) changed the evaluator's, torch's or Python's own functions or values, through which
        the rejection's record would pass (`changed`)."""
        if self.baseline is None or self.checked_last:
            return
        found = checks.patched_since(self.baseline)
        self.changed = f"after the candidate's last call: {found}" if found else ""
        self.checked_last = True

    def _reference_ran(self) -> None:
        """The reference ran last: its module's fingerprint as its call left it (values too, but
        during the timed calls)."""
        for kept in self.references:
            kept[1] = fingerprint.take(self.torch, kept[0], self.values_between_calls)
            if kept[1][1] is not None:
                kept[2] = fingerprint.unchanged(kept[2], kept[1][1])

    @contextlib.contextmanager
    def timed_calls(self):
        """The timed calls: between them the reference's fingerprint is its structure alone.

        Summing the reference's tensors between the timed calls would read its weights into the
        caches just before its own call (and the candidate's data out of them just before the
        candidate's): on the CPU, which has no cache flush between calls, identical work on a 4 MB
        weight read 0.79x (median of 5) so. The values of every tensor that the reference's own
        calls left unchanged through the correctness trials are checked once the timed calls end
        (a change in them during the timed calls was the candidate's)."""
        self.values_between_calls = False
        try:
            yield
        finally:
            self.values_between_calls = True
        for model, _, steady in self.references:
            what = fingerprint.moved(steady, fingerprint.take(self.torch, model)[1])
            verdict = checks.reference_changed(what and f"{what} during the timed calls")
            if verdict is not None:
                raise verdict

    def compare(self, out_c, out_r, cand_in: list, held: list, where: str, exact_error: bool = True) -> float:
        return self.correctness.compare(out_c, out_r, cand_in, held, where, exact_error)

    def switch(self, side: str) -> None:
        """Put the process state of `side` ("ref" or "cand") in effect, before a call of that side.

        The state in effect while the candidate was active is recorded as its own first (its
        module, constructor or forward may have changed it). The reference always runs with the
        state it had before the candidate loaded; the candidate with what it set. Costs tens of
        microseconds (outside timed regions), and sets nothing when both sides agree. State the
        reference had that cannot be put back (the inter-op thread count, fixed once used) is a
        hack: the reference would be timed under the candidate's. So is a reference module that
        changed since its last call (speedforge.evaluator.fingerprint: taken when a switch follows
        a reference call, checked before the next)."""
        current = process_state.capture()  # for either side: the work before a call must not differ by side
        if self.active == "cand":
            self.state["cand"] = current
        failed = process_state.apply(self.state.get(side, self.state["ref"]), current)
        if self.active == "ref":
            self._reference_ran()
        self.active = side
        verdict = checks.reference_state(failed) if side == "ref" else None
        if verdict is not None:
            raise verdict
        if side == "ref":  # only the candidate (and the harness) ran since: nothing may have changed
            for model, kept, _ in self.references:
                now = fingerprint.take(self.torch, model, self.values_between_calls)
                verdict = checks.reference_changed(fingerprint.changed(kept, now))
                if verdict is not None:
                    raise verdict
