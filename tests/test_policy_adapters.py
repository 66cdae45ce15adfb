"""LoRA adapters as a policy: an adapter folder names its base by location and sha256; the hf
backend (serve-policy, optimize, the held-out check) loads base + adapter, and refuses a base
that changed; the registry carries the adapter with its base named; an export merges the two
into one folder whose outputs are the adapted model's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from speedforge.config import Config, LoraSettings, ModelsConfig, PolicyConfig, TrainConfig  # noqa: E402
from speedforge.errors import UserError  # noqa: E402
from speedforge.policy.adapters import BASE_FILE, describe_base, is_adapter, read_base  # noqa: E402
from speedforge.policy.backends import HFBackend, resolve_model  # noqa: E402
from speedforge.train.lora import lora_config, save_adapter  # noqa: E402

PROMPT = [{"role": "user", "content": "write a kernel"}]


def make_adapter(base_folder: str, out: Path) -> Path:
    """An adapter on `base_folder` whose B matrices are not zero (a trained one changes outputs)."""
    from peft import get_peft_model

    model = transformers.AutoModelForCausalLM.from_pretrained(base_folder)
    peft_model = get_peft_model(model, lora_config(LoraSettings(rank=4, target_modules=("q_proj", "v_proj"))))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    save_adapter(peft_model, out, describe_base(base_folder, base_folder))
    transformers.AutoTokenizer.from_pretrained(base_folder).save_pretrained(out)
    return out


def logits(model, tokenizer) -> torch.Tensor:
    ids = tokenizer("a b c", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(scope="module")
def base_and_adapter(tiny_model, tmp_path_factory):
    base = tmp_path_factory.mktemp("base")
    shutil.copytree(tiny_model, base, dirs_exist_ok=True)
    return str(base), make_adapter(str(base), tmp_path_factory.mktemp("adapter"))


def test_an_adapter_names_its_base_and_the_hf_backend_loads_base_and_adapter(base_and_adapter):
    base, adapter = base_and_adapter
    assert is_adapter(adapter) and not (adapter / "config.json").exists()
    record = read_base(adapter)
    assert record.location == base and record.sha256 == describe_base(base, base).sha256
    assert "model.safetensors" in record.files
    assert resolve_model(str(adapter))[0] == str(adapter)  # a model folder like any other
    backend = HFBackend(PolicyConfig(model=str(adapter), device="cpu", max_new_tokens=3))
    assert type(backend.model).__name__ == "PeftModelForCausalLM"
    plain = transformers.AutoModelForCausalLM.from_pretrained(base)
    adapted = logits(backend.model, backend.tokenizer)
    assert not torch.allclose(adapted, logits(plain, backend.tokenizer))  # the adapter is applied
    with backend.model.disable_adapter():  # the base within is the base as it was saved
        assert torch.allclose(logits(backend.model, backend.tokenizer), logits(plain, backend.tokenizer))
    assert len(backend.generate(PROMPT, 2, temperature=0)) == 2


def test_a_base_that_changed_since_the_adapter_was_trained_is_refused(base_and_adapter, tmp_path):
    base, adapter = base_and_adapter
    moved = tmp_path / "adapter"
    shutil.copytree(adapter, moved)
    changed = tmp_path / "base"
    shutil.copytree(base, changed)
    model = transformers.AutoModelForCausalLM.from_pretrained(changed)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    model.save_pretrained(changed)
    record = json.loads((moved / BASE_FILE).read_text())
    (moved / BASE_FILE).write_text(json.dumps({**record, "location": str(changed)}))
    with pytest.raises(UserError, match=r"not the one it was trained on: model.safetensors has sha256"):
        HFBackend(PolicyConfig(model=str(moved), device="cpu"))
    (moved / BASE_FILE).write_text(json.dumps({**record, "sha256": "0" * 64}))
    with pytest.raises(UserError, match="does not match the files it lists"):
        HFBackend(PolicyConfig(model=str(moved), device="cpu"))


def test_the_registry_carries_an_adapter_and_a_reference_to_it_loads_on_its_base(base_and_adapter, tmp_path, capsys):
    from speedforge.cli import main
    from speedforge.recipes.models import open_registry, register_checkpoint, resolve_registered

    base, adapter = base_and_adapter
    registry = tmp_path / "registry"
    registry.mkdir()
    config = Config(
        policy=PolicyConfig(model="models:/policy@1", device="cpu", max_new_tokens=2),
        train=TrainConfig(store=str(registry)),
        models=ModelsConfig(cache_dir=str(tmp_path / "cache")),
    )
    version = register_checkpoint(config, str(adapter), evaluate=False, say=lambda _: None)
    assert (version.base, version.base_sha256) == (base, read_base(adapter).sha256)
    assert open_registry(config).version(1).base_sha256 == version.base_sha256
    resolved, found = resolve_registered(config)
    # fetched to the cache, then loaded as serve-policy loads it
    assert found.version == 1 and is_adapter(resolved.policy.model)
    backend = HFBackend(resolved.policy)
    assert type(backend.model).__name__ == "PeftModelForCausalLM"
    yaml = tmp_path / "c.yaml"
    yaml.write_text(f"train:\n  store: {registry}\nmodels:\n  cache_dir: {tmp_path / 'cache'}\n")
    assert main(["--config", str(yaml), "models", "show", "1"]) == 0
    shown = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("base model")]
    assert shown == [["base", "model", base, "(sha256", f"{version.base_sha256})"]]


def test_an_export_merges_the_adapter_into_one_folder_that_loads_without_peft(base_and_adapter, tmp_path, capsys):
    from speedforge.cli import main

    base, adapter = base_and_adapter
    out = tmp_path / "merged"
    assert main(["models", "export", str(adapter), str(out), "--merge"]) == 0
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    merged = transformers.AutoModelForCausalLM.from_pretrained(out)
    backend = HFBackend(PolicyConfig(model=str(adapter), device="cpu"))
    assert torch.allclose(logits(merged, backend.tokenizer), logits(backend.model, backend.tokenizer), atol=1e-4)
    copied = tmp_path / "copied"
    assert main(["models", "export", str(adapter), str(copied)]) == 0
    assert is_adapter(copied)
    assert main(["models", "export", str(adapter), str(copied)]) != 0
    assert "exists and is not empty" in capsys.readouterr().err


def test_models_push_carries_an_adapter_that_loads_from_its_store_uri_on_its_base(
    base_and_adapter, s3_uri, tmp_path, capsys, monkeypatch
):
    from speedforge.cli import main

    base, adapter = base_and_adapter
    monkeypatch.setenv("SPEEDFORGE_CACHE", str(tmp_path / "cache"))  # the fetched copy lands here, not in ~
    assert main(["models", "push", f"{s3_uri}/adapter", "--model", str(adapter)]) == 0
    assert f"a LoRA adapter on {base}" in capsys.readouterr().out
    backend = HFBackend(PolicyConfig(model=f"{s3_uri}/adapter", device="cpu"))
    assert type(backend.model).__name__ == "PeftModelForCausalLM"
    assert backend.model_name == f"{s3_uri}/adapter"
