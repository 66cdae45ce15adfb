"""The family registry: one record per task family, complete, the built-in ones declared in one
place, every module a record names importable."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from importlib import resources

import pytest

from speedforge import families
from speedforge.errors import UserError


def test_an_unknown_family_is_a_user_error_naming_the_known_ones():
    with pytest.raises(UserError, match=r"^unknown task family 'rust'; known: ann, cpp, cuda$"):
        families.get("rust")
    assert families.find("rust") is None


def test_every_family_has_every_fact():
    for family in families.all_families():
        assert family.device in families.DEVICES and family.language in families.LANGUAGES
        sandbox = importlib.import_module(family.sandbox)
        assert callable(sandbox.build) and callable(sandbox.run), family.name
        assert resources.files("speedforge.policy").joinpath("templates", family.template).is_file(), family.name
        assert bool(family.marker) == (family.language == "python"), family.name  # the parser's anchor in Python
        for ref in (family.prompt_context, family.task_list):
            assert not ref or callable(families.resolve(ref)), (family.name, ref)
        if family.kernelbench:
            assert resources.files("speedforge.tasks").joinpath("suite", family.name, "reference").is_dir()
        else:
            assert family.task_list, f"{family.name}: no built-in tasks from anywhere"


def test_the_builtin_families_say_what_the_evaluator_and_policy_do_with_them():
    cpp, cuda, ann = families.get("cpp"), families.get("cuda"), families.get("ann")
    assert (cpp.device, cuda.device, ann.device) == ("cpu", "cuda", "cpu")
    assert cuda.runs_on("cuda:1") and not cuda.runs_on("cpu") and cpp.runs_on("cuda") and ann.runs_on("cpu")
    assert (cpp.language, ann.language) == ("python", "cpp")
    assert ann.always_builds and ann.task_in_build_key and not cpp.always_builds and not cuda.task_in_build_key
    assert cpp.pin_cpus and not cuda.pin_cpus and not ann.pin_cpus


def test_the_builtin_families_are_declared_in_one_place_and_the_registry_imports_nothing_heavy():
    # a fresh interpreter: what asking the registry for every family imports
    script = (
        "import json, sys\n"
        "from speedforge import families\n"
        "found = [(f.name, f.sandbox, f.prompt_context, f.task_list) for f in families.all_families()]\n"
        "named = {f.sandbox for f in families.BUILTIN} | {r.partition(':')[0] for f in families.BUILTIN "
        "for r in (f.prompt_context, f.task_list) if r}\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'numpy', *named) if m in sys.modules)\n"
        "print(json.dumps([heavy, found, sorted(named)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    heavy, found, named = json.loads(out.stdout)
    assert heavy == []  # asking for every family imported no family module, no torch, no ray
    assert [name for name, *_ in found] == ["ann", "cpp", "cuda"]
    assert named == ["speedforge.ann.family", "speedforge.ann.tasks", "speedforge.evaluator.harness"]


def test_registering_another_record_under_a_known_name_is_an_error():
    cpp = families.get("cpp")
    assert families.register(cpp) is cpp  # the same record again: nothing changes
    with pytest.raises(ValueError, match="'cpp' is registered already"):
        families.register(dataclasses.replace(cpp, pin_cpus=not cpp.pin_cpus))
    assert families.get("cpp") is cpp


def test_a_family_registered_later_is_known_everywhere(monkeypatch):
    toy = dataclasses.replace(families.get("cpp"), name="toy")
    families.names()  # the built-in ones first
    monkeypatch.setitem(families._REGISTRY, "toy", toy)
    assert families.get("toy") is toy and "toy" in families.names()
    with pytest.raises(UserError, match="known: ann, cpp, cuda, toy"):
        families.get("rust")


def test_a_family_record_refuses_an_unknown_device_or_language():
    cpp = families.get("cpp")
    with pytest.raises(ValueError, match="device 'tpu'"):
        dataclasses.replace(cpp, device="tpu")
    with pytest.raises(ValueError, match="language 'rust'"):
        dataclasses.replace(cpp, language="rust")
