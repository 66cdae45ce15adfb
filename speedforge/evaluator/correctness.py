"""Correctness of the candidate against the reference, inside the sandbox (the cpp and cuda
families: speedforge.evaluator.harness).

Several trials on fresh inputs; in each the candidate runs first, right after the allocator was
filled with NaN (`poison_allocator`), so an uninitialised output cannot pick up the reference's
result. The last REUSED_STORAGE trials write their fresh inputs into the very tensors an earlier
trial gave the candidate (`Correctness.refill`): the same objects at the same addresses, holding new
values, so an answer cached by the input's address or object is stale there in every run, not only
when the allocator happens to hand an address out again (tests/adversarial/cache_by_pointer.py and
cache_by_identity.py). Every output, of the trials and of every timed call
(speedforge.evaluator.timing), goes through the output checks of speedforge.evaluator.checks in
order: count, type, plain tensor, layout, dtype/shape/device, no storage shared with an input or an
earlier output, values within the dtype's tolerance, the reference's subnormal values not flushed
to zero.
"""

from __future__ import annotations

import os
import types

from speedforge.evaluator import checks

FLOAT_TOLERANCE_FLOOR = types.MappingProxyType({"torch.float16": 1e-2, "torch.bfloat16": 5e-2})

# A timed call's output (speedforge.evaluator.timing) with more elements than this has its values
# checked on this many of them, drawn afresh for each call after it returned, from a seed out of
# os.urandom that nothing in the process holds while the candidate runs; the correctness trials
# check every element. Work skipped or faked on a share s of the elements escapes one call's
# check with probability (1 - s)^65536 (s = 0.01%: 0.14%), and every timed call is checked
# (tests/adversarial/partial_work_while_timed.py, flush_denormals_while_timed.py). The full
# check of a 4M-element output cost 20 ms a pair on the CPU against 5.4 ms of timed calls, and
# about 1.5 ms a pair on an H100 (docs/benchmarks/overhead.md).
TIMED_SAMPLE = 65536

# The last trials run on reused storage: the first on the tensors of the trial right before it, the
# second on those of the trial before that (two calls since), so a cache that remembers only its last
# input and one that distrusts only its last input are both caught.
REUSED_STORAGE = 2


def trial_count(asked: int) -> int:
    """The correctness trials run for config.correctness_trials = `asked`: at least two on storage
    of their own before the REUSED_STORAGE trials on storage reused."""
    return max(int(asked), REUSED_STORAGE + 2)


def flatten(torch, out) -> list:
    """The tensors of an output (a tensor, or nested tuples and lists of them), in order."""
    if isinstance(out, torch.Tensor) or not isinstance(out, (tuple, list)):
        return [out] if isinstance(out, torch.Tensor) else []
    flat: list = []
    for item in out:
        flat.extend(flatten(torch, item) if isinstance(item, (tuple, list)) else [item])
    return flat


def poison_allocator(torch, device, nbytes: int) -> None:
    """Fill `nbytes` of freshly allocated memory with NaN and free it: the next allocations of
    that size get NaN, not a leftover result."""
    if nbytes <= 0:
        return
    junk = torch.empty(nbytes // 4 + 1, dtype=torch.float32, device=device)
    junk.fill_(float("nan"))
    del junk


class Correctness:
    def __init__(self, torch, config) -> None:
        self.torch, self.config = torch, config
        self.samplers: dict[str, object] = {}  # a generator per device, seeded from os.urandom for each sample

    def trials(self, sides, ref_model, cand_model, held: list, out_bytes: int, device, sync) -> tuple[float, int]:
        """trial_count(config.correctness_trials) trials; the worst max |diff| and the trial count.
        `held`: earlier outputs, kept alive so that re-returned storage is seen; `sides`: the
        harness (speedforge.evaluator.timing.Sides). Every trial's inputs are a fresh draw, the
        reference's its own as drawn; the candidate's a copy, which the last REUSED_STORAGE trials
        write into the tensors of an earlier trial (`refill`). Both sides get the same calls on the
        same values, so a stateful reference stays in lockstep."""
        trials = trial_count(self.config.correctness_trials)
        worst = 0.0
        given: list = []  # the candidate's inputs of the last two trials on storage of their own, by trial
        for trial in range(trials):
            inputs = sides.fresh_inputs(trial)
            back = trial - (trials - REUSED_STORAGE) + 1  # > 0: the inputs go into those of `back` trials before
            where = f"trial {trial + 1}"
            if back > 0:
                earlier, cand_in = given[-back]
                cand_in = self.refill(sides, inputs, cand_in)
                where = f"{where} (its inputs written into the tensors of trial {earlier + 1})"
            else:
                cand_in = sides.clone(inputs)
                given = [*given, (trial, cand_in)][-REUSED_STORAGE:]
            ref_in = inputs
            poison_allocator(self.torch, device, 2 * out_bytes)
            sides.switch("cand")
            out_c = sides.call("ModelNew.forward", cand_model, *cand_in)
            sync()
            sides.switch("ref")
            out_r = sides.call("the reference", ref_model, *ref_in)
            sync()
            err = self.compare(out_c, out_r, cand_in, held, where)
            worst = max(worst, err)
            held.append(out_c)
        return worst, trials

    def refill(self, sides, inputs: list, earlier: list) -> list:
        """The candidate's inputs of a trial on reused storage: each tensor of `inputs` written into
        the tensor at its place in `earlier`, which is then handed over again (the same object,
        address and version counter, new values); an input that does not fit there (another shape,
        stride, dtype or device: a task that draws them at random) is copied afresh."""
        torch = self.torch
        if len(earlier) != len(inputs):
            return sides.clone(inputs)
        given = []
        for new, old in zip(inputs, earlier):
            if _fits(torch, old, new):
                _write(torch, old, new)
                given.append(old)
            else:
                given.extend(sides.clone([new]))
        return given

    def compare(self, out_c, out_r, cand_in: list, held: list, where: str, exact_error: bool = True) -> float:
        """Check the candidate's output against the reference's; return the max |diff| (0.0 when
        exact_error is False: timed calls only need the verdict, not the float64 figure). Raises
        the Verdict of the first output check that fails."""
        torch = self.torch
        flat_c, flat_r = flatten(torch, out_c), flatten(torch, out_r)
        if not isinstance(out_c, (torch.Tensor, tuple, list)) and not flat_r:
            return 0.0
        _raise(checks.output_count(flat_c, flat_r, where))
        inputs = [(j, x) for j, x in enumerate(cand_in) if isinstance(x, torch.Tensor)]
        earlier = flatten(torch, held)
        worst = 0.0
        for i, (c, r) in enumerate(zip(flat_c, flat_r)):
            label = f"{where}, output {i}"
            _raise(checks.output_type(torch, c, label))
            _raise(checks.tensor_subclass(torch, c, label))
            _raise(checks.output_layout(torch, c, label))
            _raise(checks.output_signature(c, r, label))
            _raise(checks.aliases_input(c, i, inputs, where))
            _raise(checks.aliases_earlier_output(c, earlier, label))
            floor = FLOAT_TOLERANCE_FLOOR.get(str(c.dtype), 0.0)
            atol, rtol = max(float(self.config.atol), floor), max(float(self.config.rtol), floor)
            if not exact_error and c.numel() > TIMED_SAMPLE:  # a timed call: a sample of its elements
                label = f"{label} ({TIMED_SAMPLE} of its {c.numel()} elements, drawn at random)"
                c, r = self.sample(c, r)
            err, verdict = checks.values(torch, c, r, label, atol, rtol, exact_error)
            _raise(verdict)
            if not self.config.allow_precision_downgrade:
                _raise(checks.flushed_subnormals(torch, c, r, label))
            worst = max(worst, err)
        return worst

    def sample(self, c, r) -> tuple:
        """The same TIMED_SAMPLE positions of two outputs of one shape, as 1-D tensors."""
        torch = self.torch
        key = str(c.device)
        if key not in self.samplers:
            self.samplers[key] = torch.Generator(device=c.device)
        generator = self.samplers[key]
        generator.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        index = torch.randint(c.numel(), (TIMED_SAMPLE,), generator=generator, device=c.device)
        return torch.take(c.detach(), index), torch.take(r.detach(), index)


def _fits(torch, old, new) -> bool:
    """Whether `new`'s values can go into `old` and `old` then be what a copy of `new` would be."""
    if not isinstance(new, torch.Tensor) or type(old) is not type(new):
        return False
    if old.layout != torch.strided or new.layout != torch.strided:
        return False
    same = ("shape", "dtype", "device", "requires_grad")
    return all(getattr(old, name) == getattr(new, name) for name in same) and old.stride() == new.stride()


def _write(torch, old, new) -> None:
    """Copy `new`'s values into `old`'s memory through a tensor of its own over the same storage: a
    write through `old` itself would bump its version counter, which a fresh copy starts at zero."""
    with torch.no_grad():
        over = torch.empty(0, dtype=old.dtype, device=old.device)
        over.set_(old.untyped_storage(), old.storage_offset(), old.shape, old.stride())
        over.copy_(new)


def _raise(verdict: checks.Verdict | None) -> None:
    if verdict is not None:
        raise verdict
