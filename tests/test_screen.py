"""The static screen's rule table: each rule flags what it names and leaves a close honest snippet
alone; only rejecting rules refuse a candidate; findings say where and why; the documentation shows the table."""

from __future__ import annotations

import re

import pytest

from speedforge.evaluator.screen import RULES, rules_table, screen

HEADER = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n\n\n"


def cpp(code: str) -> str:
    """`code` as an embedded C++ source string, the way load_inline candidates carry it."""
    return f'SOURCE = r"""\n#include <torch/extension.h>\n{code}\n"""\n'


# (rule, a snippet it flags, a close honest snippet it leaves alone); each snippet follows HEADER
CASES = [
    ("reference-fallback", "class Fast(Model):\n    pass", "class Fast(nn.Module):\n    pass"),
    ("reference-fallback", "fast = Model()", "class Model(nn.Module):\n    pass"),
    ("reference-fallback", "from sf_reference import get_inputs", "from functools import partial"),
    ("patch", "torch.relu = lambda x: x", "relu = lambda x: x"),
    ("patch", "setattr(torch, 'matmul', lambda a, b: a)", "setattr(nn.Module(), 'w', None)"),
    ("patch", "import time\ntime.perf_counter = lambda: 0.0", "import time\nstart = time.perf_counter()"),
    ("patch", "import torch.nn.functional as G\nG.relu = abs", "G = abs"),
    ("patch", "cuda = torch.cuda\ncuda.Event.elapsed_time = abs", "cuda = torch.cuda\nready = cuda.is_available()"),
    ("patch", "type(torch.ones(1)).__sub__ = abs", "class Fast:\n    def set(self):\n        self.__call__ = abs"),
    ("patch", "import builtins", "import numbers"),
    ("patch", "lib = torch.library.Library('aten', 'IMPL')", "lib = torch.library.Library('mylib', 'DEF')"),
    (
        "patch",
        cpp("cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { return cudaSuccess; }"),
        cpp("cudaError_t err = cudaEventElapsedTime(&ms, start, stop);"),
    ),
    ("threads", "import threading", "import functools"),
    ("threads", "from concurrent.futures import ThreadPoolExecutor", "from collections import OrderedDict"),
    ("threads", cpp("std::thread worker([]{}); worker.join();"), cpp("int threads = blockDim.x * gridDim.x;")),
    (
        "threads",
        cpp("#pragma omp parallel for\nfor (int i = 0; i < n; ++i) {}"),
        cpp("#pragma unroll\nfor (int i = 0; i < 4; ++i) {}"),
    ),
    ("processes", "import os\nos.fork()", "import os\nn = os.cpu_count()"),
    ("processes", "from os import system", "from os import cpu_count"),
    ("processes", "import subprocess", "import struct"),
    ("processes", "p = torch.multiprocessing.Process(target=print)", "n = torch.get_num_threads()"),
    ("processes", "from torch import multiprocessing", "from torch import nn as layers"),
    ("processes", cpp('system("ls");'), cpp("int coordinate_system(int n);")),
    ("network", "import socket", "import struct"),
    ("network", cpp("int s = socket(AF_INET, SOCK_STREAM, 0);"), cpp("int sockets = 0;")),
    ("tensor-subclass", "class Lazy(torch.Tensor):\n    pass", "class Lazy(nn.Module):\n    pass"),
    (
        "tensor-subclass",
        "class Lazy:\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n        pass",
        "class Lazy:\n    def torch_function(cls, func):\n        pass",
    ),
    (
        "tensor-subclass",
        "t = torch.Tensor._make_subclass(nn.Module, torch.ones(1))",
        "t = torch.ones(1).as_strided((1,), (1,))",
    ),
    ("introspection", "import sys\nframe = sys._getframe(1)", "import sys\nversion = sys.version_info"),
    (
        "introspection",
        "import sys\nharness = sys.modules['speedforge.evaluator.harness']",
        "import sys\nbig = sys.maxsize",
    ),
    ("introspection", "import gc", "import math"),
    ("introspection", "harness = torch.sys.modules['speedforge.evaluator.harness']", "big = torch.sys.maxsize"),
    ("introspection", "frame = torch.inspect.currentframe()", "window = torch.signal.windows.hann(8)"),
    ("raw-memory", "libc = torch.ctypes.CDLL(None)", "size = torch.finfo(torch.float32).eps"),
    ("environment", "home = torch.os.environ.get('HOME')", "n = torch.os.cpu_count()"),
    ("introspection", "from speedforge.evaluator import harness", "from torch.utils import cpp_extension"),
    ("introspection", "g = abs.__globals__", "n = abs.__name__"),
    ("introspection", "namespace = vars(torch)", "names = dir(torch)"),
    ("raw-memory", "import ctypes", "import struct"),
    ("raw-memory", cpp('void* lib = dlopen("libc.so.6", RTLD_NOW);'), cpp("int download(int n);")),
    ("dynamic-code", "y = eval('1 + 1')", "fast = torch.compile(nn.Linear(2, 2))"),
    ("dynamic-code", "y = compile('1', 'x', 'eval')", "from torch import compile\nfast = compile(nn.Linear(2, 2))"),
    ("dynamic-code", "import pickle", "import json"),
    ("dynamic-code", "load = __import__\nm = load('ctypes')", "load = print"),
    ("tensor-subclass", "from torch.utils import _python_dispatch", "from torch.utils import cpp_extension"),
    ("tensor-subclass", "base = torch.overrides.TorchFunctionMode", "fn = torch.nn.functional.relu"),
    ("sleep", cpp("usleep(1000);"), cpp("int sleep_ms = 0;")),
    ("sleep", "torch.cuda._sleep(1000)", "torch.cuda.synchronize()"),
    (
        "exception-fallback",
        "try:\n    y = 1\nexcept Exception:\n    y = 0",
        "try:\n    y = 1\nexcept Exception:\n    raise",
    ),
    (
        "exception-fallback",
        "import contextlib\nwith contextlib.suppress(Exception):\n    y = 1",
        "import contextlib\nwith contextlib.nullcontext():\n    y = 1",
    ),
    ("os-sys", "import os", "import math"),
    ("environment", "import os\nhome = os.environ.get('HOME')", "import os\nn = os.cpu_count()"),
    ("environment", "import os\nos.environ['CUDA_MODULE_LOADING'] = 'LAZY'", "import os\nsep = os.sep"),
    ("environment", cpp('const char* key = getenv("AWS_SECRET_ACCESS_KEY");'), cpp("int environment_size = 0;")),
    ("file-access", "f = open('kernel.cu', 'w')", "f = opener('kernel.cu', 'w')"),
    ("file-access", "import tempfile", "import textwrap"),
    ("file-access", "import os\nos.makedirs('build')", "import os\npath = os.path.join('a', 'b')"),
    ("file-access", cpp('FILE* f = fopen("/etc/passwd", "r");'), cpp("int fopen_count = 0;")),
    ("clock", "import time", "import math"),
    ("clock", cpp("auto t = std::chrono::steady_clock::now();"), cpp("int chrono = 0;")),
    ("pointer-cache", "key = torch.ones(1).data_ptr()", "key = torch.ones(1).shape"),
    ("global-state", "def f():\n    global CACHE\n    CACHE = 1", "def f():\n    cache = 1"),
    ("weakref", "import weakref", "import functools"),
    ("computed-getattr", "fn = getattr(torch, 'rel' + 'u')", "fn = getattr(torch, 'relu')"),
    (
        "computed-getattr",
        "class Held(nn.Module):\n    def forward(self, x):\n        return getattr(self.t, 's' + 'ys')",
        "class Stack(nn.Module):\n    def forward(self, x):\n        return getattr(self, f'b{len(x)}')(x)",
    ),
    (
        "introspection",
        "class Held(nn.Module):\n    def forward(self, x):\n        return self.t.sys.modules",
        "class Held(nn.Module):\n    def forward(self, x):\n        return self.t.nn.modules",
    ),
    (
        "raw-memory",
        "class Held(nn.Module):\n    def forward(self, x):\n        return self.t.ctypes.CDLL(None)",
        "class Held(nn.Module):\n    def forward(self, x):\n        return self.signal.sum()",
    ),
    (
        "computed-getattr",
        "from functools import reduce\nf = reduce(getattr, ['a'], torch)",
        "def f(self, name):\n    return getattr(self, name)",
    ),
    (
        "computed-getattr",
        "import operator\nget = operator.attrgetter('_get' + 'frame')",
        "import operator\nadd = operator.add",
    ),
    ("computed-getattr", "get = object.__getattribute__", "get = object.__init__"),
    (
        "introspection",
        "try:\n    raise ValueError\nexcept ValueError as e:\n    tb = e.__traceback__",
        "try:\n    raise ValueError\nexcept ValueError as e:\n    raise",
    ),
    ("dynamic-setattr", "def f(self, name, p):\n    setattr(self, name, p)", "def f(self, p):\n    self.w = p"),
    ("backend-knob", "torch.backends.cudnn.benchmark = True", "on = torch.backends.cudnn.is_available()"),
    ("backend-knob", "torch._inductor.config.coordinate_descent_tuning = True", "tuned = torch.compile"),
    ("backend-knob", "torch.set_num_threads(4)", "n = torch.get_num_threads()"),
    ("side-stream", "s = torch.cuda.Stream()", "s = torch.cuda.current_stream()"),
    ("side-stream", "with torch.cuda.stream(s):\n    pass", "with torch.no_grad():\n    pass"),
    ("side-stream", cpp("auto s = at::cuda::getStreamFromPool();"), cpp("auto s = at::cuda::getCurrentCUDAStream();")),
    ("cuda-events", "e = torch.cuda.Event(enable_timing=True)", "torch.cuda.synchronize()"),
    ("cuda-events", "g = torch.cuda.CUDAGraph()", "g = torch.cuda.device_count()"),
    ("cuda-events", cpp("cudaEventRecord(e);"), cpp("cudaDeviceSynchronize();")),
    ("static-cache", cpp("static torch::Tensor cached;"), cpp("static const int kBlock = 256;")),
    ("descriptors", "import os\nos.dup2(1, 5)", "import os\nn = os.cpu_count()"),
    ("descriptors", "import os\nfds = os.listdir('/proc/self/fd')", "import os\nn = os.path.join('a', 'b')"),
    ("descriptors", cpp("dup2(fd, 1);"), cpp("int fd2 = fd + 1;")),
]
RULE_OF = {rule.id: rule for rule in RULES}


def _ids(snippet: str) -> set[str]:
    return {hit.rule.id for hit in screen(HEADER + snippet, "cuda").hits}


@pytest.mark.parametrize("rule, flagged, honest", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_flags_what_it_names_and_not_a_close_honest_snippet(rule: str, flagged: str, honest: str) -> None:
    assert rule in _ids(flagged)
    assert rule not in _ids(honest)
    report = screen(HEADER + flagged, "cuda")
    assert report.passed == (not RULE_OF[rule].rejects), report.findings
    assert screen(HEADER + honest, "cuda").passed, screen(HEADER + honest, "cuda").rejections


def test_every_rule_has_cases_both_ways() -> None:
    structural = {"not-python", "no-model-new"}  # whole-source verdicts, tested below
    assert {rule.id for rule in RULES} - structural == {case[0] for case in CASES}


def test_rules_have_unique_ids_a_reason_and_a_run_time_layer() -> None:
    assert len({rule.id for rule in RULES}) == len(RULES)
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", rule.id) and rule.reason and rule.at_run_time for rule in RULES)


def test_setattr_on_its_own_object_is_honest_but_on_torch_a_patch() -> None:
    assert screen(HEADER + "setattr(self, 'w', p)").passed
    assert not screen(HEADER + "setattr(torch, 'matmul', f)").passed


def test_a_cudnn_knob_is_a_finding_not_a_rejection() -> None:
    report = screen(HEADER + "torch.backends.cudnn.benchmark = True")
    assert report.passed and report.rejections == ()
    assert report.findings == (
        "line 10: assigns to torch.backends.cudnn.benchmark: changes a global torch setting "
        "(cudnn, TF32, threads, compiler config) [backend-knob]",
    )


def test_patching_a_torch_function_is_rejected_with_line_and_rule() -> None:
    report = screen(HEADER + "torch.relu = f")
    assert not report.passed
    assert report.rejections == (
        "line 10: assigns to torch.relu: patches a module's functions (the timer or the check would lie) [patch]",
    )
    assert report.rejected_by == {"patch"}


def test_findings_are_sorted_by_line_and_include_the_rejections() -> None:
    report = screen(HEADER + "import threading\nimport os\nkey = torch.ones(1).data_ptr()")
    assert [f.split(":")[0] for f in report.findings] == ["line 10", "line 11", "line 12"]
    assert report.rejections == (report.findings[0],)


def test_embedded_cpp_findings_give_the_line_in_the_candidate() -> None:
    source = HEADER + cpp("int a = 0;\n/* a comment\n over lines */\nstd::thread t(work);")
    (finding,) = screen(source, "cuda").findings
    assert finding.startswith(f"line {source.splitlines().index('std::thread t(work);') + 1}: std::thread")


def test_docstrings_and_cpp_comments_are_not_screened_as_cpp() -> None:
    source = (
        HEADER
        + 'def f():\n    """Never calls std::thread or fork(), nor system("ls")."""\n'
        + cpp("// std::thread\nint x;")
    )
    assert screen(source, "cuda").findings == ()


def test_unparsable_source_and_a_missing_model_new_are_rejected() -> None:
    assert screen("def f(:\n", "cuda").rejected_by == {"not-python"}
    # parsed, but the import would raise (a GRPO sample's `Conv2d(3, 8, padding=1, padding=0)`)
    repeated = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def f(self):\n        return nn.Conv2d(3, 8, 3, padding=1, padding=0)\n"
    assert screen(repeated, "cuda").rejected_by == {"not-python"}
    assert "keyword argument repeated" in screen(repeated, "cuda").findings[0]
    assert screen("def f(x, x):\n    pass\nModelNew = f\n", "cuda").rejected_by == {"not-python"}
    # too deep for the parser (MemoryError) or for the AST's construction (RecursionError): a
    # verdict, not an exception out of the screen (the evaluator's infra_error, a crash in SFT's checks)
    for deep in ("x = " + "-" * 50000 + "1", "x = " + "+".join(["a"] * 100000)):
        assert screen(deep + "\nclass ModelNew:\n    pass\n", "cuda").rejected_by == {"not-python"}
    assert screen("import torch\nclass Other:\n    pass\n", "cuda").rejected_by == {"no-model-new"}
    assert screen("import torch\nclass Other:\n    pass\nModelNew = Other\n", "cuda").passed


def test_the_ann_family_screens_its_whole_cpp_file() -> None:
    report = screen("#include <thread>\nvoid f() { std::thread t(g); }\nstatic std::map<int, int> m;\n", "ann")
    assert report.rejected_by == {"threads"}
    assert [hit.rule.id for hit in report.hits] == ["threads", "static-cache"]
    assert screen("int search(const float* q, int k) { return k; }\n", "ann").findings == ()


def test_the_documentation_shows_the_rule_table() -> None:
    """The reference page holds the placeholder the docs hook fills with rules_table()."""
    from test_docs import rendered

    for page in ("reference/statuses-and-checks.md", "concepts/evaluator.md"):
        assert rules_table() in rendered(page), f"docs/{page} does not show the screen's rule table"
