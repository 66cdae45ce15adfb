"""Importers: KernelBench folder and parquet, CUDA-L1 JSONL, the built-in suite; bad input; --skip-bad."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from speedforge.cli import main
from speedforge.errors import UserError
from speedforge.store.staging import load_dataset
from speedforge.store import open_store
from speedforge.tasks import builtin_candidates, builtin_tasks
from speedforge.tasks.importers import ImportProblems, detect_kind, import_kernelbench_folder, import_source

from shared_data import KERNELBENCH, require

REF = '''"""{doc}"""
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * {k}


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
'''
NEW = """import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.clamp_min(x, 0) * {k}
"""
NOT_A_TASK = "import torch\n\ndef get_inputs():\n    return []\n"


def kernelbench_checkout(root, bad: bool = False):
    (root / "level1").mkdir(parents=True)
    (root / "level2").mkdir()
    (root / "level1" / "19_ReLU.py").write_text(REF.format(doc="relu", k=1))
    (root / "level2" / "7_Scale.py").write_text(REF.format(doc="scaled relu", k=3))
    if bad:
        (root / "level1" / "20_Broken.py").write_text(NOT_A_TASK)
        (root / "extras").mkdir()
        (root / "extras" / "x.py").write_text(REF.format(doc="", k=2))
    return root


def cuda_l1_jsonl(path, extra_lines: tuple[str, ...] = ()):
    rows = [
        {
            "level_id": 1,
            "task_id": 19,
            "ref_code": REF.format(doc="relu", k=1),
            "custom_code": NEW.format(k=1),
            "score_default": 1.31,
            "score_torch_compile_default": 0.9,
            "score_cuda_graph": float("nan"),
        },
        {
            "level_id": 1,
            "task_id": 19,
            "ref_code": REF.format(doc="relu", k=1),
            "custom_code": NEW.format(k=1) + "#2",
            "score_default": 1.05,
        },
        {
            "level_id": 2,
            "task_id": 7,
            "ref_code": REF.format(doc="scaled", k=3),
            "custom_code": None,
            "score_default": None,
        },
        {"level_id": 3, "task_id": 1, "ref_code": REF.format(doc="third", k=5), "custom_code": "None"},
    ]
    path.write_text("\n".join([json.dumps(r) for r in rows] + list(extra_lines)) + "\n")
    return path


def test_kernelbench_folder_imports_every_level(tmp_path):
    imported = import_source(str(kernelbench_checkout(tmp_path / "kb")))
    assert imported.kind == "kernelbench-folder"
    assert [t.task_id for t in imported.tasks] == ["kernelbench/level1/19_ReLU", "kernelbench/level2/7_Scale"]
    assert [t.level for t in imported.tasks] == [1, 2]
    assert all(t.family == "cuda" and t.origin == "kernelbench" for t in imported.tasks)
    assert imported.tasks[0].notes == "relu"


def test_kernelbench_folder_with_bad_items_is_refused_naming_them(tmp_path):
    source = str(kernelbench_checkout(tmp_path / "kb", bad=True))
    with pytest.raises(ImportProblems) as info:
        import_source(source)
    problems = info.value.imported.problems
    assert any("20_Broken.py" in p and "missing Model" in p for p in problems)
    assert "--skip-bad" in str(info.value) and "\n" not in str(info.value)


def test_skip_bad_imports_the_rest(tmp_path):
    imported = import_source(str(kernelbench_checkout(tmp_path / "kb", bad=True)), skip_bad=True)
    assert len(imported.tasks) == 2 and len(imported.problems) == 1


def test_folders_beside_the_levels_are_skipped_and_named_not_problems(tmp_path):
    root = kernelbench_checkout(tmp_path / "kb")
    (root / "changelog").mkdir()
    (root / "changelog" / "v0.1.md").write_text("notes")
    imported = import_source(str(root))
    assert [t.task_id for t in imported.tasks] == ["kernelbench/level1/19_ReLU", "kernelbench/level2/7_Scale"]
    assert imported.problems == []
    assert imported.notes == ("skipped 1 folder(s) that are not levelN: changelog",)


def test_a_folder_without_levels_is_refused(tmp_path):
    (tmp_path / "kb" / "changelog").mkdir(parents=True)
    with pytest.raises(UserError, match="no level folders"):
        import_kernelbench_folder(str(tmp_path / "kb"), "cuda")


def test_published_kernelbench_checkout_imports_every_level():
    root = require(KERNELBENCH)
    imported = import_source(str(root))
    assert imported.problems == []
    assert {t.level for t in imported.tasks} == {1, 2, 3, 4}
    assert len(imported.tasks) == 270
    assert any("changelog" in line for line in imported.notes)


def test_cuda_l1_tasks_run_in_eval_mode(tmp_path):
    imported = import_source(str(cuda_l1_jsonl(tmp_path / "a.jsonl")), skip_bad=True)
    assert {t.mode for t in imported.tasks} == {"eval"}
    assert {t.run_mode for t in imported.tasks} == {"eval"}


def test_kernelbench_parquet_gives_the_same_tasks_as_the_checkout(tmp_path):
    folder = import_source(str(kernelbench_checkout(tmp_path / "kb")))
    table = pa.table(
        {
            "code": [t.source for t in folder.tasks],
            "level": [t.level for t in folder.tasks],
            "name": ["19_ReLU", "7_Scale.py"],
            "problem_id": [19, 7],
        }
    )
    pq.write_table(table, tmp_path / "kernelbench.parquet")
    imported = import_source(str(tmp_path / "kernelbench.parquet"))
    assert imported.kind == "kernelbench-parquet"
    assert [(t.task_id, t.source, t.level) for t in imported.tasks] == [
        (t.task_id, t.source, t.level) for t in folder.tasks
    ]


def test_kernelbench_parquet_bad_rows_and_wrong_columns(tmp_path):
    table = pa.table(
        {
            "code": [REF.format(doc="", k=1), NOT_A_TASK, REF.format(doc="", k=2)],
            "level": [1, 1, 0],
            "name": ["1_A", "2_B", "3_C"],
            "problem_id": [1, 2, 3],
        }
    )
    pq.write_table(table, tmp_path / "kb.parquet")
    with pytest.raises(ImportProblems) as info:
        import_source(str(tmp_path / "kb.parquet"))
    problems = info.value.imported.problems
    assert any("row 1 (name '2_B')" in p and "missing Model" in p for p in problems)
    assert any("row 2 (name '3_C')" in p and "level 0" in p for p in problems)
    assert [t.name for t in import_source(str(tmp_path / "kb.parquet"), skip_bad=True).tasks] == ["1_A"]
    pq.write_table(pa.table({"code": ["x"], "level": [1]}), tmp_path / "other.parquet")
    with pytest.raises(UserError, match=r"missing column\(s\) \['name', 'problem_id'\]"):
        import_source(str(tmp_path / "other.parquet"))


def test_cuda_l1_jsonl_gives_tasks_and_candidates_with_published_scores(tmp_path):
    imported = import_source(str(cuda_l1_jsonl(tmp_path / "a100.jsonl")))
    assert imported.kind == "cuda-l1-jsonl" and not imported.problems
    assert [t.task_id for t in imported.tasks] == ["cuda-l1/level1/19", "cuda-l1/level2/7", "cuda-l1/level3/1"]
    assert len(imported.candidates) == 2  # null and "None" custom_code give tasks without candidates
    first = imported.candidates[0]
    assert first.task_id == "cuda-l1/level1/19" and first.origin == "import:cuda-l1" and first.created_at == 0.0
    assert json.loads(first.meta_json)["published"] == {
        "score_cuda_graph": None,
        "score_default": 1.31,
        "score_torch_compile_default": 0.9,
    }


def test_cuda_l1_bad_lines_are_reported_by_line(tmp_path):
    bad = (
        "{not json",
        json.dumps({"level_id": 1, "task_id": 2, "ref_code": NOT_A_TASK, "custom_code": NEW.format(k=1)}),
        json.dumps({"level_id": 1, "task_id": 3, "ref_code": REF.format(doc="", k=1), "custom_code": "x = 1"}),
        json.dumps({"level_id": 1, "task_id": 4}),
    )
    path = cuda_l1_jsonl(tmp_path / "l1.jsonl", bad)
    with pytest.raises(ImportProblems) as info:
        import_source(str(path))
    problems = info.value.imported.problems
    assert len(problems) == 4
    assert "line 5: not valid JSON" in problems[0]
    assert "line 6" in problems[1] and "missing Model" in problems[1]
    assert "line 7" in problems[2] and "defines no ModelNew" in problems[2]
    assert "line 8" in problems[3] and "missing field(s) ['ref_code']" in problems[3]
    kept = import_source(str(path), skip_bad=True)
    assert len(kept.tasks) == 3 and len(kept.candidates) == 2


def test_builtin_suite_is_imported_by_family():
    imported = import_source("builtin")
    assert imported.tasks == builtin_tasks() and imported.candidates == builtin_candidates()
    cpp = import_source("builtin:cpp")
    assert cpp.tasks == builtin_tasks("cpp") and all(t.family == "cpp" for t in cpp.tasks)
    with pytest.raises(UserError, match="unknown built-in family"):
        import_source("builtin:fortran")


def test_detect_kind(tmp_path):
    assert detect_kind("builtin:cuda") == "builtin"
    assert detect_kind(str(kernelbench_checkout(tmp_path / "kb"))) == "kernelbench-folder"
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(UserError, match="--kind"):
        detect_kind(str(tmp_path / "x.txt"))
    with pytest.raises(UserError, match="source not found"):
        detect_kind(str(tmp_path / "missing.jsonl"))


def test_stage_command_refuses_bad_input_then_stages_the_rest_with_skip_bad(tmp_path, capsys):
    source = str(cuda_l1_jsonl(tmp_path / "l1.jsonl", ("{oops",)))
    dest = str(tmp_path / "store")
    assert main(["stage", "--source", source, "--dest", dest]) == 2
    err = capsys.readouterr().err
    assert "line 5: not valid JSON" in err and "--skip-bad" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "store").exists()
    assert main(["stage", "--source", source, "--dest", dest, "--skip-bad", "--name", "l1"]) == 0
    captured = capsys.readouterr()
    assert "skipped: l1.jsonl: line 5: not valid JSON" in captured.err
    assert "staged l1 v1 (3 tasks, 2 candidates" in captured.out
    dataset = load_dataset(open_store(dest), "l1")
    assert dataset.manifest["skipped"] == [
        "l1.jsonl: line 5: not valid JSON: Expecting property name enclosed in double quotes at column 2"
    ]


BINARY = bytes(range(256)) * 4  # not UTF-8, NUL bytes included


@pytest.mark.parametrize("content", [BINARY, b"class Model:\n    pass\0\n"], ids=["undecodable", "nul-bytes"])
def test_a_binary_task_file_in_a_kernelbench_folder_is_one_bad_item(tmp_path, content, capsys):
    root = kernelbench_checkout(tmp_path / "kb")
    (root / "level1" / "99_Binary.py").write_bytes(content)
    with pytest.raises(ImportProblems) as info:
        import_source(str(root))
    (problem,) = info.value.imported.problems
    assert "99_Binary.py" in problem and "binary file?" in problem
    kept = import_source(str(root), skip_bad=True)
    assert [t.task_id for t in kept.tasks] == ["kernelbench/level1/19_ReLU", "kernelbench/level2/7_Scale"]
    dest = str(tmp_path / "store")
    assert main(["stage", "--source", str(root), "--dest", dest]) == 2
    err = capsys.readouterr().err
    assert "99_Binary.py" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert main(["stage", "--source", str(root), "--dest", dest, "--skip-bad", "--name", "kb"]) == 0
    assert "skipped:" in capsys.readouterr().err


def test_an_undecodable_jsonl_line_is_one_bad_item_and_the_rest_imports(tmp_path):
    path = cuda_l1_jsonl(tmp_path / "l1.jsonl")
    with open(path, "ab") as f:
        f.write(b'{"level_id": 1, "task_id": 5, "ref_code": "\xff\xfe"}\n')
    with pytest.raises(ImportProblems) as info:
        import_source(str(path))
    (problem,) = info.value.imported.problems
    assert "line 5" in problem and "not UTF-8 text" in problem
    kept = import_source(str(path), skip_bad=True)
    assert len(kept.tasks) == 3 and len(kept.candidates) == 2


def test_a_binary_jsonl_file_is_one_line(tmp_path):
    path = tmp_path / "l1.jsonl"
    path.write_bytes(BINARY)
    with pytest.raises(UserError) as info:
        import_source(str(path))
    assert "\n" not in str(info.value)


def test_a_binary_task_or_candidate_given_to_eval_is_one_line(tmp_path, capsys):
    binary = tmp_path / "binary.py"
    binary.write_bytes(BINARY)
    assert main(["eval", "--task", str(binary), "--candidate", str(binary)]) == 2
    err = capsys.readouterr().err
    assert "binary file?" in err and len(err.strip().splitlines()) == 1


FIFTH = REF.format(doc="fifth", k=2)


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("task_id", 2.9, "2.9"),  # not task 2
        ("task_id", 2.0, "2.0"),
        ("task_id", True, "true"),  # not task 1
        ("task_id", "2.9", '"2.9"'),
        ("task_id", "2", '"2"'),
        ("task_id", 0, "0"),
        ("task_id", -3, "-3"),
        ("task_id", 2**64, str(2**64)),  # past the 64-bit integer it is stored as
        ("task_id", [2], "a JSON array"),
        ("task_id", {"id": 2}, "a JSON object"),
        ("level_id", False, "false"),
        ("level_id", 1.5, "1.5"),
        ("level_id", "x" * 500, '"' + "x" * 36 + "..."),
    ],
)
def test_a_cuda_l1_id_that_is_not_a_json_integer_is_a_bad_item_naming_the_line_and_field(tmp_path, field, value, shown):
    row = {"level_id": 1, "task_id": 5, "ref_code": FIFTH, field: value}
    path = cuda_l1_jsonl(tmp_path / "l1.jsonl", (json.dumps(row),))
    with pytest.raises(ImportProblems) as info:
        import_source(str(path))
    (problem,) = info.value.imported.problems
    assert (
        problem
        == f"l1.jsonl: line 5: {field} must be a whole number from 1 up (a JSON integer such as 19), got {shown}"
    )
    kept = import_source(str(path), skip_bad=True)
    assert [t.task_id for t in kept.tasks] == ["cuda-l1/level1/19", "cuda-l1/level2/7", "cuda-l1/level3/1"]


@pytest.mark.parametrize(
    "line, words",
    [
        ("[" * 100_000, "not a CUDA-L1 row: JSON nested too deep"),
        ('{"level_id": 1, "task_id": ' + "9" * 5000 + "}", "not a CUDA-L1 row: Exceeds the limit (4300 digits)"),
    ],
)
def test_a_cuda_l1_line_python_cannot_read_is_one_bad_item(tmp_path, line, words):
    path = cuda_l1_jsonl(tmp_path / "l1.jsonl", (line,))
    with pytest.raises(ImportProblems) as info:
        import_source(str(path))
    (problem,) = info.value.imported.problems
    assert problem.startswith("l1.jsonl: line 5: ") and words in problem and len(problem) < 200


def test_stage_refuses_a_float_task_id_in_one_line(tmp_path, capsys):
    row = json.dumps({"level_id": 1, "task_id": 2.9, "ref_code": FIFTH})
    source = str(cuda_l1_jsonl(tmp_path / "l1.jsonl", (row,)))
    assert main(["stage", "--source", source, "--dest", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 5: task_id must be a whole number from 1 up" in err[0] and "got 2.9" in err[0]
    assert not (tmp_path / "store").exists()


def test_a_kernelbench_parquet_row_shows_a_long_name_cut_short(tmp_path):
    pq.write_table(
        pa.table({"code": [REF.format(doc="a", k=1)], "level": [0], "name": ["n" * 10_000], "problem_id": [1]}),
        tmp_path / "kb.parquet",
    )
    with pytest.raises(ImportProblems) as info:
        import_source(str(tmp_path / "kb.parquet"))
    (problem,) = info.value.imported.problems
    assert "level 0 is not a positive integer" in problem and len(problem) < len(str(tmp_path)) + 150
