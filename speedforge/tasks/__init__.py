"""Task families, loaders for KernelBench-format programs, and the built-in suite."""

from speedforge.tasks.loader import TaskFormatError, check_reference_source, load_task_file, load_task_folder
from speedforge.tasks.suite import builtin_candidates, builtin_tasks, find_task

__all__ = [
    "TaskFormatError",
    "builtin_candidates",
    "builtin_tasks",
    "check_reference_source",
    "find_task",
    "load_task_file",
    "load_task_folder",
]
