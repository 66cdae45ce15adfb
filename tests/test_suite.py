"""The built-in task suite (speedforge/tasks/suite): its shape, its coverage, its sizes, and that
every hand-written candidate is correct and faster.

The default tests read the package data by parsing it and run only the references (our own
files, so they may run in-process). Candidates compile C++/CUDA and run only through the
evaluator, in the `slow` (cpp) and `gpu` (cuda) tests.
"""

from __future__ import annotations

import ast
import re
import types

import pytest
import torch

from speedforge.evaluator.screen import screen
from speedforge.tasks import builtin_candidates, builtin_tasks
from speedforge.tasks.loader import REQUIRED_NAMES, defined_names

FAMILIES = ("cpp", "cuda")
MIN_TASKS = 12
# One reference call's work, within what one core does in under 100 ms: 2.5 GFLOP of float32 matmul
# (80 ms at 30 GFLOP/s; this 2-core machine's AVX-512 core did 2.1 GFLOP in 27 ms) and a few passes over
# 10 M float32 elements (40 MB, at 2-10 GB/s).
CPP_CALL_MAX_FLOPS = 2.5e9
CPP_CALL_MAX_ELEMENTS = 10_000_000
# Every family must cover each of these; a tuple is satisfied by any one of its categories.
REQUIRED_CATEGORIES = (
    "elementwise",
    "reduction",
    "softmax",
    "normalization",
    "matmul",
    "convolution",
    "fused",
    ("mlp", "attention"),
)
KNOWN_CATEGORIES = {
    "elementwise",
    "reduction",
    "softmax",
    "normalization",
    "matmul",
    "convolution",
    "fused",
    "mlp",
    "attention",
}
CATEGORY_LINE = re.compile(r"^category:\s*(.+)$", re.M)


def _tasks(family: str):
    return {t.name: t for t in builtin_tasks(family)}


def _candidates(family: str):
    return {c.task_id.split("/", 1)[1]: c for c in builtin_candidates(family)}


def _categories(notes: str) -> set[str]:
    match = CATEGORY_LINE.search(notes)
    return {c.strip() for c in match.group(1).split(",")} if match else set()


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(found) == 1, f"expected one class {name}, found {len(found)}"
    return found[0]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"class {cls.name} has no {name}()"
    return found[0]


def _signature(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    names = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg:
        names.append(f"*{args.vararg.arg}")
    return names + [a.arg for a in args.kwonlyargs]


def _exec_reference(task) -> types.ModuleType:
    module = types.ModuleType(f"suite_{task.family}_{task.name}")
    exec(compile(task.source, f"suite/{task.task_id}.py", "exec"), module.__dict__)  # our own package data
    return module


def _params(family: str):
    return [pytest.param(t, id=t.task_id) for t in builtin_tasks(family)]


ALL_TASKS = _params("cpp") + _params("cuda")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_ships_at_least_twelve_tasks_each_with_a_candidate_or_a_note(family: str) -> None:
    tasks, candidates = _tasks(family), _candidates(family)
    assert len(tasks) >= MIN_TASKS
    unbeaten = {name for name, t in tasks.items() if "could not beat" in t.notes.lower()}
    assert set(candidates) == set(tasks) - unbeaten, (
        "a task without a candidate must say it could not beat the reference"
    )
    assert len(unbeaten) <= 3, "most tasks ship a faster candidate"


@pytest.mark.parametrize("task", ALL_TASKS)
def test_reference_is_a_kernelbench_program_with_a_docstring(task) -> None:
    assert set(REQUIRED_NAMES) <= defined_names(task.source)
    lines = task.notes.splitlines()
    assert lines and lines[0].strip().endswith("."), "the docstring's first line is a one-sentence description"
    assert len(lines) > 2, "the docstring carries notes after the description"
    assert _categories(task.notes), "the docstring names its categories on a `category:` line"
    assert _categories(task.notes) <= KNOWN_CATEGORIES


@pytest.mark.parametrize("family", FAMILIES)
def test_family_covers_every_required_category(family: str) -> None:
    covered = set().union(*(_categories(t.notes) for t in builtin_tasks(family)))
    for need in REQUIRED_CATEGORIES:
        options = set(need) if isinstance(need, tuple) else {need}
        assert covered & options, f"{family}: no task in category {' or '.join(sorted(options))}"
    sources = [t.source for t in builtin_tasks(family)]
    assert any("torch.diag(" in s and "@" in s for s in sources), f"{family}: no diag(A) @ B task"
    assert any("conv2d" in s.lower() for s in sources), f"{family}: no convolution task"


@pytest.mark.parametrize("task", ALL_TASKS)
def test_get_inputs_follows_the_device_context(task) -> None:
    """The harness creates inputs under `with torch.device(dev)`: no hard-coded device or .cuda()."""
    module = _exec_reference(task)
    with torch.device("meta"):
        inputs = module.get_inputs()
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    assert tensors, "get_inputs() returns no tensors"
    assert all(x.device.type == "meta" for x in tensors), "get_inputs() places tensors on a fixed device"
    assert all(x.dtype == torch.float32 for x in tensors)
    gib = sum(x.numel() * x.element_size() for x in tensors) / 2**30
    assert gib < (0.25 if task.family == "cpp" else 1.0), f"inputs of {gib:.2f} GiB"


@pytest.mark.parametrize("task", _params("cuda"), ids=lambda t: t.name)
def test_cuda_reference_is_the_cpp_program_with_other_sizes(task) -> None:
    cpp = _tasks("cpp")[task.name]

    def without_sizes(source: str) -> str:
        tree = ast.parse(source)
        body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body  # notes may differ
        tree.body = [
            n
            for n in body
            if not (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets))
        ]
        return ast.dump(tree)

    assert without_sizes(task.source) == without_sizes(cpp.source)


@pytest.mark.parametrize("family", FAMILIES)
def test_candidate_matches_its_reference_signatures_and_weights(family: str) -> None:
    """Same __init__ and forward signatures; __init__ bodies identical, so that both create the
    same parameters under the same seed and the harness's state_dict copy lines up by name."""
    tasks = _tasks(family)
    for name, candidate in _candidates(family).items():
        ref = ast.parse(tasks[name].source)
        new = ast.parse(candidate.source)
        model, model_new = _class(ref, "Model"), _class(new, "ModelNew")
        for method in ("__init__", "forward"):
            assert _signature(_method(model_new, method)) == _signature(_method(model, method)), (name, method)
        init_ref, init_new = _method(model, "__init__"), _method(model_new, "__init__")
        assert [ast.dump(s) for s in init_new.body] == [ast.dump(s) for s in init_ref.body], name


@pytest.mark.parametrize("family", FAMILIES)
def test_candidates_pass_the_static_screen_and_build_one_named_extension(family: str) -> None:
    names = []
    for name, candidate in _candidates(family).items():
        assert screen(candidate.source, family).passed, (name, screen(candidate.source, family).findings)
        tree = ast.parse(candidate.source)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "load_inline"]
        assert len(calls) == 1, name
        kwargs = {k.arg: k.value for k in calls[0].keywords}
        names.append(ast.literal_eval(kwargs["name"]))
        assert ("cuda_sources" in kwargs) == (family == "cuda"), name
        if family == "cuda":
            assert "extra_cuda_cflags" not in kwargs or "arch" not in ast.unparse(kwargs["extra_cuda_cflags"]), name
        else:
            flags = ast.literal_eval(kwargs.get("extra_cflags", ast.Constant([])))
            assert not any("march" in f or "fopenmp" in f for f in flags), (name, flags)
    assert len(set(names)) == len(names), "extension names must be unique across the suite"


@pytest.mark.parametrize("task", _params("cpp"), ids=lambda t: t.name)
def test_cpp_reference_call_is_work_for_well_under_100ms_on_one_core(task) -> None:
    """Counted, not timed: the matmul/convolution FLOPs and the elements touched of one reference
    call stay within what one core does in well under 100 ms (a test machine's load is not the
    task's size)."""
    from torch.utils.flop_counter import FlopCounterMode

    module = _exec_reference(task)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    inputs = module.get_inputs()
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()
    elements = sum(t.numel() for t in (*inputs, out, *model.parameters()) if isinstance(t, torch.Tensor))
    assert flops.get_total_flops() <= CPP_CALL_MAX_FLOPS, f"{flops.get_total_flops() / 1e9:.2f} GFLOP"
    assert elements <= CPP_CALL_MAX_ELEMENTS, f"{elements / 1e6:.1f} M elements"


def _evaluated_candidates():
    """cpp candidates run on the CPU (slow: a compile each); cuda ones need a GPU."""
    return [
        pytest.param(family, name, device, id=f"{family}/{name}", marks=mark)
        for family, device, mark in (("cpp", "cpu", pytest.mark.slow), ("cuda", "cuda", pytest.mark.gpu))
        for name in sorted(_candidates(family))
    ]


@pytest.mark.parametrize(("family", "name", "device"), _evaluated_candidates())
def test_candidate_is_correct_and_faster_in_the_evaluator(family: str, name: str, device: str) -> None:
    from speedforge.evaluator import evaluate

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    result = evaluate(_tasks(family)[name], _candidates(family)[name], device=device)
    assert result.status == "ok", (result.status, result.reason, result.log[-2000:])
    assert result.speedup > 1.0, (
        f"speedup {result.speedup:.2f} (ref {result.ref_us:.0f} us, cand {result.cand_us:.0f} us)"
    )
