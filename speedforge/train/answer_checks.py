"""What a published answer must pass before SFT trains on it: what a sample of the policy is
scored on, checked statically on the answer's code (speedforge.train.data.sft_pairs applies it).

    why = unusable_answer(task, answer, source)   # "" when the answer is usable, else one line

With `train.sft.trust_source` nothing measures a published kernel here, so these checks are all
that stands between SFT and teaching what the evaluator refuses: code our parser would not
extract as written, a screen rejection, a constructor that does not take the reference's
arguments, float32 precision lowered (TF32 matmuls: the evaluator's run-time guard refuses it
unless `allow_precision_downgrade`), and a forward that returns a tensor the module keeps (the
fresh-outputs contract: the same storage every call). The last two are static stand-ins for
run-time checks (speedforge.evaluator.guards, .checks): they name the common shapes in CUDA-L1's
released kernels, not every way to break the contract, which only measuring finds, and are not
made for a program that measured ok here.
"""

from __future__ import annotations

import ast

from speedforge.evaluator.screen import screen
from speedforge.policy.parser import candidate_from
from speedforge.policy.prompts import init_arguments
from speedforge.records import Task


def unusable_answer(
    task: Task, answer: str, source: str, allow_precision_downgrade: bool = False, measured: bool = False
) -> str:
    """Why an answer (holding the program `source`) would teach what a sample fails on, or ""
    when it does not: the code our parser extracts from it (`candidate_from`, as the held-out
    check and every stage do) is not `source`, our screen rejects it (not Python, no ModelNew, a
    named exploit), its ModelNew cannot be built with the arguments the reference's Model takes,
    it lowers float32 precision where the evaluator does not allow it, or its forward returns a
    tensor the module keeps. The last three are read from the code in place of what running it
    checks, and are not made for a program that `measured` ok here: those checks passed."""
    candidate, parsed = candidate_from(task, answer, "sft")
    if parsed.code != source.strip():
        return "our parser extracts other code than the answer holds"
    report = screen(candidate.source, task.family)
    if not report.passed:
        return f"the screen rejects it: {report.rejections[0]}"
    if measured:
        return ""
    if not takes_reference_arguments(task.source, candidate.source):
        return "ModelNew's constructor does not take the arguments of the reference's Model"
    lowered = "" if allow_precision_downgrade else lowered_precision(candidate.source)
    if lowered:
        return f"it lowers float32 precision ({lowered}), which the evaluator refuses (allow_precision_downgrade)"
    kept = kept_output(candidate.source)
    if kept:
        return (
            f"its forward returns a tensor the module keeps ({kept}): the same storage every call, which the "
            "evaluator's fresh-outputs contract refuses"
        )
    return ""


_LOWERING = (
    ("cuda.matmul.allow_tf32", True),
    ("allow_fp16_reduced_precision_reduction", True),
    ("allow_bf16_reduced_precision_reduction", True),
    ("allow_fp16_accumulation", True),
    ("matmul.fp32_precision", "tf32"),
    ("conv.fp32_precision", "tf32"),
    ("fp32_precision", "bf16"),
)


def lowered_precision(code: str) -> str:
    """The first statement of `code` that lowers float32 precision below torch's defaults, as the
    evaluator's run-time guard (speedforge.evaluator.guards.precision_downgrades) would find it
    set: TF32 matmuls, `set_float32_matmul_precision("high")`, reduced-precision reductions;
    "" for none. cuDNN's `allow_tf32 = True` is torch's default, not a downgrade."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                name = ast.unparse(target)
                if any(name.endswith(knob) and node.value.value == value for knob, value in _LOWERING):
                    return ast.unparse(node)
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("set_float32_matmul_precision")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in ("high", "medium")
        ):
            return ast.unparse(node)
    return ""


def takes_reference_arguments(reference: str, code: str, name: str = "ModelNew") -> bool:
    """Whether `name`'s constructor in `code` takes every positional call that the reference's
    `Model` constructor takes (the evaluator calls both with `*get_init_inputs()`); True when
    either has none written out (an inherited constructor, a family without `Model`)."""
    mine, theirs = init_arguments(code, name), init_arguments(reference, "Model")
    if mine is None or theirs is None:
        return True
    positional = lambda a: len(a.posonlyargs) + len(a.args) - 1  # noqa: E731 (less self)
    most, least = positional(theirs), positional(theirs) - len(theirs.defaults)
    if theirs.vararg is not None:
        return mine.vararg is not None
    if any(default is None for default in mine.kw_defaults):  # a keyword-only argument no positional call gives
        return False
    return positional(mine) - len(mine.defaults) <= least and (positional(mine) >= most or mine.vararg is not None)


def kept_output(code: str) -> str:
    """The first `return self.<name>` (or an item of it) in ModelNew's forward, or in a method of
    ModelNew whose call forward returns, whose attribute that method does not first assign
    unconditionally: an output buffer or a CUDA graph's static output returned as is, the same
    storage on every call; "" for none."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return ""
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "ModelNew"):
            continue
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        forward = methods.get("forward")
        if forward is None:
            return ""
        found = _returns_kept(forward)
        for node in ast.walk(forward):
            call = node.value if isinstance(node, ast.Return) else None
            if found or not isinstance(call, ast.Call) or not _on_self(call.func) or call.func.attr not in methods:
                continue
            inner = _returns_kept(methods[call.func.attr])
            found = f"{ast.unparse(node)}, which does {inner}" if inner else ""
        return found
    return ""


def _returns_kept(method: ast.FunctionDef) -> str:
    fresh = {
        ast.unparse(t) for statement in method.body if isinstance(statement, ast.Assign) for t in statement.targets
    }
    for node in ast.walk(method):
        if isinstance(node, ast.Return) and node.value is not None:
            base = node.value.value if isinstance(node.value, ast.Subscript) else node.value
            if _on_self(base) and ast.unparse(base) not in fresh:
                return ast.unparse(node)
    return ""


def _on_self(node: ast.AST) -> bool:
    """`self.<name>`."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
