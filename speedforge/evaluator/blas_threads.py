"""The thread counts of the BLAS libraries loaded in this process, read and set through their own C
API (as threadpoolctl does, without the dependency).

numpy and scipy bring their own OpenBLAS, loaded with torch (which imports numpy) in the zygote.
By default it keeps a thread per CPU, whatever `evaluator.cpu_threads` gives torch. A candidate
whose forward is a numpy matmul then started OpenBLAS's worker threads, and the `native-threads`
guard rejected honest, single-threaded work. The CPU harness sets every loaded library to
`cpu_threads` (`limit`), and the sandbox's environment says the same to a library loaded later
(`ENVIRONMENT`); speedforge.evaluator.process_state puts each library's count back around every
reference call (`controls`). A candidate that raises the count again and uses the threads is
still caught by `native-threads` (tests/adversarial/openblas_threads_raised.py).
"""

from __future__ import annotations

import ctypes
import functools
import os

# (getter, setter) symbol pairs, per library family and build (64-bit integer builds suffix them;
# numpy's and scipy's wheels prefix theirs with scipy_)
SYMBOLS = (
    ("openblas_get_num_threads", "openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads"),
    ("bli_thread_get_num_threads", "bli_thread_set_num_threads"),
)
# what a BLAS library loaded after `limit` (a candidate's import of another one) reads at its start
ENVIRONMENT = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def _loaded_libraries() -> list[str]:
    """Paths of the shared libraries mapped into this process whose name says BLAS."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                name = os.path.basename(path).lower()
                if path.startswith("/") and ".so" in name and any(k in name for k in ("blas", "mkl_rt", "blis")):
                    if path not in paths:
                        paths.append(path)
    except OSError:
        pass
    return paths


@functools.cache
def controls() -> dict[str, tuple]:
    """`blas threads (<library file>)` -> (read, write) for every BLAS library loaded now that has
    a known thread API; found once per process (the zygote's libraries)."""
    found: dict[str, tuple] = {}
    for path in _loaded_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in SYMBOLS:
            if hasattr(lib, get_name) and hasattr(lib, set_name):
                get, put = getattr(lib, get_name), getattr(lib, set_name)
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                found[f"blas threads ({os.path.basename(path)})"] = (get, put)
                break
    return found


def limit(threads: int) -> dict[str, int]:
    """Every loaded BLAS library to `threads` threads, and the environment to the same for any
    loaded later; returns the counts they had."""
    before: dict[str, int] = {}
    for name, (read, write) in controls().items():
        before[name] = read()
        write(threads)
    for variable in ENVIRONMENT:
        os.environ[variable] = str(threads)
    return before
