"""Paired timing of the reference and the candidate, inside the sandbox (the cpp and cuda
families: speedforge.evaluator.harness).

Warm-up, then pairs in random order, each side timing its own copy of the pair's inputs made just
before its call; a short call (under host_warm_below_us) is preceded by an untimed call of the
same side on inputs of its own (a copy of the same for both sides, so a stateful reference stays
in lockstep; never a timed call's, so an answer cached by content gains nothing), so that the host
runs the timed call with its code in cache, as a loop would; on GPU, L2 flushed before each call,
outside the timed region, and a device-wide synchronize before the end event, so side-stream work
counts, less the synchronize's own round trip (`gpu_call_seconds`); every timed output checked against
its pair's reference output. Pairs are taken until the speedup's 95% interval is narrow enough
(`speedup_interval`), or lies wholly below early_stop_below (early stop), or the timing phase
has lasted max_timed_s (the budget: a slow reference holds the device's turn no longer; the
interval it has is reported, marked unstable when wide as any other). On the CPU the
scheduler is read around every call and every round (`SchedulerMarks`): a neighbour's time
slice is taken off a call pinned to one CPU, and contention during timing (`contention_reasons`:
preempted calls in most pairs, or other processes holding the CPU for a share of the round)
marks the result unstable, as does an interval that stayed wide (`unstable_reasons`), a speedup
that drifted through the run or two halves in two states (`drift_reasons`). The CPU's buffer
rotation is speedforge.evaluator.rotation.

A round and what the timer found are typed records, `Round` and `Timing`, sealed against the
candidate (speedforge.evaluator.sealed); `result_fields` takes a Timing into the run's result.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import resource
import statistics
import time
import types
from collections.abc import Sequence
from typing import Protocol

from speedforge import stats
from speedforge.evaluator import sealed
from speedforge.evaluator.rotation import Rotation

_perf_counter = time.perf_counter  # captured before any candidate code is imported
_getrusage = resource.getrusage
_process_time_ns = time.process_time_ns
_thread_time_ns = time.thread_time_ns


class Sides(Protocol):
    """What the timer needs of the harness: inputs, and the calls of each side under its own
    process state (speedforge.evaluator.harness)."""

    def fresh_inputs(self, index: int) -> list: ...

    def clone(self, inputs: list) -> list: ...

    def switch(self, side: str) -> None: ...

    def call(self, what: str, fn, *args): ...

    def compare(self, out_c, out_r, cand_in: list, held: list, where: str, exact_error: bool = True) -> float: ...

    def sync(self) -> None: ...  # the device-wide synchronize (nothing on the CPU)

    Event: type | None  # torch.cuda.Event on the GPU


@sealed.seal
@dataclasses.dataclass(frozen=True, slots=True)
class Round(metaclass=sealed.Sealed):
    """One round of timed pairs (`Timer._timed_round`). Sealed (speedforge.evaluator.sealed): the
    timer reads it after candidate code has run."""

    ref_us: tuple[float, ...]  # the reference's timed calls, microseconds, in the order of the pairs
    cand_us: tuple[float, ...]  # the candidate's timed calls, pair for pair with ref_us
    lo: float | None  # the speedup's 95% interval (`speedup_interval`); None until it was computed
    hi: float | None  # the interval's upper end
    width: float  # the interval's relative half-width, (hi - lo) / 2 / estimate; inf until computed
    stopped_early: bool  # the interval lies wholly below early_stop_below
    disturbed: int  # pairs with a call during which this process was preempted or waited for a CPU
    steal_s: float  # seconds the hypervisor took from this process's CPUs during the round
    round_s: float  # the round's wall-clock seconds
    others_s: float  # seconds of round_s in which other processes held the CPU (`SchedulerMarks.waited_s`)
    out_of_time: bool  # the timing budget (max_timed_s) ended the round before its interval was decided
    company: Company | None  # the other threads' work beside each side's calls; None on the GPU


@sealed.seal
@dataclasses.dataclass(frozen=True, slots=True)
class Timing(metaclass=sealed.Sealed):
    """What `Timer.measure` found, from the round it reports. Every field but cand_company is a
    field of the run's result under the same name (speedforge.evaluator.job.StageResult), taken
    into it by `result_fields`."""

    ref_lo_us: float | None  # the reference's time's 95% interval (`quantile_interval`); None under 4 pairs
    ref_hi_us: float | None  # its upper end
    stopped_early: bool  # the speedup's interval lay wholly below early_stop_below: decided
    ref_us: float  # the reference's time: its calls' median on the GPU, their cpu_time_quantile on the CPU
    cand_us: float  # the candidate's time, the same way
    ref_iqr_us: float  # the interquartile range of the reference's calls (0 under 4 pairs)
    cand_iqr_us: float  # the interquartile range of the candidate's calls
    speedup: float | None  # ref_us / cand_us; None when cand_us is 0
    speedup_lo: float | None  # the speedup's 95% interval, widened to contain the speedup
    speedup_hi: float | None  # its upper end
    unstable: bool  # the figures cannot be trusted; `warnings` says why
    contended: bool  # on the CPU, the machine took the CPU away during the timing (`contention_reasons`)
    ref_company: float | None  # the other threads' CPU seconds per second of the reference's calls (`company_share`)
    cand_company: float | None  # the same beside the candidate's calls: judged in the sandbox, not sent
    warnings: tuple[str, ...]  # why it is unstable, and where the budget stopped the pairs
    timed_calls: int  # the timed pairs of the reported round
    timed_s: float  # seconds of timed calls in every round, both sides
    host_wait: float  # share of the reported round's wall time in which other processes held the timer's CPU


# taken before any candidate code is imported: a Timing's fields read through its slots' own
# descriptors, whatever is later done to the class or to dataclasses (speedforge.evaluator.sealed)
_SENT = tuple((name, read) for name, read in sealed.readers(Timing) if name != "cand_company")


def result_fields(timing: Timing) -> dict[str, object]:
    """The fields of the run's result that `timing` gives, as a plain dict of built-in values (all
    of Timing's but cand_company, which the sandbox judges itself)."""
    return sealed.values(timing, _SENT)


def _pinned(obj, names: tuple[str, ...]):
    """`obj` with its methods `names` bound now and kept as its own attributes: a method swapped
    on the class later (by a candidate that reached it, even for one call and back) is not the one
    the timer calls. A timer is made after the correctness trials' guards found every class as it
    was."""
    for name in names:
        setattr(obj, name, getattr(obj, name))
    return obj


class Timer:
    def __init__(self, torch, config, device, rng: random.Random, sides: Sides) -> None:
        self.torch, self.config, self.device, self.rng = torch, config, device, rng
        # the harness's calls, bound now (`_pinned`)
        self.sides = types.SimpleNamespace(
            **{name: getattr(sides, name) for name in ("fresh_inputs", "clone", "switch", "call", "compare")}
        )
        self.is_cuda = device.type == "cuda"
        self.sync, self.Event = sides.sync, sides.Event  # the harness's, captured before the candidate loaded
        # the time each side is summarised by: the median on the GPU, a low quantile on the CPU
        self.quantile = 0.5 if self.is_cuda else float(config.cpu_time_quantile)
        self.sync_gap_s = 0.0  # the synchronize's own share of an idle call's end (`_sync_gap`), once measured
        self.scheduler = _pinned(SchedulerMarks(), ("read", "waited_s", "disturbed", "elsewhere_s", "own_s"))
        self.rotation = _pinned(Rotation(torch, config, self.is_cuda), ("keep", "filling"))
        _pinned(self, ("measure", "_timed_round", "_timed_call", "_sync_gap"))

    def measure(self, ref_model, cand_model) -> Timing:
        """Paired timing that stops once the answer is decided.

        Pairs (fresh inputs, random order) are taken until the speedup's 95% interval is within
        +-ci_target, or max_timed_calls is reached. A round that ends wider than +-unstable_ci
        is measured again from scratch; the narrower round is reported, marked unstable when
        both stayed too wide (a reward discounts it). The whole phase, warm-up included, stops
        taking pairs once it has lasted max_timed_s (0: no budget), though never before a round
        has min(least, BUDGET_MIN_PAIRS) pairs, and is not measured again then.
        """
        config = self.config
        budget = float(config.max_timed_s)
        deadline = _perf_counter() + budget if budget > 0 else math.inf
        flush = None
        if self.is_cuda and int(config.l2_flush_mb) > 0:
            flush = self.torch.empty(int(config.l2_flush_mb) << 20, dtype=self.torch.int8, device=self.device)
        if self.is_cuda:
            self.sync_gap_s = self._sync_gap()
        est = {"ref": 0.0, "cand": 0.0}
        fastest_ref = math.inf  # the reference's fastest warm-up call
        pair_wall = math.inf  # the fastest warm-up pair, wall-clock: both calls and the harness's work around them
        i = 0
        while i < int(config.warmup_calls) or self.rotation.filling():  # the rotation fills before timing
            started = _perf_counter()
            inputs = self.sides.fresh_inputs(10_000 + i)
            pair = []  # each side's inputs and output, as a timed pair keeps them (the rotation is sized on it)
            for side, model in (("cand", cand_model), ("ref", ref_model)):
                args = self.sides.clone(inputs)
                out, est[side], _ = self._timed_call(model, args, flush, side)
                pair += [args, out]
            fastest_ref = min(fastest_ref, est["ref"])
            self.rotation.keep(pair)
            del pair, out
            pair_wall = min(pair_wall, _perf_counter() - started)
            i += 1
        per_call = max(max(est.values()), 1e-6)
        # decided by the reference's fastest warm-up call alone: its pristine run (beside its twin)
        # and its run beside a candidate then time it the same way, as the tripwire compares them
        # (one slow call, a first call's set-up or a preemption, once turned them off beside a
        # candidate only: the reference read 1.87x slower there, hack_detected); both sides
        # follow, so that a stateful reference and the candidate still get the same calls
        warm_host = (fastest_ref if fastest_ref < math.inf else 0.0) * 1e6 < float(config.host_warm_below_us)
        least, most = pairs_wanted(config, self.is_cuda, per_call, pair_wall)
        wide = max(float(config.unstable_ci), float(config.ci_target))  # wider than this: undecided
        rounds: list[Round] = []
        no_time_left = False  # the last round stayed undecided, and the budget left no time to measure again
        for attempt in range(2):
            rounds.append(
                self._timed_round(
                    ref_model, cand_model, flush, least, most, 20_000 + 100_000 * attempt, deadline, warm_host
                )
            )
            if rounds[-1].width <= wide or rounds[-1].stopped_early:
                break
            if _perf_counter() >= deadline:
                no_time_left = True
                break
        chosen = rounds[-1] if rounds[-1].stopped_early else min(rounds, key=lambda r: r.width)
        chosen_s = (sum(chosen.ref_us) + sum(chosen.cand_us)) / 1e6
        unstable = unstable_reasons(
            chosen, wide, chosen_s, self.config, self.is_cuda, no_time_left=no_time_left and chosen is rounds[-1]
        )
        contended = (
            not self.is_cuda and not chosen.stopped_early and bool(contention_reasons(chosen, chosen_s, self.config))
        )
        if not chosen.stopped_early:  # one steady state measured, not a drifting or switching one
            unstable += drift_reasons(
                chosen.ref_us,
                chosen.cand_us,
                self.rng.getrandbits(31),
                self.torch,
                float(config.drift_limit),
                self.quantile,
            )
        ref_us, cand_us = stats.quantile(chosen.ref_us, self.quantile), stats.quantile(chosen.cand_us, self.quantile)
        speedup = ref_us / cand_us if cand_us > 0 else None
        # an interval always contains its own estimate (a resampled one may fall just beside it); the
        # parent checks that it does (speedforge.evaluator.checks.record_figures)
        lo, hi = chosen.lo, chosen.hi
        if speedup is not None and lo is not None and hi is not None:
            lo, hi = min(lo, speedup), max(hi, speedup)
        ref_lo, ref_hi = quantile_interval(self.torch, chosen.ref_us, self.rng.getrandbits(31), quantile=self.quantile)
        if ref_lo is not None:
            ref_lo, ref_hi = min(ref_lo, ref_us), max(ref_hi, ref_us)
        warnings = [f"unstable: {why}" for why in unstable]
        if no_time_left or any(r.out_of_time for r in rounds):
            warnings.append(
                f"timing budget: the timed pairs stopped at evaluator.max_timed_s={budget:g} s "
                f"({len(chosen.ref_us)} pairs reported, {sum(len(r.ref_us) for r in rounds)} taken)"
            )
        company, threads = chosen.company, int(config.cpu_threads)
        return Timing(
            ref_lo_us=ref_lo,
            ref_hi_us=ref_hi,
            stopped_early=chosen.stopped_early,
            ref_us=ref_us,
            cand_us=cand_us,
            ref_iqr_us=iqr(chosen.ref_us),
            cand_iqr_us=iqr(chosen.cand_us),
            speedup=speedup,
            speedup_lo=lo,
            speedup_hi=hi,
            unstable=bool(unstable),
            contended=contended,
            ref_company=company.share("ref", threads) if company is not None else None,
            cand_company=company.share("cand", threads) if company is not None else None,
            warnings=tuple(warnings),
            timed_calls=len(chosen.ref_us),
            timed_s=sum((sum(r.ref_us) + sum(r.cand_us)) / 1e6 for r in rounds),
            host_wait=min(1.0, chosen.others_s / chosen.round_s) if chosen.round_s > 0 else 0.0,
        )

    def _timed_round(
        self,
        ref_model,
        cand_model,
        flush,
        least: int,
        most: int,
        first_index: int,
        deadline: float = math.inf,
        warm_host: bool = False,
    ) -> Round:
        """Pairs until the interval is within +-ci_target (checked every few pairs past `least`),
        or lies wholly below early_stop_below (checked every EARLY_CHECK_EVERY pairs from
        EARLY_CHECK_FROM on), or `most` pairs, or `deadline` (perf_counter) has passed once it has
        min(least, BUDGET_MIN_PAIRS) pairs, each call after an untimed one when `warm_host`."""
        target = float(self.config.ci_target)
        bound = float(self.config.early_stop_below)
        times: dict[str, list[float]] = {"ref": [], "cand": []}
        lo = hi = None
        width = math.inf
        check_every = max(5, least // 4)
        floor = min(least, BUDGET_MIN_PAIRS)
        out_of_time = False
        disturbed = 0
        company = None if self.is_cuda else _pinned(Company(self.scheduler), ("open", "called", "close", "share"))
        steal = _steal_ticks()
        started = self.scheduler.read(), _perf_counter()  # for the time others held the CPU (`others_s`)
        # the untimed calls' inputs, one set a round, copied for every call: a negative index below
        # the first call's -1, which no timed pair, warm-up call or correctness trial draws
        warm = self.sides.fresh_inputs(-2 - first_index) if warm_host else None
        for i in range(most):
            inputs = self.sides.fresh_inputs(first_index + i)
            order = [("ref", ref_model), ("cand", cand_model)]
            self.rng.shuffle(order)
            outs, args, warmed, hit = {}, {}, {}, False
            for side, model in order:
                # each side its own copy, made just before its call: the same work before either
                # side's call, whichever runs first (the reference once ran on the fresh inputs
                # and the candidate on a copy made after them, which read 0.8x for identical work)
                args[side] = self.sides.clone(inputs)
                if warm is not None:  # kept with the pair below: the untimed call too runs on memory of its own
                    warmed[side] = self.sides.clone(warm)
                outs[side], seconds, preempted = self._timed_call(
                    model, args[side], flush, side, warmed.get(side), company
                )
                times[side].append(seconds * 1e6)
                hit = hit or preempted
            del inputs
            disturbed += hit
            self.sides.compare(outs["cand"], outs["ref"], [], [], f"timed call {i + 1}", exact_error=False)
            self.rotation.keep([args["ref"], args["cand"], outs["ref"], outs["cand"], *warmed.values()])
            del outs, args, warmed
            n = i + 1
            if n >= floor and n < most and _perf_counter() >= deadline:  # the budget: the interval it has
                lo, hi, width = speedup_interval(
                    self.torch, times["ref"], times["cand"], self.rng.getrandbits(31), quantile=self.quantile
                )
                out_of_time = True
                break
            regular = n == most or (n >= least and (n - least) % check_every == 0)
            early = bound > 0 and n >= EARLY_CHECK_FROM and (n - EARLY_CHECK_FROM) % EARLY_CHECK_EVERY == 0
            if regular or early:
                seed = self.rng.getrandbits(31)
                if not regular and _hi_at_least(times["ref"], times["cand"], self.quantile, bound):
                    continue  # no early stop possible: the interval is not needed yet
                lo, hi, width = speedup_interval(self.torch, times["ref"], times["cand"], seed, quantile=self.quantile)
                if bound > 0 and hi is not None and hi < bound:
                    break
                if regular and width <= target:
                    break
        stopped = bound > 0 and hi is not None and hi < bound
        steal = _steal_ticks() - steal
        round_s = _perf_counter() - started[1]
        others_s = self.scheduler.waited_s(started[0], self.scheduler.read(), round_s)
        if company is not None:
            company.close()
        return Round(
            ref_us=tuple(times["ref"]),
            cand_us=tuple(times["cand"]),
            lo=lo,
            hi=hi,
            width=width,
            stopped_early=stopped,
            disturbed=disturbed,
            steal_s=steal / _CLOCK_TICKS,
            round_s=round_s,
            others_s=others_s,
            out_of_time=out_of_time,
            company=company,
        )

    def _sync_gap(self) -> float:
        """The median, over SYNC_GAP_SAMPLES calls that launch nothing, of the seconds from an event
        on the idle current stream to one recorded after the device-wide synchronize: what the
        synchronize adds to every GPU call's end, not the call's own time (`gpu_call_seconds`).
        Each sample starts on a drained device, so work a candidate left queued cannot inflate it."""
        gaps = []
        for _ in range(SYNC_GAP_SAMPLES):
            self.sync()
            done, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
            done.record()
            self.sync()
            end.record()
            end.synchronize()
            gaps.append(done.elapsed_time(end) / 1e3)
        return statistics.median(gaps)

    def _timed_call(
        self, model, args: list, flush, side: str, warm: list | None = None, company: "Company | None" = None
    ):
        what = "ModelNew.forward" if side == "cand" else "the reference"
        self.sides.switch(side)  # the side's backend knobs, set outside the timed region
        if warm is not None:  # untimed, on this side's copy of the untimed inputs: the host's caches warm
            if company is not None:
                company.close()  # the untimed call is no timed call's company
            self.sides.call(what, model, *warm)
        if self.is_cuda:
            if flush is not None:
                flush.zero_()  # evicts L2, outside the timed region
            self.sync()
            start, done, end = (self.Event(enable_timing=True) for _ in range(3))
            start.record()
            out = self.sides.call(what, model, *args)
            done.record()  # the current stream's end of the call
            self.sync()  # device-wide: work on any stream is inside the timed region
            end.record()
            end.synchronize()
            return (
                out,
                gpu_call_seconds(start.elapsed_time(done) / 1e3, start.elapsed_time(end) / 1e3, self.sync_gap_s),
                False,
            )
        marks = self.scheduler
        before = marks.read()
        if company is not None:
            company.open(side, before)
        t0 = _perf_counter()
        out = self.sides.call(what, model, *args)
        seconds = _perf_counter() - t0
        after = marks.read()
        if company is not None:
            company.called(after)
        if marks.one_cpu:
            seconds -= marks.waited_s(before, after, seconds)  # a neighbour's time slice is not the call's
        return out, seconds, marks.disturbed(before, after)


SYNC_GAP_SAMPLES = 33
# what a pristine reference's cached timing was measured with (speedforge.evaluator.evaluate's key):
# 2, a GPU call's end less the synchronize's round trip (`gpu_call_seconds`); 3, a pristine reference
# timed to +-unstable_ci (`pristine_settings`); 4, with the CPU time of its other threads (`ref_company`);
# 5, on the CPU with every loaded BLAS library at cpu_threads threads (speedforge.evaluator.blas_threads);
# 6, on the GPU with at most PRISTINE_GPU_PAIRS pairs and a quarter of the budget
TIMING_VERSION = "6"


def pairs_wanted(config, is_cuda: bool, per_call: float, pair_wall: float) -> tuple[int, int]:
    """The timed pairs a round takes at least and at most. At least: timed_calls (cpu_timed_calls
    on the CPU), and enough for min_timed_s, counted as each side's timed work (`per_call`, the
    slower side's warm-up call) or, with min_timed_span "wall", as the pairs' wall-clock time
    (`pair_wall`, the fastest warm-up pair; inf when there was none: the work count then)."""
    base = int(config.timed_calls if is_cuda else config.cpu_timed_calls)
    most = int(config.max_timed_calls)
    unit = max(per_call, 1e-6)
    if config.min_timed_span == "wall" and math.isfinite(pair_wall):
        unit = max(unit, pair_wall)
    return min(max(base, math.ceil(float(config.min_timed_s) / unit)), most), most


def fewest_pairs(config, is_cuda: bool, stopped_early: bool) -> int:
    """The fewest timed pairs a run's reported round can have under `config` (`Timer.measure`): the
    round's least, or an early stop's first check, or the budget's floor once max_timed_s ran out."""
    least = min(int(config.timed_calls if is_cuda else config.cpu_timed_calls), int(config.max_timed_calls))
    if stopped_early:
        least = min(least, EARLY_CHECK_FROM)
    if float(config.max_timed_s) > 0:
        least = min(least, BUDGET_MIN_PAIRS)
    return max(1, least)


# A pristine reference on the GPU takes at most this many pairs (at least timed_calls) and a quarter
# of max_timed_s: against its twin it is within +-unstable_ci long before min_timed_s's floor, which
# held short references to max_timed_calls.
PRISTINE_GPU_PAIRS = 64


def pristine_settings(config, is_cuda: bool):
    """The timing settings of a pristine reference run (the tripwire's, speedforge.evaluator.evaluate):
    no early stop (the reference against itself is about 1x), and an interval to within
    +-unstable_ci rather than +-ci_target. The tripwire needs the reference's time to a few percent
    against a limit of 1.5x, and a wider pristine interval only makes a trip harder to reach. On the
    GPU the pairs and the budget are capped (PRISTINE_GPU_PAIRS): pristine turns were half the
    device's held time in a cold GRPO-sized batch (docs/benchmarks/throughput.md)."""
    settings = dataclasses.replace(
        config, early_stop_below=0.0, ci_target=max(float(config.ci_target), float(config.unstable_ci))
    )
    if not is_cuda:
        return settings
    most = min(int(config.max_timed_calls), max(int(config.timed_calls), PRISTINE_GPU_PAIRS))
    return dataclasses.replace(settings, max_timed_calls=most, max_timed_s=float(config.max_timed_s) / 4)


def gpu_call_seconds(on_stream: float, overall: float, sync_gap: float) -> float:
    """A GPU call's time from its events: `on_stream`, start to an event recorded on the current
    stream right after the call (CUDA-L1's and KernelBench's end); `overall`, start to an event
    recorded after a device-wide synchronize, so work left on any other stream is inside it.

    The synchronize adds its own round trip to `overall` (about 8-10 us on an H100), the same on
    both sides, which pulled a short call's speedup towards 1 (a 2.8x pair read 2.4x). So the time
    is `overall` less the round trip an idle call showed (`sync_gap`), never less than
    `on_stream`: work on another stream that ended after the current stream's event still counts
    in full beyond that round trip's median."""
    return max(on_stream, overall - sync_gap)


# The least CPU time of one side's calling thread in its timed calls that `company_share` judges: a
# call's reading is within about +-25 us (mean 0), so 8 calls' worst case is a tenth of 2 ms. The fork
# trick's calling thread spends 8-12 ms in 8 calls on the 2-core box, which a 10 ms floor missed once.
COMPANY_MIN_S = 0.002


def company_share(other_s: float, own_s: float, threads: int) -> float | None:
    """The CPU seconds the process's other threads worked beside one side's timed calls for each
    CPU second of the calling thread in them (`other_s` over `own_s`), for the reference-company
    and candidate-company checks; None where it cannot be judged: with more than one torch
    thread, whose pool's workers spin on after every parallel region of either side and run into
    the next call (an honest candidate read 3 CPUs beside a 70 us reference with 2 threads), or
    over less than COMPANY_MIN_S."""
    if threads != 1 or own_s < COMPANY_MIN_S:
        return None
    return max(0.0, other_s) / own_s


def unstable_reasons(
    chosen: Round, wide: float, timed_s: float, config, is_cuda: bool, no_time_left: bool = False
) -> list[str]:
    """Why the chosen round cannot be trusted, one line each; empty when it can.

    The interval stayed too wide (the batch-means part widens it where the machine's state
    drifted), or on the CPU the machine took the CPU away during timing (`contention_reasons`).
    A round that stopped early is decided (its interval lies wholly below the bound).
    `no_time_left`: the round ended undecided with the timing budget spent, so it was not
    measured again."""
    found = []
    if chosen.stopped_early:  # wholly below the bound: decided, whatever else went on
        return found
    if chosen.width > wide:
        after = (
            "when the timing budget ran out (evaluator.max_timed_s)"
            if chosen.out_of_time or no_time_left
            else "after measuring again"
        )
        found.append(f"the speedup's 95% interval stayed wider than +-{wide:.0%} {after} (+-{chosen.width:.1%})")
    if is_cuda:
        return found
    return found + contention_reasons(chosen, timed_s, config)


def contention_reasons(chosen: Round, timed_s: float, config) -> list[str]:
    """On the CPU, why the machine took the CPU away during the chosen round's timing, one line
    each (each begins "contention:"); empty when it did not. A run with any is `contended`
    (StageResult), which the tripwire judges by its reference's median alone.

    - more than contention_limit of the pairs had a call during which this process was
      preempted or waited for a CPU (`SchedulerMarks`): a low quantile shrugs off a few slowed
      calls, not most of them;
    - other processes held the CPU for more than contention_wait_limit of the round's wall time
      (`others_s`: this process waited for a CPU while none of its threads ran). A pair's calls
      can be a small part of its time (relu(2x + y) on 512x1024: 4 calls of about 270 us in a
      pair of 11 ms, the rest the harness's work around them), so a busy loop that shares the
      timed CPU half the time lands in a minority of the calls:
      beside busy loops pinned to a 2-core box's CPUs, 20-55% of the pairs had a preempted call
      while others held the CPU for 30-70% of the round, and the calls they did not preempt ran
      up to 50% slower than on a quieter machine, by amounts that moved through the round (the
      reference against its twin read 0.91x, 95% 0.85-0.99);
    - the hypervisor took more than contention_limit of the timed seconds (steal)."""
    found = []
    limit = float(config.contention_limit)
    pairs = len(chosen.ref_us)
    if pairs and chosen.disturbed / pairs > limit:
        found.append(
            f"contention: in {chosen.disturbed} of {pairs} timed pairs this process was preempted or "
            f"waited for a CPU during a call (limit {limit:.0%}; load average {os.getloadavg()[0]:.1f})"
        )
    held, round_s = chosen.others_s, chosen.round_s
    if round_s > 0 and held / round_s > float(config.contention_wait_limit):
        found.append(
            f"contention: other processes held this process's CPU for {held / round_s:.0%} of the timed "
            f"phase ({held:.2f} of {round_s:.2f} s waiting for a CPU while none of its threads ran; limit "
            f"{float(config.contention_wait_limit):.0%}; load average {os.getloadavg()[0]:.1f})"
        )
    if timed_s > 0 and chosen.steal_s / timed_s > limit:
        found.append(
            f"contention: the hypervisor took {chosen.steal_s:.2f} s of this CPU during "
            f"{timed_s:.2f} s of timed calls (steal)"
        )
    return found


class Company:
    """The work the process's other threads do beside each side's timed CPU calls: their CPU time
    from the start of a side's timed call to the next boundary (the next call, timed or untimed,
    or the round's end), against the calling thread's own CPU time in those calls. The window runs
    past the call's return because another thread's CPU time is accounted when it blocks or at the
    scheduler's tick: a thread that finished a forked half of a candidate's call was seen in one
    window and missed in the next. Against CPU time, not wall time, because a busy neighbour on
    the same CPU stretches the wall time and thinned the forked half to 0.26 of it. With one torch
    thread an honest side's other threads are idle throughout; see `company_share`."""

    def __init__(self, marks: "SchedulerMarks") -> None:
        self.marks = marks
        self.other = {"ref": 0.0, "cand": 0.0}  # CPU seconds of the other threads in each side's windows
        self.own = {"ref": 0.0, "cand": 0.0}  # the calling thread's CPU seconds in the side's timed calls
        self.side: str | None = None
        self.start: tuple[int, ...] = ()

    def open(self, side: str, now: tuple[int, ...]) -> None:
        """Close the open window at `now` (SchedulerMarks.read) and open one for `side`."""
        self.close(now)
        self.side, self.start = side, now

    def called(self, after: tuple[int, ...]) -> None:
        """The open window's timed call returned at `after`: its calling thread's CPU time counts."""
        self.own[self.side] += self.marks.own_s(self.start, after)

    def close(self, now: tuple[int, ...] | None = None) -> None:
        if self.side is not None:
            self.other[self.side] += self.marks.elsewhere_s(self.start, self.marks.read() if now is None else now)
        self.side = None

    def share(self, side: str, threads: int) -> float | None:
        return company_share(self.other[side], self.own[side], threads)


class SchedulerMarks:
    """What the scheduler did to this process around a timed CPU call.

    Read before and after the call (a few microseconds each, outside the timed region): the
    involuntary context switches of all its threads (getrusage), the nanoseconds the calling
    thread waited for a CPU while runnable (/proc/thread-self/schedstat), and the CPU time of
    all its threads and of the calling thread. A call during which the first two moved was
    `disturbed`: other work on the machine slowed it, not its own code. `elsewhere_s` is the CPU
    time the process's other threads spent during the call: beside the reference's calls, work a
    candidate left running (the tripwire's `reference-company`).

    `waited_s` is the part of a call's wall time that other processes took: time the calling
    thread waited for a CPU while none of this process's threads ran. The harness takes it off
    the call's time when the process is pinned to one CPU (the CPU family's default), so that a
    time slice given to a neighbour is not read as the kernel's own time (the whole wait is not
    taken off: a candidate whose forward spins while torch's inter-op thread does its work
    waits for a CPU its own process holds, and keeps that time)."""

    def __init__(self) -> None:
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None
        self.one_cpu = len(os.sched_getaffinity(0)) == 1

    def read(self) -> tuple[int, int, int, int]:
        """(involuntary context switches, ns waited for a CPU, ns of CPU time of the process, ns of
        CPU time of the calling thread)."""
        waited = 0
        if self.fd is not None:
            try:
                waited = int(os.pread(self.fd, 128, 0).split()[1])
            except (OSError, ValueError, IndexError):
                self.fd = None
        return _getrusage(resource.RUSAGE_SELF).ru_nivcsw, waited, _process_time_ns(), _thread_time_ns()

    @staticmethod
    def disturbed(before: tuple[int, ...], after: tuple[int, ...]) -> bool:
        return after[0] != before[0] or after[1] != before[1]

    @staticmethod
    def elsewhere_s(before: tuple[int, ...], after: tuple[int, ...]) -> float:
        """CPU seconds the process's other threads spent during the call: the process's CPU time
        less the calling thread's. Signed: one call reads within about +-25 us of the truth either
        way (2,000 calls on the 2-core box, mean 0.0 us), and clipping each at zero biased a sum
        of short calls upwards (4 us a call, 0.04 CPU at 95 us calls); `company_share` clips the sum."""
        return ((after[2] - before[2]) - (after[3] - before[3])) / 1e9

    @staticmethod
    def own_s(before: tuple[int, ...], after: tuple[int, ...]) -> float:
        """CPU seconds of the calling thread between the two reads."""
        return (after[3] - before[3]) / 1e9

    @staticmethod
    def waited_s(before: tuple[int, ...], after: tuple[int, ...], wall_s: float) -> float:
        """Seconds of `wall_s` in which the calling thread waited for a CPU and this process ran
        on none: min(wait, wall - process CPU time)."""
        waited = (after[1] - before[1]) / 1e9
        idle = wall_s - (after[2] - before[2]) / 1e9
        return max(0.0, min(waited, idle))


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _steal_ticks() -> int:
    """Clock ticks the hypervisor has taken from the CPUs this process may run on (/proc/stat's
    steal column); 0 where unreadable."""
    try:
        cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        with open("/proc/stat") as f:
            return sum(
                int(fields[8])
                for fields in (line.split() for line in f)
                if fields and fields[0] in cpus and len(fields) > 8
            )
    except (OSError, ValueError):
        return 0


# A round that runs out of max_timed_s still takes this many pairs (or `least`, if fewer): the
# batch-means part of the interval needs 16, and so does the tripwire (evaluate.TRIPWIRE_MIN_CALLS)
BUDGET_MIN_PAIRS = 16
EARLY_CHECK_FROM = 8  # pairs before the first early-stop check...
EARLY_CHECK_EVERY = 4  # ...and between later ones
BATCHES = 4  # consecutive batches for the batch-means interval
T_975_3DOF = 3.182  # Student's t, 97.5% quantile, BATCHES - 1 degrees of freedom


def speedup_interval(
    torch, ref_us: Sequence[float], cand_us: Sequence[float], seed: int, resamples: int = 400, quantile: float = 0.5
) -> tuple[float, float, float]:
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

    def resampled(values: Sequence[float]):
        drawn = torch.tensor(values, dtype=torch.float64)[idx]
        return drawn.median(dim=1).values if quantile == 0.5 else torch.quantile(drawn, quantile, dim=1)

    ref, cand = resampled(ref_us), resampled(cand_us)
    ratios = (ref / cand.clamp_min(1e-12)).sort().values
    lo, hi = float(ratios[int(0.025 * resamples)]), float(ratios[int(0.975 * resamples) - 1])
    if n >= 4 * BATCHES:
        size = n // BATCHES
        batch = [
            stats.quantile(ref_us[b * size : (b + 1) * size], quantile)
            / max(stats.quantile(cand_us[b * size : (b + 1) * size], quantile), 1e-12)
            for b in range(BATCHES)
        ]
        half = T_975_3DOF * statistics.stdev(batch) / math.sqrt(BATCHES)
        lo, hi = min(lo, point - half), max(hi, point + half)
    return lo, hi, (hi - lo) / 2 / point


def _hi_at_least(ref_us: Sequence[float], cand_us: Sequence[float], quantile: float, bound: float) -> bool:
    """Whether speedup_interval's upper end is sure to be at least `bound`, without the bootstrap:
    from 4 * BATCHES pairs on it is at least the point estimate (the batch-means part)."""
    if len(ref_us) < 4 * BATCHES:
        return False
    cand = stats.quantile(cand_us, quantile)
    return cand > 0 and stats.quantile(ref_us, quantile) / cand >= bound


def quantile_interval(
    torch, values: Sequence[float], seed: int, resamples: int = 400, quantile: float = 0.5
) -> tuple[float | None, float | None]:
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
        batch = [stats.quantile(values[b * size : (b + 1) * size], quantile) for b in range(BATCHES)]
        half = T_975_3DOF * statistics.stdev(batch) / math.sqrt(BATCHES)
        lo, hi = min(lo, point - half), max(hi, point + half)
    return lo, hi


def iqr(values: Sequence[float]) -> float:
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


DRIFT_BLOCKS = 6  # consecutive blocks of pairs whose speedups a monotone trend runs through
DRIFT_MIN_PAIRS = 4 * DRIFT_BLOCKS  # fewer pairs: blocks too small to tell a trend from noise


def drift_reasons(
    ref_us: Sequence[float], cand_us: Sequence[float], seed: int, torch, limit: float, quantile: float = 0.5
) -> list[str]:
    """Why a series of timed pairs does not measure one steady state, one line each.

    - drift: the speedups of DRIFT_BLOCKS consecutive blocks of pairs rise (or fall) block after
      block, by more than `limit` (relative) from the first block to the last. Six blocks in a
      strict order by chance: 2 in 720. A clock or thermal state that changes during the
      measurement moves the ratio this way (one kernel drifted from 22.2x to 18.8x).
    - two modes: the speedups of the first and second halves, each with its 95% interval
      (`speedup_interval`), lie apart by more than `limit` with the intervals disjoint: the
      measurement switched between two states (1.37-1.40x against 1.48-1.50x).

    `limit` 0 checks nothing; fewer than DRIFT_MIN_PAIRS pairs are too few to tell."""
    n = len(ref_us)
    if limit <= 0 or n < DRIFT_MIN_PAIRS or len(cand_us) != n:
        return []
    found = []
    size = n // DRIFT_BLOCKS
    blocks = [
        stats.quantile(ref_us[b * size : (b + 1) * size], quantile)
        / max(stats.quantile(cand_us[b * size : (b + 1) * size], quantile), 1e-12)
        for b in range(DRIFT_BLOCKS)
    ]
    steps = [later - earlier for earlier, later in zip(blocks, blocks[1:])]
    change = (blocks[-1] - blocks[0]) / max(statistics.median(blocks), 1e-12)
    if (all(s > 0 for s in steps) or all(s < 0 for s in steps)) and abs(change) > limit:
        found.append(
            f"drift: the speedup moved {'up' if change > 0 else 'down'} in every one of {DRIFT_BLOCKS} "
            f"consecutive blocks of pairs, {blocks[0]:.3g}x to {blocks[-1]:.3g}x ({change:+.1%})"
        )
    half = n // 2
    first = speedup_interval(torch, ref_us[:half], cand_us[:half], seed, quantile=quantile)
    second = speedup_interval(torch, ref_us[half:], cand_us[half:], seed + 1, quantile=quantile)
    if None not in (first[0], second[0]):
        a = stats.quantile(ref_us[:half], quantile) / max(stats.quantile(cand_us[:half], quantile), 1e-12)
        b = stats.quantile(ref_us[half:], quantile) / max(stats.quantile(cand_us[half:], quantile), 1e-12)
        apart = first[1] < second[0] or second[1] < first[0]
        if apart and abs(b - a) / max(min(a, b), 1e-12) > limit:
            found.append(
                f"two modes: the first half of the pairs read {a:.3g}x (95% {first[0]:.3g}-{first[1]:.3g}), "
                f"the second {b:.3g}x (95% {second[0]:.3g}-{second[1]:.3g})"
            )
    return found
