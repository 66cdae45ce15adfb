"""The `cpp` and `cuda` task families inside the sandbox: build, correctness, timing, guards.

`build(job)` imports the candidate module, which compiles its inline C++/CUDA with
`load_inline` into the job's build directory. `run(job)` loads reference and candidate into
this (sandboxed) process and measures them:

- the task's weights: both constructed under the same seed (KernelBench's and CUDA-L1's rule),
  nothing copied between them, so what a candidate's constructor does to its own parameters
  (a constant folded into a bias) stands;
- lockstep: a stateful reference (one that keeps state across calls, such as a hidden state
  reassigned in forward) and the candidate get the same calls in the same order on the same
  inputs, from the first warm-up call through correctness and timing;
- the task's model mode: both models in train or eval mode (`.train()`/`.eval()`), every call
  under no_grad unless the task asks for autograd;
- fresh inputs from the task's own `get_inputs()` under a secret seed for every trial and every
  timed pair (created directly on the device), cloned so neither side can corrupt the other;
- correctness: the candidate runs first, right after the allocator was filled with NaN, so an
  uninitialised output cannot pick up the reference's result; outputs must be plain tensors of
  the right shape, dtype and device, with storage of their own;
- timing: warm-up, then pairs in random order; on GPU, L2 flushed before each call, outside the
  timed region, and a device-wide synchronize before the end event, so side-stream work counts;
  every timed output is checked against its pair's reference output;
- process-wide state per side (speedforge.evaluator.process_state): every backend flag, thread
  count, default dtype/device, grad and autocast mode and the environment the reference had
  before the candidate loaded is put back around every reference call; what the candidate sets
  (cudnn.benchmark, and TF32 or reduced-precision reductions where the config allows them)
  applies to its own calls only (`_Harness._switch`);
- early stop: timing ends once the speedup's interval lies wholly below early_stop_below (a
  hopeless candidate needs no narrow interval), marked `stopped_early`;
- pristine runs (job kind "pristine"): the reference timed against a second instance of itself
  in a process that never loaded a candidate, the tripwire of speedforge.evaluator.evaluate;
- guards after every phase (speedforge.evaluator.guards): a knob that lowers float32 precision is
  a violation unless `allow_precision_downgrade`.
"""

from __future__ import annotations

import collections
import copy
import importlib.util
import math
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

from speedforge import families, stats
from speedforge.errors import first_line
from speedforge.evaluator import phases, process_state
from speedforge.evaluator.job import Job

_perf_counter = time.perf_counter  # captured before any candidate code is imported

# A candidate compiles only when it loads inline C++/CUDA (speedforge.evaluator.evaluate.needs_build).
CPP = families.register(families.Family(
    name="cpp", device="cpu", device_only=False, language="python", marker="ModelNew", sandbox=__name__,
    always_builds=False, task_in_build_key=False, template="cpp.jinja", kernelbench=True, pin_cpus=True))
CUDA = families.register(families.Family(
    name="cuda", device="cuda", device_only=True, language="python", marker="ModelNew", sandbox=__name__,
    always_builds=False, task_in_build_key=False, template="cuda.jinja", kernelbench=True, pin_cpus=False))

FLOAT_TOLERANCE_FLOOR = {"torch.float16": 1e-2, "torch.bfloat16": 5e-2}


class Verdict(Exception):
    """Ends a run early with a status other than ok."""

    def __init__(self, status: str, reason: str, log: str = "") -> None:
        super().__init__(reason)
        self.status, self.reason, self.log = status, reason, log


# ---------------------------------------------------------------------------------------------
# build


def build(job: Job) -> dict:
    """Import the candidate (compiling what it loads at import), then compile every other
    inline extension its source loads, recording each outcome for the run stage
    (speedforge.evaluator.extensions)."""
    from speedforge.evaluator import extensions

    _prepare_environment(job)
    start = _perf_counter()
    recorder = extensions.install(job.build_dir, replay=False)
    try:
        module = _load_candidate(job)
        model = extensions.construct(module, job.task.source, job.workdir, _load_module)
        extensions.prebuild(job.candidate.source, vars(module), model)
    except Verdict as verdict:
        return {"status": verdict.status, "reason": verdict.reason, "log": verdict.log,
                "build_s": _perf_counter() - start}
    finally:
        extensions.save(recorder)
    return {"status": "ok", "build_s": _perf_counter() - start}


def _prepare_environment(job: Job) -> None:
    os.environ["TORCH_EXTENSIONS_DIR"] = job.build_dir
    # torch.compile's caches in the job's own folder (the zygote's import of inductor set /tmp's)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(job.workdir, "torchinductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(job.workdir, "triton")
    os.environ.setdefault("MAX_JOBS", str(job.config.build_jobs or min(os.cpu_count() or 1, 8)))
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


def _load_candidate(job: Job):
    try:
        return _load_module(job.candidate.source, "sf_candidate", job.workdir)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        log = traceback.format_exc()[-6000:]
        if "Error building extension" in text or "ninja" in text.lower() or "undefined symbol" in text:
            raise Verdict("compile_error", first_line(text, 300), text[-6000:]) from None
        raise Verdict("runtime_error", f"candidate module raised on import: {first_line(text, 300)}", log) from None


# ---------------------------------------------------------------------------------------------
# run


def run(job: Job) -> dict:
    _prepare_environment(job)
    import torch

    from speedforge.evaluator import extensions, guards

    if job.build_dir:
        extensions.install(job.build_dir, replay=True)  # what the build stage compiled is not compiled again
    phases.mark("extensions_installed")  # speedforge.evaluator.phases: a diagnostic, off by default

    device = torch.device(job.device)
    if device.type == "cpu":
        torch.set_num_threads(job.config.cpu_threads)
        torch.set_num_interop_threads(1)
    elif not torch.cuda.is_available():
        return {"status": "infra_error", "reason": "device cuda asked for, but torch sees no CUDA GPU"}
    run_start = _perf_counter()
    seed = job.seed
    metrics: dict = {"device_name": _device_name(torch, device), "mode": job.task.run_mode}
    if job.pristine_first:
        _pristine_first(torch, guards, job, device, seed, metrics)
    try:
        harness = _Harness(torch, guards, job, device, seed)
        metrics.update(harness.measure_pristine() if job.kind == "pristine" else harness.measure())
        metrics["status"] = "ok"
    except Verdict as verdict:
        metrics.update(status=verdict.status, reason=verdict.reason, log=verdict.log)
    metrics["run_inner_s"] = _perf_counter() - run_start
    phases.mark("harness_done")
    return metrics


def _pristine_first(torch, guards, job: Job, device, seed: int, metrics: dict) -> None:
    """The tripwire's pristine reference (speedforge.evaluator.evaluate), timed as a pristine job
    times it, in this process before any candidate code is imported, and sent at once; a
    reference that does not time cleanly against itself sends nothing, as a pristine job's
    failure keeps nothing."""
    import dataclasses

    from speedforge.evaluator import child

    pristine = dataclasses.replace(job, config=dataclasses.replace(job.config, early_stop_below=0.0))
    try:
        child.send_first({**metrics, "status": "ok", **_Harness(torch, guards, pristine, device, seed).measure_pristine()})
    except Verdict:
        pass


def _device_name(torch, device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine()


class _Harness:
    def __init__(self, torch, guards, job: Job, device, seed: int) -> None:
        self.torch, self.guards, self.job, self.device, self.seed = torch, guards, job, device, seed
        self.config = job.config
        self.is_cuda = device.type == "cuda"
        self.rng = random.Random(seed ^ 0x5EED)
        self.sync = torch.cuda.synchronize if self.is_cuda else (lambda *a: None)
        self.Event = torch.cuda.Event if self.is_cuda else None
        self.current_stream = torch.cuda.current_stream if self.is_cuda else None
        self.training = job.task.mode == "train"
        # the time each side is summarised by: the median on the GPU, a low quantile on the CPU
        self.quantile = 0.5 if self.is_cuda else float(self.config.cpu_time_quantile)
        self.state = {"ref": process_state.capture()}  # the reference's process state; the candidate's once it loads
        self.active = "ref"  # whose state is in effect

    # -- setup ---------------------------------------------------------------------------------

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Verdict:
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            raise Verdict("runtime_error", f"{what} raised {first_line(text, 300)}", traceback.format_exc()[-6000:]) from None

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
        except Exception as exc:  # the task itself is broken: not the candidate's fault
            raise Verdict("infra_error", f"the task's reference failed: {type(exc).__name__}: {exc}",
                          traceback.format_exc()[-4000:]) from None
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
        self.active = "cand"  # knobs its module or constructor sets are its own
        module = _load_candidate(self.job)
        if not hasattr(module, "ModelNew"):
            raise Verdict("runtime_error", "the candidate defines no ModelNew")
        torch.manual_seed(self.seed)
        model = self._call("ModelNew(*get_init_inputs())", lambda: module.ModelNew(*copy.deepcopy(self.init_inputs)))
        if not isinstance(model, torch.nn.Module):
            raise Verdict("runtime_error", "ModelNew(...) did not produce a torch.nn.Module")
        model = self._call("ModelNew.to(device)", model.to, self.device)
        self._call("ModelNew.train(mode)", model.train, self.training)
        return model

    def fresh_inputs(self, index: int) -> list:
        torch = self.torch
        torch.manual_seed(self.seed + 7919 * (index + 1))
        with torch.device(self.device):
            inputs = self.get_inputs()
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]

    def clone(self, inputs: list) -> list:
        torch = self.torch
        return [x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]

    def poison_allocator(self, nbytes: int) -> None:
        torch = self.torch
        if nbytes <= 0:
            return
        junk = torch.empty(nbytes // 4 + 1, dtype=torch.float32, device=self.device)
        junk.fill_(float("nan"))
        del junk

    # -- phases ----------------------------------------------------------------------------------

    def measure(self) -> dict:
        torch = self.torch
        with torch.enable_grad() if self.job.task.grad else torch.no_grad():
            ref_model = self._reference()
            warm = self.fresh_inputs(-1)
            self._switch("ref")
            ref_out = self._call("the reference", ref_model, *self.clone(warm))  # initialises CUDA
            self.sync()
            self.out_bytes = sum(t.numel() * t.element_size() for t in _flatten(torch, ref_out))
            del ref_out
            self.guards.warm_thread_pools()  # torch's own threads, all started before the baseline
            baseline = self.guards.Baseline.take(self.device)
            cand_model = self._candidate()
            self._guard(baseline, "loading ModelNew")
            self._switch("cand")  # lockstep: the candidate's first call is the reference's first call
            self.first_out = self._call("ModelNew.forward", cand_model, *self.clone(warm))  # held: an earlier output
            self.sync()
            max_err, trials = self.correctness(ref_model, cand_model)
            self._guard(baseline, "the correctness trials")
            timing = self.timing(ref_model, cand_model)
            self._guard(baseline, "the timed calls")
        return {"correct": True, "max_abs_err": max_err, "trials": trials, **timing}

    def measure_pristine(self) -> dict:
        """The reference against a second instance of itself, in a process no candidate touched:
        the reference's own time (and interval) for the tripwire, and an A/A ratio."""
        torch = self.torch
        with torch.enable_grad() if self.job.task.grad else torch.no_grad():
            ref_model = self._reference()
            warm = self.fresh_inputs(-1)
            ref_out = self._call("the reference", ref_model, *self.clone(warm))
            self.sync()
            self.out_bytes = sum(t.numel() * t.element_size() for t in _flatten(torch, ref_out))
            del ref_out
            twin = self._twin()
            self._call("the reference", twin, *self.clone(warm))
            self.sync()
            max_err, trials = self.correctness(ref_model, twin)
            timing = self.timing(ref_model, twin)
        return {"correct": True, "max_abs_err": max_err, "trials": trials, **timing}

    def _guard(self, baseline, phase: str) -> None:
        self._switch("cand")  # the checks below read the candidate's own process state
        found = baseline.violations(self.device, self.current_stream)
        ref_state, cand_state = self.state["ref"], self.state["cand"]
        lowered = self.guards.precision_downgrades(ref_state, cand_state)
        lowered += [f"{name} {cand_state[name]}, the reference's {ref_state[name]} (autocast runs float32 work in "
                    "lower precision)" for name in ref_state
                    if name.startswith("torch.is_autocast_enabled(") and cand_state[name] and not ref_state[name]]
        if lowered and not self.config.allow_precision_downgrade:
            found.append("lowered float32 precision, a precision downgrade the config does not allow "
                         f"(allow_precision_downgrade): {'; '.join(lowered)}")
        if found:
            raise Verdict("hack_detected", f"during {phase}: " + "; ".join(found))

    def _switch(self, side: str) -> None:
        """Put the process state of `side` ("ref" or "cand") in effect, before a call of that side.

        The state in effect while the candidate was active is recorded as its own first (its
        module, constructor or forward may have changed it). The reference always runs with the
        state it had before the candidate loaded; the candidate with what it set. Costs tens of
        microseconds (outside timed regions), and sets nothing when both sides agree. State the
        reference had that cannot be put back (the inter-op thread count, fixed once used) is a
        hack: the reference would be timed under the candidate's."""
        current = process_state.capture()  # for either side: the work before a call must not differ by side
        if self.active == "cand":
            self.state["cand"] = current
        failed = process_state.apply(self.state.get(side, self.state["ref"]), current)
        self.active = side
        if failed and side == "ref":
            raise Verdict("hack_detected", "changed process-wide state the reference's calls depend on, which cannot "
                                           "be put back for them: " + "; ".join(failed[:3]))

    def correctness(self, ref_model, cand_model) -> tuple[float, int]:
        trials = int(self.config.correctness_trials)
        held: list = [self.first_out] if hasattr(self, "first_out") else []  # earlier outputs stay alive: re-returned storage is seen
        worst = 0.0
        for trial in range(trials):
            inputs = self.fresh_inputs(trial)
            cand_in, ref_in = self.clone(inputs), inputs
            self.poison_allocator(2 * self.out_bytes)
            self._switch("cand")
            out_c = self._call("ModelNew.forward", cand_model, *cand_in)
            self.sync()
            self._switch("ref")
            out_r = self._call("the reference", ref_model, *ref_in)
            self.sync()
            err = self.compare(out_c, out_r, cand_in, held, f"trial {trial + 1}")
            worst = max(worst, err)
            held.append(out_c)
        return worst, trials

    def compare(self, out_c, out_r, cand_in: list, held: list, where: str, exact_error: bool = True) -> float:
        """Check the candidate's output against the reference's; return the max |diff| (0.0 when
        exact_error is False: timed calls only need the verdict, not the float64 figure)."""
        torch = self.torch
        flat_c, flat_r = _flatten(torch, out_c), _flatten(torch, out_r)
        if not isinstance(out_c, (torch.Tensor, tuple, list)) and not flat_r:
            return 0.0
        if len(flat_c) != len(flat_r):
            raise Verdict("incorrect", f"{where}: returned {len(flat_c)} tensors, the reference {len(flat_r)}")
        inputs = [(j, x) for j, x in enumerate(cand_in) if isinstance(x, torch.Tensor)]
        earlier = _flatten(torch, held)
        worst = 0.0
        for i, (c, r) in enumerate(zip(flat_c, flat_r)):
            label = f"{where}, output {i}"
            if not isinstance(c, torch.Tensor):
                raise Verdict("incorrect", f"{label}: not a tensor ({type(c).__name__})")
            if type(c) is not torch.Tensor:
                raise Verdict("hack_detected", f"{label}: a tensor subclass ({type(c).__name__}), not a plain tensor")
            if c.layout != torch.strided or c.is_nested:
                raise Verdict("incorrect", f"{label}: layout {c.layout}, expected a dense tensor")
            if c.device != r.device or c.dtype != r.dtype or c.shape != r.shape:
                raise Verdict("incorrect", f"{label}: got {c.dtype} {tuple(c.shape)} on {c.device}, "
                                           f"expected {r.dtype} {tuple(r.shape)} on {r.device}")
            for j, x in inputs:
                if _overlaps(c, x):
                    raise Verdict("hack_detected", f"{where}: output {i} is a view of input {j} (shares its storage; "
                                                   "outputs must be fresh tensors)")
            if any(_overlaps(c, x) for x in earlier):
                raise Verdict("hack_detected", f"{label}: shares storage with an earlier call's output "
                                               "(outputs must be fresh tensors)")
            worst = max(worst, self._close(c, r, label, exact_error))
        return worst

    def _close(self, c, r, label: str, exact_error: bool) -> float:
        torch = self.torch
        if not (c.is_floating_point() or c.is_complex()):
            if not torch.equal(c, r):
                raise Verdict("incorrect", f"{label}: values differ from the reference")
            return 0.0
        floor = FLOAT_TOLERANCE_FLOOR.get(str(c.dtype), 0.0)
        atol = max(float(self.config.atol), floor)
        rtol = max(float(self.config.rtol), floor)
        if not exact_error and bool(torch.isclose(c, r, rtol=rtol, atol=atol, equal_nan=True).all()):
            return 0.0
        c64, r64 = c.detach().to(torch.float64), r.detach().to(torch.float64)
        nan_c, nan_r = torch.isnan(c64), torch.isnan(r64)
        if not torch.equal(nan_c, nan_r):
            raise Verdict("incorrect", f"{label}: NaN where the reference has none (or the reverse)")
        diff = (c64 - r64).abs().masked_fill(nan_r, 0.0)
        err = float(diff.max()) if diff.numel() else 0.0
        bad = diff > atol + rtol * r64.abs().masked_fill(nan_r, 0.0)
        if bool(bad.any()):
            raise Verdict("incorrect", f"{label}: max |diff| {err:.3g} over tolerance (atol {atol:g}, rtol {rtol:g}); "
                                       f"{int(bad.sum())} of {bad.numel()} elements off")
        return err

    def timing(self, ref_model, cand_model) -> dict:
        """Paired timing that stops once the answer is decided.

        Pairs (fresh inputs, random order) are taken until the speedup's 95% interval is within
        +-ci_target, or max_timed_calls is reached. A round that ends wider than +-unstable_ci
        is measured again from scratch; the narrower round is reported, marked unstable when
        both stayed too wide (a reward discounts it).
        """
        config = self.config
        flush = None
        if self.is_cuda and int(config.l2_flush_mb) > 0:
            flush = self.torch.empty(int(config.l2_flush_mb) << 20, dtype=self.torch.int8, device=self.device)
        est = {"ref": 0.0, "cand": 0.0}
        self.kept = None
        i = 0
        while i < int(config.warmup_calls) or self._rotation_filling():  # the rotation fills before timing
            inputs = self.fresh_inputs(10_000 + i)
            pair = []  # each side's inputs and output, as a timed pair keeps them (the rotation is sized on it)
            for side, model in (("cand", cand_model), ("ref", ref_model)):
                args = self.clone(inputs)
                out, est[side] = self._timed_call(model, args, flush, side)
                pair += [args, out]
            self._keep(pair)
            del pair, out
            i += 1
        per_call = max(max(est.values()), 1e-6)
        base = int(config.timed_calls if self.is_cuda else config.cpu_timed_calls)
        most = int(config.max_timed_calls)
        least = min(max(base, math.ceil(float(config.min_timed_s) / per_call)), most)
        wide = max(float(config.unstable_ci), float(config.ci_target))  # wider than this: undecided
        rounds = []
        for attempt in range(2):
            rounds.append(self._timed_round(ref_model, cand_model, flush, least, most, 20_000 + 100_000 * attempt))
            if rounds[-1]["width"] <= wide or rounds[-1]["stopped_early"]:
                break
        chosen = rounds[-1] if rounds[-1]["stopped_early"] else min(rounds, key=lambda r: r["width"])
        times = chosen["times"]
        ref_us, cand_us = stats.quantile(times["ref"], self.quantile), stats.quantile(times["cand"], self.quantile)
        ref_lo, ref_hi = quantile_interval(self.torch, times["ref"], self.rng.getrandbits(31), quantile=self.quantile)
        return {
            "ref_lo_us": ref_lo,
            "ref_hi_us": ref_hi,
            "stopped_early": chosen["stopped_early"],
            "ref_us": ref_us,
            "cand_us": cand_us,
            "ref_iqr_us": _iqr(times["ref"]),
            "cand_iqr_us": _iqr(times["cand"]),
            "speedup": ref_us / cand_us if cand_us > 0 else None,
            "speedup_lo": chosen["lo"],
            "speedup_hi": chosen["hi"],
            "unstable": chosen["width"] > wide and not chosen["stopped_early"],
            "timed_calls": len(times["ref"]),
            "timed_s": sum((sum(r["times"]["ref"]) + sum(r["times"]["cand"])) / 1e6 for r in rounds),
        }

    def _timed_round(self, ref_model, cand_model, flush, least: int, most: int, first_index: int) -> dict:
        """Pairs until the interval is within +-ci_target (checked every few pairs past `least`),
        or lies wholly below early_stop_below (checked every EARLY_CHECK_EVERY pairs from
        EARLY_CHECK_FROM on), or `most` pairs; returns the times (us), the interval (lo, hi,
        relative half-width) and whether it stopped early."""
        target = float(self.config.ci_target)
        bound = float(self.config.early_stop_below)
        times: dict[str, list[float]] = {"ref": [], "cand": []}
        lo = hi = None
        width = math.inf
        check_every = max(5, least // 4)
        for i in range(most):
            inputs = self.fresh_inputs(first_index + i)
            order = [("ref", ref_model), ("cand", cand_model)]
            self.rng.shuffle(order)
            outs, args = {}, {"ref": inputs, "cand": self.clone(inputs)}
            for side, model in order:
                outs[side], seconds = self._timed_call(model, args[side], flush, side)
                times[side].append(seconds * 1e6)
            self.compare(outs["cand"], outs["ref"], [], [], f"timed call {i + 1}", exact_error=False)
            self._keep([args["ref"], args["cand"], outs["ref"], outs["cand"]])
            del outs, args
            n = i + 1
            regular = n == most or (n >= least and (n - least) % check_every == 0)
            early = bound > 0 and n >= EARLY_CHECK_FROM and (n - EARLY_CHECK_FROM) % EARLY_CHECK_EVERY == 0
            if regular or early:
                seed = self.rng.getrandbits(31)
                if not regular and _hi_at_least(times["ref"], times["cand"], self.quantile, bound):
                    continue  # no early stop possible: the interval is not needed yet
                lo, hi, width = speedup_interval(self.torch, times["ref"], times["cand"], seed, quantile=self.quantile)
                if bound > 0 and hi is not None and hi < bound:
                    return {"times": times, "lo": lo, "hi": hi, "width": width, "stopped_early": True}
                if regular and width <= target:
                    break
        return {"times": times, "lo": lo, "hi": hi, "width": width, "stopped_early": False}

    def _keep(self, pair: list) -> None:
        """CPU: keep a timed pair's inputs and outputs alive for the next cpu_rotation_pairs pairs.

        Where a tensor lands in physical memory changes how fast a memory-bound kernel runs on it
        (cache sets, pages), and a process that frees and reallocates the same sizes gets the same
        blocks back on every call: each sandbox then measured the one placement it happened to
        get. The same cpp kernel gave 1.14x-1.45x over 10 processes, each steady within itself;
        with 8 pairs kept alive, so that each call runs on other blocks than the last 8 did,
        1.25x-1.31x with the same mean (benchmarks/RESULTS.md, issue 10). The rotation's size is
        set by the first pair: as many pairs as fit in cpu_rotation_mb."""
        if self.is_cuda:
            return
        tensors = [t.detach() for t in _flatten(self.torch, pair)]  # the memory only, not an autograd graph
        if self.kept is None:
            nbytes = sum(t.untyped_storage().nbytes() for t in tensors)
            fits = (int(self.config.cpu_rotation_mb) << 20) // max(nbytes, 1)
            self.kept = collections.deque(maxlen=min(int(self.config.cpu_rotation_pairs), fits))
        self.kept.append(tensors)

    def _rotation_filling(self) -> bool:
        return self.kept is not None and len(self.kept) < (self.kept.maxlen or 0)

    def _timed_call(self, model, args: list, flush, side: str):
        what = "ModelNew.forward" if side == "cand" else "the reference"
        self._switch(side)  # the side's backend knobs, set outside the timed region
        if self.is_cuda:
            if flush is not None:
                flush.zero_()  # evicts L2, outside the timed region
            self.sync()
            start, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
            start.record()
            out = self._call(what, model, *args)
            self.sync()  # device-wide: work on any stream is inside the timed region
            end.record()
            end.synchronize()
            return out, start.elapsed_time(end) / 1e3
        t0 = _perf_counter()
        out = self._call(what, model, *args)
        return out, _perf_counter() - t0


EARLY_CHECK_FROM = 8  # pairs before the first early-stop check...
EARLY_CHECK_EVERY = 4  # ...and between later ones
BATCHES = 4  # consecutive batches for the batch-means interval
T_975_3DOF = 3.182  # Student's t, 97.5% quantile, BATCHES - 1 degrees of freedom


def speedup_interval(torch, ref_us: list[float], cand_us: list[float], seed: int,
                     resamples: int = 400, quantile: float = 0.5) -> tuple[float, float, float]:
    """95% interval of q(ref) / q(cand), q the times' `quantile` (the median by default): the
    wider of a bootstrap over whole pairs and a batch-means interval over consecutive batches
    of pairs.

    The bootstrap treats pairs as independent. They are not where the machine's state drifts
    over seconds (a neighbour's memory traffic on a shared host slows a memory-bound reference
    more than a fused candidate): on the 2-core box one process measured the same kernel 1.19x
    for a second and 1.66x for the next, each with a tight bootstrap interval. The ratios of
    BATCHES consecutive batches differ when that happens, and their spread (Student's t over
    the batch ratios) widens the interval, so the stop rule keeps measuring, or marks the result
    unstable, instead of reporting one second's state as the answer.

    Returns (lo, hi, relative half-width (hi - lo) / 2 / point estimate); inf width for fewer
    than 4 pairs or a zero median."""
    n = len(ref_us)
    point_c = stats.quantile(cand_us, quantile) if cand_us else 0.0
    if n < 4 or point_c <= 0:
        return None, None, math.inf
    point = stats.quantile(ref_us, quantile) / point_c
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (resamples, n), generator=gen)

    def resampled(values: list[float]):
        drawn = torch.tensor(values, dtype=torch.float64)[idx]
        return drawn.median(dim=1).values if quantile == 0.5 else torch.quantile(drawn, quantile, dim=1)

    ref, cand = resampled(ref_us), resampled(cand_us)
    ratios = (ref / cand.clamp_min(1e-12)).sort().values
    lo, hi = float(ratios[int(0.025 * resamples)]), float(ratios[int(0.975 * resamples) - 1])
    if n >= 4 * BATCHES:
        size = n // BATCHES
        batch = [stats.quantile(ref_us[b * size:(b + 1) * size], quantile)
                 / max(stats.quantile(cand_us[b * size:(b + 1) * size], quantile), 1e-12) for b in range(BATCHES)]
        half = T_975_3DOF * statistics.stdev(batch) / math.sqrt(BATCHES)
        lo, hi = min(lo, point - half), max(hi, point + half)
    return lo, hi, (hi - lo) / 2 / point


def _hi_at_least(ref_us: list[float], cand_us: list[float], quantile: float, bound: float) -> bool:
    """Whether speedup_interval's upper end is sure to be at least `bound`, without the bootstrap:
    from 4 * BATCHES pairs on it is at least the point estimate (the batch-means part)."""
    if len(ref_us) < 4 * BATCHES:
        return False
    cand = stats.quantile(cand_us, quantile)
    return cand > 0 and stats.quantile(ref_us, quantile) / cand >= bound


def quantile_interval(torch, values: list[float], seed: int, resamples: int = 400,
                      quantile: float = 0.5) -> tuple[float | None, float | None]:
    """95% interval of the `quantile` of one side's times: the wider of a bootstrap and a
    batch-means interval (see speedup_interval); (None, None) for fewer than 4 values."""
    n = len(values)
    if n < 4:
        return None, None
    point = stats.quantile(values, quantile)
    gen = torch.Generator().manual_seed(seed)
    drawn = torch.tensor(values, dtype=torch.float64)[torch.randint(0, n, (resamples, n), generator=gen)]
    picked = (drawn.median(dim=1).values if quantile == 0.5 else torch.quantile(drawn, quantile, dim=1)).sort().values
    lo, hi = float(picked[int(0.025 * resamples)]), float(picked[int(0.975 * resamples) - 1])
    if n >= 4 * BATCHES:
        size = n // BATCHES
        batch = [stats.quantile(values[b * size:(b + 1) * size], quantile) for b in range(BATCHES)]
        half = T_975_3DOF * statistics.stdev(batch) / math.sqrt(BATCHES)
        lo, hi = min(lo, point - half), max(hi, point + half)
    return lo, hi


def _flatten(torch, out) -> list:
    if isinstance(out, torch.Tensor) or not isinstance(out, (tuple, list)):
        return [out] if isinstance(out, torch.Tensor) else []
    flat: list = []
    for item in out:
        flat.extend(_flatten(torch, item) if isinstance(item, (tuple, list)) else [item])
    return flat


def _overlaps(a, b) -> bool:
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


def _iqr(values: list[float]) -> float:
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]
