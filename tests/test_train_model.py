"""The default model (SmolLM2-135M-Instruct, a GGUF file) can be fine-tuned: transformers marks a
model loaded from GGUF as quantized and not trainable even when it dequantized every weight, and
the trainers refuse such a model; speedforge.train.stages.plain_weights drops the wrong marks."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from speedforge.train.weights import plain_weights  # noqa: E402


@pytest.fixture(scope="module")
def default_model():
    import torch
    import transformers

    from speedforge.policy.backends import resolve_model

    folder, gguf_file, _ = resolve_model("")
    if not gguf_file:
        pytest.skip("the default model is not a GGUF file here")
    transformers.logging.set_verbosity_error()
    return lambda: transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)


def trainer(model, tmp_path):
    import transformers

    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_steps=1, report_to=[])
    return transformers.Trainer(model=model, args=args)


def test_the_default_gguf_model_is_refused_as_loaded_and_trains_with_plain_weights(default_model, tmp_path):
    import torch

    model = default_model()
    if getattr(model, "hf_quantizer", None) is not None:  # what transformers does today: the trainers refuse it
        with pytest.raises(ValueError, match="quantized"):
            trainer(model, tmp_path)
    model = plain_weights(model, "default model")
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    trainer(model, tmp_path)  # accepted
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.save_pretrained(tmp_path / "saved")  # a checkpoint serve-policy loads (no GGUF quantizer left to refuse it)
    assert (tmp_path / "saved" / "config.json").is_file()
