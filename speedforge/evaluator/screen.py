"""Static screen: a table of rules checked against a candidate's source before anything runs.

Only named exploits reject (`Rule.rejects`): patched timers or torch functions, threads and
processes, network, tensor subclasses, introspection, raw memory, dynamic code, falling back to
the reference. Patterns that are merely risky (a swallowed exception, `data_ptr()`, a cudnn
knob, a CUDA event) are findings: recorded on the result and left to the run-time layers, which
see what actually ran (`Rule.at_run_time` says which layer catches an abuse).

Two passes: the Python AST of the candidate, and C++/CUDA source (every string constant of the
candidate that is not a docstring, or, for the `ann` family, the whole file, comments stripped).
`rules_table()` renders the table for the documentation (docs/hooks.py); the adversarial suite holds a trick per rule.
"""

from __future__ import annotations

import ast
import dataclasses
import re

from speedforge import families


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    reason: str  # shown to users after the construct that was seen
    rejects: bool  # True only for a named exploit; False: a finding, checked at run time
    at_run_time: str  # the run-time layer that catches an abuse of it
    cpp: str = ""  # regex over C++/CUDA source, when the rule has a C++ side


_SAME_OUTPUTS = "fresh inputs every call; every output checked; aliasing of inputs or earlier outputs refused"
RULES = (
    # named exploits: rejected in enforce mode
    Rule("not-python", "not valid Python, so it cannot be screened", True, "the import fails"),
    Rule(
        "no-model-new", "defines no ModelNew (class or name): nothing to evaluate", True, "runtime_error: no ModelNew"
    ),
    Rule("reference-fallback", "falls back to the reference Model", True, "it is timed as the reference: no speedup"),
    Rule(
        "patch",
        "patches a module's functions (the timer or the check would lie)",
        True,
        "function tables of every module of torch and of the standard library loaded, torch.cuda.Event and the "
        "evaluator's own modules and classes compared after every phase; speedforge's modules sealed",
        r"\b(?:cudaError_t|CUresult)\s+(?:\w+\s+)?(?:cudaEvent\w*|cuEvent\w*|cudaStreamSynchronize"
        r"|cudaDeviceSynchronize|cuStreamSynchronize|cuCtxSynchronize)\s*\(",
    ),
    Rule(
        "threads",
        "threads (work can finish after the timer stops)",
        True,
        "thread starts counted, /proc/self/task compared after every phase",
        r"\bstd::j?thread\b|\bpthread_create\b|\bstd::async\b|#\s*pragma\s+omp\b|\bomp_\w+\s*\(",
    ),
    Rule(
        "processes",
        "processes or signals (work outside the timer and the sandbox's view)",
        True,
        "PID namespace, process limit, process starts counted",
        r"\b(?:fork|vfork|system|popen|posix_spawnp?|exec[lv]p?e?|syscall|kill)\s*\(",
    ),
    Rule(
        "network",
        "network access (fetching answers, leaking data)",
        True,
        "a network namespace with no interfaces",
        r"\b(?:socket|connect|getaddrinfo|gethostbyname|curl_easy_init)\s*\(",
    ),
    Rule(
        "tensor-subclass",
        "tensor subclasses (lazy results computed after the timer)",
        True,
        "outputs must be plain torch.Tensor",
    ),
    Rule(
        "introspection",
        "frame, heap or harness introspection (reaching what measures it)",
        True,
        "function tables compared after every phase",
    ),
    Rule(
        "raw-memory",
        "raw memory or native loading (can rewrite anything in the process)",
        True,
        "nothing reliable: rejected here",
        r"\b(?:dlopen|dlsym|mprotect|ptrace|mmap|process_vm_writev|process_vm_readv)\s*\(|/proc/self/mem",
    ),
    Rule(
        "dynamic-code",
        "code built at run time (hides what it does from this screen)",
        True,
        "the guards, on whatever it did",
    ),
    Rule(
        "computed-getattr",
        "an attribute reached by a name built at run time (getattr() with a computed name on "
        "anything but self, getattr passed around, attrgetter, a name resolver): hides from this screen what it "
        "reaches (frames, sys.modules, the harness's own objects)",
        True,
        "the reference's fingerprint, on a change to the reference; for the harness, its sealed modules, the timer's "
        "bound methods and the function tables, not its live objects",
    ),
    Rule(
        "sleep",
        "sleeps in C++ or on the GPU (stalls a worker; with threads, finishes work late)",
        True,
        "the time limit",
        r"\b(?:sleep|usleep|nanosleep|__nanosleep)\s*\(|\bsleep_for\b|\bsleep_until\b",
    ),
    # risky patterns: findings recorded on the result, checked at run time
    Rule(
        "exception-fallback",
        "swallows an exception (a silent fallback)",
        False,
        "a fallback's outputs are checked like any other: " + _SAME_OUTPUTS,
    ),
    Rule(
        "os-sys", "imports os or sys", False, "their risky parts have rules of their own; the sandbox confines the rest"
    ),
    Rule(
        "environment",
        "environment variables",
        False,
        "the sandbox's environment is scrubbed of credentials",
        r"\b(?:secure_)?getenv\s*\(|\benviron\b",
    ),
    Rule(
        "file-access",
        "file access",
        False,
        "Landlock: writes only to its private temp and build dirs (within a disk quota), its own /dev/shm "
        "and /dev/null-like devices; a private /proc",
        r"\b(?:fopen|freopen|unlink)\s*\(|\bstd::[io]?fstream\b|\bstd::filesystem\b|\b(?:open|remove)\s*\(\s*\"",
    ),
    Rule(
        "descriptors",
        "raw file-descriptor work (writing to, copying over or closing a descriptor it did not open)",
        False,
        "the verdict channel: a result authenticated by a nonce the parent hands out once, after the candidate's "
        "last call; any other bytes on it are hack_detected, a descriptor taken from the harness ends the run without "
        "a result",
        r"/proc/self/fd|/dev/fd/|\bdup[23]?\s*\(|\bclose_range\s*\(",
    ),
    Rule(
        "clock",
        "reads a clock",
        False,
        "the harness's timers are captured before import; every timed output checked",
        r"\bclock_gettime\b|\bgettimeofday\b|\brdtsc\b|\bstd::chrono\b|\bclock64\s*\(",
    ),
    Rule("pointer-cache", "data pointers (caching by address)", False, _SAME_OUTPUTS),
    Rule("global-state", "module-level state kept across calls", False, _SAME_OUTPUTS),
    Rule("weakref", "weak references (object lifetime tricks)", False, _SAME_OUTPUTS),
    Rule(
        "dynamic-setattr",
        "setattr()/delattr(), or a dunder assigned, on an object of its own",
        False,
        "function tables compared after every phase",
    ),
    Rule(
        "backend-knob",
        "changes a global torch setting (cudnn, TF32, threads, compiler config)",
        False,
        "global torch settings watched by the run-time guards",
    ),
    Rule(
        "side-stream",
        "side CUDA streams",
        False,
        "a device-wide synchronize before the end event counts their work; a switched current stream is caught",
        r"\bcudaStreamCreate\w*|\bgetStreamFromPool\b|\bcudaStreamNonBlocking\b|\bgetStreamFromExternal\b"
        r"|\bsetCurrentCUDAStream\b|\bCUDAStreamGuard\b|\bcudaStreamPerThread\b",
    ),
    Rule(
        "cuda-events",
        "CUDA events or graphs",
        False,
        "the harness times with its own events, captured before import; " + _SAME_OUTPUTS,
        r"\bcudaEvent\w*|\bcudaGraph\w*|\bcuEvent\w*|\bcuGraph\w*|\bCUDAEvent\b|\bCUDAGraph\b",
    ),
    Rule(
        "static-cache",
        "static tensors or maps in C++ (outputs kept across calls)",
        False,
        _SAME_OUTPUTS,
        r"\bstatic\s+(?:const\s+)?(?:torch::Tensor|at::Tensor|std::(?:unordered_)?map\b"
        r"|std::vector\s*<\s*(?:torch|at)::Tensor)",
    ),
)
RULE = {rule.id: rule for rule in RULES}
_CPP = [(rule, re.compile(rule.cpp)) for rule in RULES if rule.cpp]


def _each(names: str, rule: str, prefix: str = "") -> dict[str, str]:
    return {prefix + name: rule for name in names.split()}


# Python: modules (and their submodules) whose import is a finding or a rejection
MODULES = {
    **_each("threading _thread concurrent asyncio", "threads"),
    **_each("subprocess multiprocessing signal resource psutil pty torch.multiprocessing", "processes"),
    **_each("socket ssl http urllib urllib3 requests httpx aiohttp ftplib smtplib socketserver xmlrpc", "network"),
    **_each("ctypes _ctypes cffi mmap", "raw-memory"),
    **_each("importlib pickle marshal runpy code codeop dill cloudpickle shelve zipimport", "dynamic-code"),
    **_each("gc inspect speedforge sf_candidate __main__", "introspection"),
    **_each("torch.utils._python_dispatch torch.overrides", "tensor-subclass"),
    **_each("pathlib shutil tempfile glob io", "file-access"),
    **_each("time timeit", "clock"),
    **_each("os sys", "os-sys"),
    "sf_reference": "reference-fallback",
    "builtins": "patch",
    "unittest.mock": "patch",
    "weakref": "weakref",
}
# top-level modules on MODULES (and os, sys): also judged where another module hands one on as an
# attribute (torch re-exports sys, os, inspect and ctypes as globals of its own)
_TOP_MODULES = {name for name in MODULES if "." not in name}
# a library's own submodule named like one of them: not that module
NAMESAKES = {"torch.signal"}
# reached as an attribute of anything (a module kept on self, `self.t.sys.modules`; a module's
# global): judged as that module, a path through it as a path through the module. Names an honest
# object's attribute would not have; the rest of _TOP_MODULES (time, io, code, signal, ...) only
# through a module.
ANY_OBJECT_MODULES = frozenset(
    "sys os ctypes _ctypes inspect gc importlib builtins subprocess multiprocessing "
    "threading _thread socket pickle marshal".split()
)
# Python: names reached through a module (imports and aliases resolved), this name or below
NAMES = {
    **_each(
        "fork forkpty system popen execl execle execlp execlpe execv execve execvp execvpe spawnl spawnle "
        "spawnlp spawnlpe spawnv spawnve spawnvp spawnvpe posix_spawn posix_spawnp kill killpg",
        "processes",
        "os.",
    ),
    **_each("environ environb getenv getenvb putenv unsetenv", "environment", "os."),
    **_each(
        "open listdir scandir walk remove unlink rename renames replace mkdir makedirs rmdir removedirs chmod "
        "chown symlink link chdir truncate mkfifo",
        "file-access",
        "os.",
    ),
    **_each(
        "write writev pwrite pwritev read readv pread dup dup2 close closerange fdopen pipe pipe2 set_inheritable "
        "set_blocking sendfile splice copy_file_range",
        "descriptors",
        "os.",
    ),
    "io.FileIO": "descriptors",
    "io.open": "descriptors",
    **_each(
        "_getframe _current_frames settrace setprofile addaudithook modules meta_path path_hooks",
        "introspection",
        "sys.",
    ),
    **_each("Stream ExternalStream stream streams set_stream StreamContext", "side-stream", "torch.cuda."),
    **_each("Event CUDAGraph graph graphs make_graphed_callables", "cuda-events", "torch.cuda."),
    **_each(
        "set_num_threads set_num_interop_threads set_float32_matmul_precision set_flush_denormal "
        "use_deterministic_algorithms set_default_dtype",
        "backend-knob",
        "torch.",
    ),
    "torch.cuda._sleep": "sleep",
    **_each(
        "operator.attrgetter operator.methodcaller pkgutil.resolve_name pydoc.locate string.Formatter",
        "computed-getattr",
    ),
    "contextlib.suppress": "exception-fallback",
}
# Python: attributes suspicious on any object
ATTRIBUTES = {
    "data_ptr": "pointer-cache",
    "__getattribute__": "computed-getattr",
    "__traceback__": "introspection",
    **_each("_make_subclass _make_wrapper_subclass __torch_function__ __torch_dispatch__", "tensor-subclass"),
    **_each(
        "_getframe settrace setprofile f_back f_globals f_locals f_builtins tb_frame gi_frame cr_frame "
        "__globals__ __code__ __closure__ __subclasses__ __dict__",
        "introspection",
    ),
    **_each("Stream ExternalStream set_stream", "side-stream"),
    "__builtins__": "patch",
}
BUILTIN_CALLS = {
    **_each("eval exec compile __import__ breakpoint", "dynamic-code"),
    "open": "file-access",
    "vars": "introspection",
    "globals": "global-state",
}
DYNAMIC_BUILTINS = frozenset(name for name, rule in BUILTIN_CALLS.items() if rule == "dynamic-code")
SETTINGS = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.")  # knobs, not functions
DEFAULT_ALIASES = {"torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn", "np": "numpy"}


@dataclasses.dataclass(frozen=True)
class Finding:
    line: int  # 0: the source as a whole
    rule: Rule
    what: str  # the construct seen: "import threading", "assigns to torch.relu", "std::thread"

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.what}: {self.rule.reason} [{self.rule.id}]"


@dataclasses.dataclass(frozen=True)
class ScreenReport:
    hits: tuple[Finding, ...]  # sorted by line

    @property
    def findings(self) -> tuple[str, ...]:
        """Every hit, one line each: what the result records."""
        return tuple(str(hit) for hit in self.hits)

    @property
    def rejections(self) -> tuple[str, ...]:
        """The hits of rejecting rules: why enforce mode refuses the candidate."""
        return tuple(str(hit) for hit in self.hits if hit.rule.rejects)

    @property
    def rejected_by(self) -> frozenset[str]:
        return frozenset(hit.rule.id for hit in self.hits if hit.rule.rejects)

    @property
    def passed(self) -> bool:
        return not self.rejections


def screen(source: str, family: str = "cpp") -> ScreenReport:
    """Screen a candidate's source (Python, or C++ where the family's candidates are C++, as the
    `ann` family's are) against RULES."""
    known = families.find(family)  # an unknown family is screened as Python (the evaluator refuses it first)
    if known is not None and known.language == "cpp":
        return _report(_screen_cpp(source, 1))
    try:
        tree = ast.parse(source)
        # errors the parser lets through and the compiler raises at import (a keyword argument
        # repeated, a duplicate parameter, `return` outside a function): compiled, never run
        compile(tree, "<candidate>", "exec", dont_inherit=True)
        visitor = _PythonScreen(tree)
        visitor.visit(tree)
    except (SyntaxError, ValueError) as exc:  # ValueError: a null byte in the source
        return _report([Finding(getattr(exc, "lineno", 0) or 0, RULE["not-python"], getattr(exc, "msg", str(exc)))])
    except (RecursionError, MemoryError):  # `x = ------...1` or `a+a+...+a` by the ten thousand
        return _report([Finding(0, RULE["not-python"], "nested too deeply for the parser or the compiler")])
    hits = visitor.hits
    if not visitor.defines_model_new:
        hits.append(Finding(0, RULE["no-model-new"], "the source"))
    for line, text in visitor.strings:
        hits += _screen_cpp(text, line)
    return _report(hits)


def screen_cpp(text: str) -> list[str]:
    """Findings in C++/CUDA source text, one line each (comments are ignored)."""
    return list(_report(_screen_cpp(text, 1)).findings)


def rules_table() -> str:
    """RULES as the Markdown table the documentation shows (docs/hooks.py)."""
    rows = ["| Rule | Verdict | Reason | Caught at run time by |", "|---|---|---|---|"]
    for rule in RULES:
        verdict = "rejects" if rule.rejects else "finding"
        rows.append(f"| `{rule.id}` | {verdict} | {rule.reason} | {rule.at_run_time} |")
    return "\n".join(rows) + "\n"


def _report(hits: list[Finding]) -> ScreenReport:
    unique: dict[tuple[int, str], Finding] = {}
    for hit in hits:  # one hit per rule and line: the first construct seen
        unique.setdefault((hit.line, hit.rule.id), hit)
    return ScreenReport(tuple(unique[key] for key in sorted(unique)))


def _screen_cpp(text: str, first_line: int) -> list[Finding]:
    code = _strip_cpp_comments(text)
    hits = []
    for rule, pattern in _CPP:
        match = pattern.search(code)
        if match:
            hits.append(Finding(first_line + code.count("\n", 0, match.start()), rule, match.group(0).strip()))
    return hits


def _strip_cpp_comments(text: str) -> str:
    """Comments blanked out, line breaks kept (so that line numbers still hold)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n") or " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


class _PythonScreen(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.hits: list[Finding] = []
        self.strings: list[tuple[int, str]] = []  # (line, text) of string constants: embedded C++
        self.aliases = dict(DEFAULT_ALIASES) | _aliases(tree)  # local name -> dotted module path
        self.docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        self.defines_model_new = False
        self.called: set[int] = set()  # ids of the nodes called (a builtin called, not passed around)

    def _add(self, node: ast.AST, rule: str, what: str) -> None:
        self.hits.append(Finding(getattr(node, "lineno", 0), RULE[rule], what))

    def _dotted(self, node: ast.AST) -> str:
        """`node` as a dotted path through a module (`F.relu` -> torch.nn.functional.relu), or ""."""
        return _dotted_in(node, self.aliases)

    def _check_name(self, node: ast.AST, dotted: str) -> None:
        """A name reached through a module: on NAMES, or a submodule on MODULES reached through
        its parent without an import of its own (`torch.multiprocessing.Process`, `from torch
        import overrides`); a top-level module on MODULES is seen where it is imported, or where
        another module hands it on as an attribute (`torch.sys.modules`, `torch.ctypes`: a module
        that imported it keeps it as a global), judged from there as if imported."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            name = ".".join(parts[:end])
            if name in NAMES:
                self._add(node, NAMES[name], name)
                return
            if end > 1 and name in MODULES:
                self._add(node, MODULES[name], name)
                return
        for start in range(1, len(parts)):
            if parts[start] in _TOP_MODULES and ".".join(parts[: start + 1]) not in NAMESAKES:
                self._check_module(node, ".".join(parts[start:]))
                return

    def _check_module(self, node: ast.AST, module: str) -> None:
        parts = module.split(".")
        for end in range(len(parts), 0, -1):
            name = ".".join(parts[:end])
            if name in MODULES:
                self._add(node, MODULES[name], f"import {module}")
                break
        self._check_name(node, module)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        self._check_module(node, module)
        for alias in node.names:
            self._check_name(node, f"{module}.{alias.name}")
            if alias.name in ATTRIBUTES:
                self._add(node, ATTRIBUTES[alias.name], f"import {alias.name}")
            if alias.name == "ModelNew" or alias.asname == "ModelNew":
                self.defines_model_new = True

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        self.called.add(id(func))
        if isinstance(func, ast.Name) and func.id in BUILTIN_CALLS and func.id not in self.aliases:
            self._add(node, BUILTIN_CALLS[func.id], f"{func.id}()")
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
            name = node.args[1]
            own = isinstance(node.args[0], ast.Name) and node.args[0].id == "self"  # its own attributes
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                if not own:
                    self._add(node, "computed-getattr", ast.unparse(node)[:60])
            else:
                self._check_attribute(node, node.args[0], name.value)
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and len(node.args) >= 2:
            name = node.args[1].value if isinstance(node.args[1], ast.Constant) else ""
            what = f"{func.id}({ast.unparse(node.args[0])}, {ast.unparse(node.args[1])}, ...)"
            self._check_store(node, node.args[0], what, str(name), own="dynamic-setattr")
        aten = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("aten")]
        if aten and self._dotted(func).startswith("torch.library."):
            self._add(node, "patch", f"{ast.unparse(func)}({aten[0]!r}, ...) overrides an aten operator")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_store(node, node.value, f"assigns to {ast.unparse(node)}", node.attr)
        self._check_attribute(node, node.value, node.attr)
        self.generic_visit(node)

    def _check_attribute(self, node: ast.AST, obj: ast.AST, attr: str) -> None:
        if attr in ATTRIBUTES:
            self._add(node, ATTRIBUTES[attr], f".{attr}")
        base = self._dotted(obj)
        if base:
            self._check_name(node, f"{base}.{attr}")
        elif attr in ANY_OBJECT_MODULES:  # a module held by an object the screen cannot follow
            self._check_module(node, attr)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_store(node, node.value, f"assigns to {ast.unparse(node)}")
        self.generic_visit(node)

    def _check_store(self, node: ast.AST, obj: ast.AST, what: str, attr: str = "", own: str = "") -> None:
        """A change to `obj` (assignment, deletion, setattr of `attr`): a setting, the environment,
        or a patch when `obj` is reached through a module or `attr` is a dunder of an object not its
        own (`type(x).__sub__`); else the `own` rule, if any."""
        dotted = self._dotted(obj)
        if re.fullmatch(r"__\w+__", attr) and not dotted:
            own_object = _root(obj) in ("self", "cls")
            self._add(node, "dynamic-setattr" if own_object else "patch", what)
        elif not dotted:
            if own:
                self._add(node, own, what)
        elif any(f"{dotted}.".startswith(prefix) for prefix in SETTINGS):
            self._add(node, "backend-knob", what)
        elif dotted == "os.environ":
            self._add(node, "environment", what)
        else:
            self._add(node, "patch", what)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "getattr" and isinstance(node.ctx, ast.Load) and id(node) not in self.called:
            self._add(node, "computed-getattr", "getattr passed as a value")  # map(getattr, ...), reduce(getattr, ...)
        if node.id in DYNAMIC_BUILTINS and node.id not in self.aliases and isinstance(node.ctx, ast.Load):
            self._add(node, BUILTIN_CALLS[node.id], node.id)  # called later under another name
        if node.id == "Model" and isinstance(node.ctx, ast.Load):
            self._add(node, "reference-fallback", "uses Model")
        if node.id == "__builtins__":
            self._add(node, "patch", node.id)
        if node.id in ("__loader__", "__spec__"):
            self._add(node, "introspection", node.id)
        if node.id == "ModelNew" and isinstance(node.ctx, ast.Store):
            self.defines_model_new = True

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name == "ModelNew":
            self.defines_model_new = True
        for base in node.bases:
            text = ast.unparse(base)
            if text == "Model" or text.endswith(".Model"):
                self._add(node, "reference-fallback", f"class {node.name}({text})")
            if text.endswith("Tensor"):
                self._add(node, "tensor-subclass", f"class {node.name}({text})")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in ATTRIBUTES:
            self._add(node, ATTRIBUTES[node.name], f"def {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            if not any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
                self._add(handler, "exception-fallback", "except without raise")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Global(self, node: ast.Global) -> None:
        self._add(node, "global-state", f"global {', '.join(node.names)}")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and len(node.value) > 20 and id(node) not in self.docstrings:
            self.strings.append((node.lineno, node.value))
        elif isinstance(node.value, str) and ("/proc/self/fd" in node.value or "/dev/fd" in node.value):
            self._add(node, "descriptors", repr(node.value[:40]))


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound to modules or to names in modules: imports, and `name = module.attr` assignments."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):  # second pass: `cuda = torch.cuda`, `t = torch`
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            dotted = _dotted_in(node.value, aliases)
            for target in node.targets:
                if dotted and isinstance(target, ast.Name) and target.id not in aliases:
                    aliases[target.id] = dotted
    return aliases


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _dotted_in(node: ast.AST, aliases: dict[str, str]) -> str:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, "")
    if isinstance(node, ast.Attribute):
        base = _dotted_in(node.value, aliases)
        if not base and node.attr in ANY_OBJECT_MODULES:  # `self.t.sys`: sys, whatever holds it
            return node.attr
        return f"{base}.{node.attr}" if base else ""
    return ""
