"""Parse a policy response: the three required sections and the final code block.

Tolerant of what models write: headings as `### X`, `**X**`, `1. X:` or `X:`; extra prose
around the sections; a code block without a language tag, without a closing fence (a response
cut off by the token limit), or with no fences at all. What could not be found is reported in
`missing`, and how the code was found in `notes`, so a failed sample says why.
"""

from __future__ import annotations

import dataclasses
import re

SECTIONS = ("Performance Analysis", "Algorithm Design", "Code Implementation")
CODE = "code"  # the name `missing` uses for an answer without code

_HEADING = re.compile(
    r"^\s*(?P<marks>(?:#{1,6}\s*)?(?:[*_]{1,2}\s*)?(?:(?:step|section|part)\s*)?(?:\d+\s*[.):]\s*)?(?:[*_]{1,2}\s*)?)"
    r"(?P<title>performance\s+analysis|algorithm\s+design|code\s+implementation)\b"
    r"\s*(?P<close>[*_]{0,2}\s*:?\s*[*_]{0,2})(?P<rest>.*)$",
    re.IGNORECASE,
)
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+#.-]*)")
_LANGUAGES = {
    "python": {"python", "py", "python3", ""},
    "cpp": {"cpp", "c++", "cc", "cxx", "c", "cuda", "cu", "h", "hpp", ""},
}
_CODE_START = {
    "python": re.compile(r"^(import |from \w[\w.]* import |class \w|def \w|@)"),
    "cpp": re.compile(r"^(#include|#pragma|namespace |template\s*<|struct |class |using |static |inline )"),
}


@dataclasses.dataclass(frozen=True)
class ParsedResponse:
    """What a response contained; empty strings where something was missing."""

    analysis: str  # Performance Analysis
    design: str  # Algorithm Design
    code: str  # the final code block
    missing: tuple[str, ...]  # section titles and/or "code" that were not found
    notes: tuple[str, ...] = ()  # how the code was found, when not from a closed fence

    @property
    def complete(self) -> bool:
        return not self.missing

    def describe_missing(self) -> str:
        return "missing: " + ", ".join(self.missing) if self.missing else "complete"


@dataclasses.dataclass
class _Block:
    language: str
    lines: list[str]
    closed: bool


def _scan(text: str) -> tuple[list[tuple[int, str, str]], list[_Block]]:
    """Headings outside code blocks as (line index, title, rest of line), and the fenced blocks."""
    headings: list[tuple[int, str, str]] = []
    blocks: list[_Block] = []
    open_block: _Block | None = None
    fence = ""
    for index, line in enumerate(text.splitlines()):
        match = _FENCE.match(line)
        if open_block is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) and not match.group(2):
                open_block.closed = True
                open_block = None
            else:
                open_block.lines.append(line)
            continue
        if match:
            fence = match.group(1)
            open_block = _Block(match.group(2).lower(), [], False)
            blocks.append(open_block)
            continue
        heading = _HEADING.match(line)
        if heading and (
            heading.group("marks").strip() or heading.group("close").strip() or not heading.group("rest").strip()
        ):
            title = " ".join(w.capitalize() for w in heading.group("title").split())
            headings.append((index, title, heading.group("rest").strip(" *_:")))
    return headings, blocks


def _sections(text: str, headings: list[tuple[int, str, str]]) -> dict[str, str]:
    """Each section's text up to the next heading; the last non-empty occurrence wins."""
    lines = text.splitlines()
    found: dict[str, str] = {}
    for n, (index, title, rest) in enumerate(headings):
        end = headings[n + 1][0] if n + 1 < len(headings) else len(lines)
        body = "\n".join([rest] + lines[index + 1 : end]).strip()
        if body or title not in found:
            found[title] = body
    return found


def _pick_block(blocks: list[_Block], language: str, marker: str) -> _Block | None:
    """The last block that defines `marker` (in the expected language first), else the last block
    in the expected language (one that mentions `marker` first), else the last block. A block that
    only uses `marker` (a usage example after the program, `ModelNew(*get_init_inputs())`) never
    wins over one that defines it."""
    accepted = _LANGUAGES.get(language, {language, ""})
    filled = [(index, b, "\n".join(b.lines)) for index, b in enumerate(blocks) if "\n".join(b.lines).strip()]
    if not filled:
        return None

    def rank(item: tuple[int, _Block, str]) -> tuple:
        index, block, text = item
        return (_defines(text, marker, language), block.language in accepted, bool(marker) and marker in text, index)

    return max(filled, key=rank)[1]


def _defines(code: str, marker: str, language: str) -> bool:
    """Whether `code` defines `marker`: a class, function or assignment of that name in Python."""
    if not marker or language != "python":
        return False
    name = re.escape(marker)
    return re.search(rf"^\s*(?:class|def)\s+{name}\b|^{name}\s*=", code, re.MULTILINE) is not None


def _unfenced_code(text: str, language: str) -> str:
    """Code written without fences: from the first line that starts code to the end."""
    start = _CODE_START.get(language)
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if start is not None and start.match(line):
            return "\n".join(lines[index:]).strip()
    return ""


def parse_response(text: str, language: str = "python", marker: str = "ModelNew") -> ParsedResponse:
    """Sections and final code of a response; `marker` names what the code must define, if known."""
    text = (text or "").replace("\r\n", "\n")
    headings, blocks = _scan(text)
    sections = _sections(text, headings)
    notes: list[str] = []
    block = _pick_block(blocks, language, marker)
    if block is not None:
        code = "\n".join(block.lines).strip()
        if not block.closed:
            notes.append("code fence not closed (the response may have been cut off)")
    else:
        source = sections.get("Code Implementation") or text
        code = _unfenced_code(source, language)
        if code:
            notes.append("code found without a fence")
    missing = [title for title in SECTIONS if not sections.get(title)]
    if "Code Implementation" in missing and code:
        missing.remove("Code Implementation")  # the code block itself is the section's content
    if not code:
        missing.append(CODE)
    elif marker and marker not in code:
        notes.append(f"the code does not mention {marker}")
    return ParsedResponse(
        analysis=sections.get("Performance Analysis", ""),
        design=sections.get("Algorithm Design", ""),
        code=code,
        missing=tuple(missing),
        notes=tuple(notes),
    )


def candidate_from(task, text: str, origin: str, parent_ids=(), **meta):
    """The candidate an answer proposes, and the parsed answer: its last code block in the task
    family's language (the one defining the family's marker), or the whole answer when it has
    none, so the evaluator records why it fails. `meta` (e.g. finish_reason) goes to the
    candidate's meta_json with what the parser missed and noted. The one way from a response to
    a candidate: the search loop, every training stage and the held-out check use it."""
    import json

    from speedforge import families
    from speedforge.records import Candidate

    family = families.get(task.family)
    parsed = parse_response(text, language=family.language, marker=family.marker)
    details = {"missing": list(parsed.missing), "notes": list(parsed.notes), **meta}
    candidate = Candidate.make(
        task.task_id, parsed.code or text, origin=origin, parent_ids=tuple(parent_ids), meta_json=json.dumps(details)
    )
    return candidate, parsed
