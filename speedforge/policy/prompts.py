"""Contrastive prompts, rendered from the per-family templates shipped in policy/templates/.

A prompt shows the task, its reference code, earlier variants with the speedups measured for
them and the device they were measured on, the hard rules, the failure of the last attempt
(its log feeds the next prompt), and asks for three sections: Performance Analysis, Algorithm
Design, Code Implementation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from importlib import resources

import jinja2

from speedforge import families
from speedforge.errors import UserError
from speedforge.records import EvalResult, Task, Variant

SYSTEM_PROMPT = (
    "You are an expert performance engineer. You make programs faster without changing what they "
    "compute, and you explain your reasoning before you write code."
)


@dataclasses.dataclass(frozen=True)
class Exemplar:
    """An earlier variant as the prompt shows it."""

    variant_id: str
    source: str
    speedup: float
    device: str  # where the speedup was measured: the device name, else the pool


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The failure of the last attempt, shown so the next one can avoid it."""

    status: str
    reason: str
    log: str = ""


@dataclasses.dataclass(frozen=True)
class Prompt:
    """A rendered prompt and the variants it shows (the parents of what it produces)."""

    family: str
    system: str
    user: str
    exemplar_ids: tuple[str, ...]

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


def exemplars_from_variants(variants: Sequence[Variant], devices: Mapping[str, str] | None = None) -> list[Exemplar]:
    """Exemplars for scored variants; `devices` maps variant ids to the device name measured on."""
    devices = devices or {}
    return [
        Exemplar(v.variant_id, v.source, v.score, devices.get(v.variant_id) or v.pool)
        for v in variants
        if v.score is not None
    ]


def feedback_from_result(result: EvalResult, log_chars: int) -> Feedback:
    """The failure of a result, with the tail of its log (the compiler log or stderr)."""
    log = result.log[-log_chars:] if log_chars > 0 else ""
    return Feedback(status=result.status, reason=result.reason or result.status, log=log)


def _template_source(name: str) -> str:
    entry = resources.files("speedforge.policy").joinpath("templates").joinpath(name)
    if not entry.is_file():
        raise jinja2.TemplateNotFound(name)
    return entry.read_text()


_ENV = jinja2.Environment(
    loader=jinja2.FunctionLoader(_template_source),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)


def render_prompt(task: Task, exemplars: Sequence[Exemplar] = (), feedback: Feedback | None = None) -> Prompt:
    """The contrastive prompt for one task."""
    family = families.find(task.family)
    if family is None:
        raise UserError(f"no prompt template for task family {task.family!r}; known: {', '.join(families.names())}")
    template = _ENV.get_template(family.template)
    # extra template variables of the family; by default the reference code is the task's source
    context = families.resolve(family.prompt_context)(task) if family.prompt_context else {"reference": task.source}
    user = template.render(
        task=task, exemplars=list(exemplars), feedback=feedback, init_signature=init_signature(task.source), **context
    )
    return Prompt(
        family=task.family,
        system=SYSTEM_PROMPT,
        user=_squeeze_blank_lines(user),
        exemplar_ids=tuple(e.variant_id for e in exemplars),
    )


@functools.lru_cache(maxsize=256)
def init_signature(source: str) -> str:
    """`Model.__init__`'s parameters as written in the reference (`self, in_channels, ...`), or ""
    when the source has no such class or does not parse. The prompt repeats them for ModelNew:
    after SFT, SmolLM2-135M wrote ModelNew with the constructor of a training task in 68 of 128
    held-out samples (docs/benchmarks/training.md)."""
    import ast

    arguments = init_arguments(source, "Model")
    return ast.unparse(arguments) if arguments is not None else ""


def init_arguments(source: str, cls: str):
    """The `ast.arguments` of class `cls`'s own `__init__` in `source` (a top-level class), or None
    when there is none or the source does not parse."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return item.args
    return None


def _squeeze_blank_lines(text: str) -> str:
    """At most one blank line in a row outside code blocks (the templates leave extras)."""
    out: list[str] = []
    in_code = False
    for line in text.strip().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or line.strip() or (out and out[-1].strip()):
            out.append(line.rstrip())
    return "\n".join(out) + "\n"
