"""The reference's fingerprint (speedforge.evaluator.fingerprint) against honest candidates the
field writes: CUDA-L1's published level-3 kernels read `hack_detected` ("features.0: its class
changed") on an H100 because their constructors run torch.jit.script, which reads
`nn.Conv2d.__annotations__` and so adds an empty dict to the class's namespace; and its level3/41
GRU reference (a CPU `h0` beside CUDA weights) read `infra_error`, the fingerprint's sums stacked
across devices. The check itself must still see a method swapped on the reference's class."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate, fingerprint
from speedforge.records import Candidate, Task

TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.classifier = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def get_inputs():
    return [torch.randn(2, 3, 16, 16)]


def get_init_inputs():
    return []
"""

# the reference's own code as ModelNew, its layers scripted in the constructor as CUDA-L1's
# level3/11 and level3/20 do
SCRIPTED = TASK.replace("class Model(", "class ModelNew(").replace(
    "        self.classifier = nn.Linear(8 * 8 * 8, 10)\n",
    "        self.classifier = nn.Linear(8 * 8 * 8, 10)\n"
    "        self.features = torch.jit.script(self.features)\n"
    "        self.classifier = torch.jit.script(self.classifier)\n",
)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    return EvaluatorConfig(
        screen="report",
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        run_timeout_s=120.0,
        correctness_trials=3,
        cpu_timed_calls=5,
        min_timed_s=0.0,
        max_timed_calls=5,
        warmup_calls=2,
    )


def test_a_candidate_that_scripts_its_own_layers_is_ok(config) -> None:
    assert "torch.jit.script(self.features)" in SCRIPTED
    task = Task(task_id="test/scripted_layers", family="cpp", name="scripted_layers", source=TASK)
    result = evaluate(task, Candidate.make(task.task_id, SCRIPTED), config)
    assert result.status == "ok", (result.status, result.reason, result.log[-2000:])


class _Fresh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


def test_reading_a_class_annotations_leaves_the_fingerprint_as_it_was() -> None:
    class Layer(nn.Linear):
        pass

    model = nn.Sequential(Layer(4, 4))
    before = fingerprint.take(torch, model)
    assert "__annotations__" not in vars(Layer)
    Layer.__annotations__  # noqa: B018 -- Python adds an empty dict to the class on first read
    assert "__annotations__" in vars(Layer)  # what torch.jit.script's read leaves behind
    assert fingerprint.changed(before, fingerprint.take(torch, model)) == ""


def test_a_method_swapped_on_the_reference_class_still_changes_the_fingerprint() -> None:
    class Reference(_Fresh):
        pass

    model = Reference()
    before = fingerprint.take(torch, model)
    Reference.forward = lambda self, x: x * 0  # a candidate's sabotage of the reference's class
    assert fingerprint.changed(before, fingerprint.take(torch, model)) == "the model: its class changed"


def test_tensors_kept_beside_the_parameters_are_summed_with_them() -> None:
    """A plain tensor attribute (level3/41's `h0`, which `.to(device)` does not move) is in the
    fingerprint, and a write to it through `.data` is seen."""
    model = _Fresh()
    model.h0 = torch.randn(2, 4)
    before = fingerprint.take(torch, model)
    assert len(before[1]) == 3  # weight, bias, h0
    model.h0.data.mul_(0)
    assert fingerprint.changed(before, fingerprint.take(torch, model)).startswith("the values of its tensor")


def _deep() -> nn.Module:
    """Many submodules of a few classes, as a DenseNet's 526 (the fingerprint's fast paths: one
    class read per fingerprint, containers and scalars found by their type)."""
    return nn.Sequential(*[nn.Sequential(nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4)) for _ in range(60)])


def test_a_hook_on_one_of_many_submodules_of_one_class_changes_the_fingerprint() -> None:
    model = _deep()
    before = fingerprint.take(torch, model, values=False)
    model[41][2].register_forward_hook(lambda module, args, out: out * 0)
    assert (
        fingerprint.changed(before, fingerprint.take(torch, model, values=False))
        == "41.2: its attributes changed (_forward_hooks)"
    )


def test_a_number_or_flag_changed_in_one_of_many_submodules_is_seen() -> None:
    model = _deep()
    before = fingerprint.take(torch, model, values=False)
    model[57][0].eps = 0.5  # a float in a module's own attributes
    assert (
        fingerprint.changed(before, fingerprint.take(torch, model, values=False))
        == "57.0: its attributes changed (eps)"
    )
    before = fingerprint.take(torch, model, values=False)
    model[3][1].inplace = True  # a bool
    assert (
        fingerprint.changed(before, fingerprint.take(torch, model, values=False))
        == "3.1: its attributes changed (inplace)"
    )
    before = fingerprint.take(torch, model, values=False)
    model[9][2]._parameters["bias"] = nn.Parameter(torch.zeros(4))  # an entry of an OrderedDict, swapped
    assert (
        fingerprint.changed(before, fingerprint.take(torch, model, values=False))
        == "9.2: its attributes changed (_parameters)"
    )


def test_a_method_swapped_on_a_class_many_submodules_share_is_seen_at_the_first_of_them() -> None:
    class Shared(nn.ReLU):
        pass

    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), Shared()) for _ in range(30)])
    before = fingerprint.take(torch, model, values=False)
    Shared.forward = lambda self, x: x * 0
    assert fingerprint.changed(before, fingerprint.take(torch, model, values=False)) == "0.1: its class changed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_model_with_tensors_on_two_devices_has_a_fingerprint() -> None:
    model = _Fresh().cuda()
    model.h0 = torch.randn(2, 4)  # on the CPU, beside CUDA weights
    taken = fingerprint.take(torch, model)
    assert len(taken[1]) == 3
