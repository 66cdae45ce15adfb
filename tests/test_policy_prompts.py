"""Contrastive prompts: package-data templates per family holding exemplars, scores and rules."""

import pytest

from speedforge import families
from speedforge.errors import UserError
from speedforge.policy.prompts import (
    Exemplar,
    Feedback,
    exemplars_from_variants,
    feedback_from_result,
    render_prompt,
)
from speedforge.records import EvalResult, Task, Variant

REFERENCE = '''"""Add and relu."""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.relu(a + b)

def get_inputs():
    return [torch.randn(64, 64), torch.randn(64, 64)]

def get_init_inputs():
    return []
'''
SLOW = "class ModelNew(nn.Module):\n    # slow variant\n    pass"
FAST = "class ModelNew(nn.Module):\n    # fast variant\n\n\n    pass"
SECTIONS = ("### Performance Analysis", "### Algorithm Design", "### Code Implementation")


def task(family: str = "cpp") -> Task:
    return Task(task_id=f"{family}/add_relu", family=family, name="add_relu", source=REFERENCE, notes="Add and relu.")


def test_prompt_holds_reference_exemplars_scores_devices_rules_and_sections():
    exemplars = [Exemplar("s", SLOW, 1.234, "AMD EPYC 7B13"), Exemplar("f", FAST, 3.5, "NVIDIA H100 80GB HBM3")]
    prompt = render_prompt(task("cuda"), exemplars)
    text = prompt.user
    assert REFERENCE.rstrip() in text
    assert SLOW in text and FAST in text  # exemplar code verbatim, blank lines included
    assert "1.23x speedup, measured on AMD EPYC 7B13" in text
    assert "3.50x speedup, measured on NVIDIA H100 80GB HBM3" in text
    assert text.index("1.23x") < text.index("3.50x")
    for rule in (
        "Same function",
        "Keep the inputs, sizes and hyperparameters",
        "No caching",
        "No side streams",
        "must compile",
    ):
        assert rule in text
    positions = [text.index(s) for s in SECTIONS]
    assert positions == sorted(positions)
    assert "which one is fastest, and why" in text
    assert prompt.exemplar_ids == ("s", "f")
    assert [m["role"] for m in prompt.messages()] == ["system", "user"]


def test_prompt_without_exemplars_says_so_and_does_not_ask_to_compare():
    text = render_prompt(task()).user
    assert "None has been measured yet" in text
    assert "which one is fastest" not in text
    assert "Speedup = reference time" not in text
    assert all(s in text for s in SECTIONS)


def ann_task() -> Task:
    from speedforge.ann.tasks import builtin_tasks

    return next(t for t in builtin_tasks() if t.task_id == "ann/sift-search")


def test_every_family_has_a_template_with_its_code_language():
    assert families.names() == ["ann", "cpp", "cuda"]
    for t in (task("cpp"), task("cuda"), ann_task()):
        text = render_prompt(t, [Exemplar("x", "int main() {}", 1.5, "cpu")]).user
        assert "1.50x speedup, measured on cpu" in text
        assert ("```cpp" in text) == (t.family == "ann")
    assert "on the CPU" in render_prompt(task("cpp")).user
    assert "CUDA" in render_prompt(task("cuda")).user


def test_ann_prompt_shows_the_benchmark_spec_and_the_engine_module_it_replaces():
    from speedforge.ann.tasks import reference_source

    t = ann_task()
    text = render_prompt(t).user
    assert t.source.strip() in text  # the YAML spec: data set, index parameters, sweep
    assert reference_source(t).rstrip() in text  # the baseline C++ of src/search.cc
    assert "`sfann::make_searcher()`" in text and "C++ source of `src/search.cc`" in text
    assert "QPS-recall" in text
    assert "About this task" not in text  # the spec's first comment line says it already


def test_unknown_family_is_a_clear_error():
    with pytest.raises(UserError, match="no prompt template for task family 'rust'"):
        render_prompt(task("rust"))


def test_feedback_shows_the_status_reason_and_log_tail():
    result = EvalResult(
        candidate_id="c",
        task_id="cpp/add_relu",
        pool="cpu",
        status="compile_error",
        reason="the C++ extension did not build",
        log="x" * 5000 + "\nerror: 'foo' was not declared",
    )
    feedback = feedback_from_result(result, log_chars=200)
    assert len(feedback.log) == 200
    text = render_prompt(task(), feedback=feedback).user
    assert "Your last attempt failed: compile_error" in text
    assert "the C++ extension did not build" in text
    assert "error: 'foo' was not declared" in text
    assert "x" * 300 not in text
    assert "last attempt" not in render_prompt(task()).user
    assert render_prompt(task(), feedback=Feedback("timeout", "ran past 300 s")).user.count("```text") == 0


def test_exemplars_from_variants_use_device_names_when_known():
    rows = [
        Variant(variant_id="a", task_id="t", pool="H100", source="A", status="ok", score=2.0),
        Variant(variant_id="b", task_id="t", pool="cpu", source="B", status="ok", score=1.1),
        Variant(variant_id="c", task_id="t", pool="cpu", source="C", status="incorrect", score=None),
    ]
    exemplars = exemplars_from_variants(rows, {"b": "Intel Xeon"})
    assert [(e.variant_id, e.speedup, e.device) for e in exemplars] == [("a", 2.0, "H100"), ("b", 1.1, "Intel Xeon")]


def test_task_notes_shown_only_when_not_already_in_the_source():
    assert "About this task" not in render_prompt(task()).user
    other = Task(task_id="cpp/x", family="cpp", name="x", source=REFERENCE, notes="Imported from KernelBench level 1.")
    assert "About this task: Imported from KernelBench level 1." in render_prompt(other).user


def test_the_prompt_repeats_the_references_constructor_for_model_new() -> None:
    """After SFT the 135M model wrote ModelNew with another task's constructor in 68 of 128
    held-out samples; the rule names the reference's own parameters."""
    from speedforge.policy.prompts import init_signature

    source = (
        "import torch\nclass Model(torch.nn.Module):\n    def __init__(self, in_channels, out_channels, "
        "kernel_size=3, *, bias: bool = True):\n        super().__init__()\n"
    )
    assert init_signature(source) == "self, in_channels, out_channels, kernel_size=3, *, bias: bool=True"
    task = Task(task_id="cuda/conv", family="cuda", name="conv", source=source)
    assert (
        "`ModelNew`'s constructor is `def __init__(self, in_channels, out_channels, kernel_size=3, *, bias: bool=True):`"
        in render_prompt(task).user
    )


def test_no_constructor_line_when_the_reference_has_none_or_does_not_parse() -> None:
    from speedforge.policy.prompts import init_signature

    assert init_signature("class Model:\n    def forward(self, x):\n        return x\n") == ""
    assert init_signature("class Model(:\n") == ""
    task = Task(task_id="cuda/x", family="cuda", name="x", source="class Model:\n    pass\n")
    assert "constructor is" not in render_prompt(task).user
