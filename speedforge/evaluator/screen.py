"""Static screen: reject candidates whose source shows a known trick before anything runs.

Two passes: one over the Python AST of the candidate, one over every string constant in it (the
embedded C++/CUDA sources) and, for the `ann` family, over the whole C++ source. Each finding
is a short reason. The screen is a first line only: the sandbox and the runtime guards catch
what slips through (obfuscated imports and the like), and each layer has its own tests.
"""

from __future__ import annotations

import ast
import dataclasses
import re

# Modules a candidate may not import: processes, threads, files, network, timers, introspection.
BANNED_MODULES = {
    "os": "operating-system access",
    "sys": "interpreter access",
    "subprocess": "subprocesses",
    "multiprocessing": "processes",
    "threading": "threads",
    "_thread": "threads",
    "concurrent": "threads or processes",
    "asyncio": "background tasks",
    "signal": "signals",
    "socket": "network access",
    "ssl": "network access",
    "http": "network access",
    "urllib": "network access",
    "requests": "network access",
    "ctypes": "raw memory and native calls",
    "cffi": "raw memory and native calls",
    "mmap": "raw memory",
    "time": "timers",
    "timeit": "timers",
    "importlib": "dynamic imports",
    "builtins": "patching builtins",
    "gc": "heap introspection",
    "inspect": "introspection",
    "pickle": "arbitrary code loading",
    "marshal": "arbitrary code loading",
    "shutil": "file access",
    "pathlib": "file access",
    "io": "file access",
    "tempfile": "file access",
    "glob": "file access",
    "resource": "resource limits",
    "psutil": "process access",
    "weakref": "object lifetime tricks",
}

BANNED_CALLS = {
    "eval": "eval()",
    "exec": "exec()",
    "compile": "compile()",
    "__import__": "__import__()",
    "open": "file access (open())",
    "globals": "globals()",
    "vars": "vars()",
    "breakpoint": "breakpoint()",
    "input": "input()",
    "setattr": "setattr() (monkey-patching)",
    "delattr": "delattr() (monkey-patching)",
}

# Attribute names that betray a trick wherever they appear in Python code.
BANNED_ATTRIBUTES = {
    "Stream": "side CUDA streams (torch.cuda.Stream)",
    "stream": "side CUDA streams (torch.cuda.stream)",
    "set_stream": "side CUDA streams",
    "ExternalStream": "side CUDA streams",
    "Event": "CUDA events (timing tricks)",
    "data_ptr": "pointer-keyed caching (data_ptr() in Python)",
    "_make_subclass": "tensor subclasses",
    "_make_wrapper_subclass": "tensor subclasses",
    "__torch_function__": "tensor subclasses (__torch_function__)",
    "__torch_dispatch__": "tensor subclasses (__torch_dispatch__)",
    "__subclasses__": "introspection",
    "__globals__": "introspection",
    "__builtins__": "patching builtins",
    "__code__": "code patching",
    "__dict__": "attribute tricks",
    "environ": "environment access",
    "getenv": "environment access",
    "fork": "processes",
    "system": "subprocesses",
}

# Roots whose attributes a candidate may not assign to (monkey-patching).
PATCH_ROOTS = {"torch", "time", "math", "numpy", "np", "F", "nn"}

# Patterns in embedded C++/CUDA source.
CPP_RULES = [
    (r"\bcudaStreamCreate\w*|\bgetStreamFromPool\b|\bcudaStreamNonBlocking\b|\bgetStreamFromExternal\b"
     r"|\bsetCurrentCUDAStream\b|\bCUDAStreamGuard\b", "side CUDA streams in C++"),
    (r"\bcudaEvent\w*|\bcudaGraph\w*", "CUDA events or graphs in C++ (timing tricks)"),
    (r"\bstd::thread\b|\bpthread_create\b|\bstd::async\b|\bstd::jthread\b|#\s*pragma\s+omp\b|\bomp_\w+",
     "threads in C++ (std::thread, pthreads, OpenMP)"),
    (r"\bfork\s*\(|\bvfork\s*\(|\bsystem\s*\(|\bpopen\s*\(|\bexec[lv]p?e?\s*\(|\bposix_spawn",
     "processes in C++"),
    (r"\bfopen\s*\(|\bstd::[io]?fstream\b|\bopen\s*\(\s*\"|\bunlink\s*\(|\bremove\s*\(\s*\"", "file access in C++"),
    (r"\bsocket\s*\(|\bconnect\s*\(|\bgetaddrinfo\b|\bcurl_", "network access in C++"),
    (r"\bsleep\s*\(|\busleep\s*\(|\bnanosleep\b|\bsleep_for\b|\bsleep_until\b|__nanosleep", "sleeps in C++"),
    (r"\bgetenv\s*\(|\benviron\b", "environment access in C++"),
    (r"\bstatic\s+(?:const\s+)?(?:torch::Tensor|at::Tensor|std::(?:unordered_)?map|std::vector\s*<\s*(?:torch|at)::Tensor)",
     "static tensors or maps in C++ (cached outputs)"),
    (r"\bdlopen\s*\(|\bdlsym\s*\(|\bmprotect\s*\(|\bptrace\s*\(", "dynamic loading or memory patching in C++"),
    (r"\bclock_gettime\b|\bgettimeofday\b|\brdtsc\b|std::chrono", "timers in C++"),
    (r"#\s*include\s*<\s*(?:thread|future|fstream|unistd\.h|sys/\w+\.h|dlfcn\.h|omp\.h)\s*>",
     "includes for threads, files or processes in C++"),
]
_CPP_PATTERNS = [(re.compile(pattern), reason) for pattern, reason in CPP_RULES]


@dataclasses.dataclass(frozen=True)
class ScreenReport:
    findings: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.findings


def screen(source: str, family: str = "cpp") -> ScreenReport:
    """Screen a candidate's source; findings are sorted, de-duplicated, one reason each."""
    if family == "ann":
        return ScreenReport(tuple(sorted(set(screen_cpp(source)))))
    findings: list[str] = []
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return ScreenReport((f"not valid Python: line {exc.lineno}: {exc.msg}",))
    visitor = _PythonScreen()
    visitor.visit(tree)
    findings.extend(visitor.findings)
    if not visitor.defines_model_new:
        findings.append("defines no class ModelNew")
    for text in visitor.strings:
        findings.extend(screen_cpp(text))
    return ScreenReport(tuple(sorted(set(findings))))


def screen_cpp(text: str) -> list[str]:
    """Findings in C++/CUDA source text (comments are stripped first)."""
    code = _strip_cpp_comments(text)
    return [reason for pattern, reason in _CPP_PATTERNS if pattern.search(code)]


def _strip_cpp_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


class _PythonScreen(ast.NodeVisitor):
    def __init__(self) -> None:
        self.findings: list[str] = []
        self.strings: list[str] = []
        self.defines_model_new = False
        self._class_stack: list[str] = []

    def _add(self, node: ast.AST, reason: str) -> None:
        self.findings.append(f"line {getattr(node, 'lineno', '?')}: {reason}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._check_module(node, node.module or "")
        for alias in node.names:
            if alias.name in BANNED_ATTRIBUTES:
                self._add(node, BANNED_ATTRIBUTES[alias.name])
            if alias.name in BANNED_CALLS:
                self._add(node, BANNED_CALLS[alias.name])
        self.generic_visit(node)

    def _check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if root in BANNED_MODULES:
            self._add(node, f"imports {module} ({BANNED_MODULES[root]})")
        if module.startswith("torch.multiprocessing") or module.startswith("torch.cuda.streams"):
            self._add(node, f"imports {module}")

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
            self._add(node, BANNED_CALLS[node.func.id])
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
            if not isinstance(node.args[1], ast.Constant):
                self._add(node, "getattr() with a computed name")
            elif node.args[1].value in BANNED_ATTRIBUTES:
                self._add(node, BANNED_ATTRIBUTES[node.args[1].value])
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in BANNED_ATTRIBUTES:
            self._add(node, BANNED_ATTRIBUTES[node.attr])
        if isinstance(node.ctx, (ast.Store, ast.Del)) and _root_name(node) in PATCH_ROOTS:
            self._add(node, f"assigns to {ast.unparse(node)} (monkey-patching)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "Model" and self._class_stack:
            self._add(node, "refers to the reference Model inside the candidate (fallback to the reference)")
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            self._add(node, f"uses {node.id}")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name == "ModelNew":
            self.defines_model_new = True
        for base in node.bases:
            text = ast.unparse(base)
            if text in ("Model",):
                self._add(node, "ModelNew subclasses the reference Model (fallback to the reference)")
            if text.endswith("Tensor"):
                self._add(node, f"class {node.name} subclasses {text} (tensor subclass)")
        self._class_stack.append(node.name)
        self.generic_visit(node)
        self._class_stack.pop()

    def visit_Try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            if not any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
                self._add(handler, "try/except that swallows errors (a silent fallback hides a failing kernel)")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Global(self, node: ast.Global) -> None:
        self._add(node, "global statement (state kept across calls)")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and len(node.value) > 20:
            self.strings.append(node.value)


def _root_name(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""
