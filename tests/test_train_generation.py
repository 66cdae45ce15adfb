"""GRPO's one generate call per step runs in bf16 on a GPU while the weights stay float32
(TRL's GRPOTrainer generates outside the training step's autocast, in the weights'
dtype; benchmarks/bench_grpo_generation.py measures the difference)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from speedforge.train.stages import STATIC_CACHE_BUCKET, generate_under_autocast, static_cache_length


def tiny_model():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def linear_dtypes_during_generate(model, device: str) -> set:
    seen = set()
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    ids = torch.tensor([[1, 2, 3, 4]], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, pad_token_id=0
        )
    for h in hooks:
        h.remove()
    assert out.shape == (1, 7)
    return seen


def test_on_the_cpu_generate_is_left_as_it_is() -> None:
    model = tiny_model()
    before = model.generate
    assert generate_under_autocast(model, "cpu") is model
    assert model.generate == before
    assert linear_dtypes_during_generate(model, "cpu") == {torch.float32}


def test_on_a_gpu_generate_runs_under_bf16_autocast_and_the_weights_stay_float32(monkeypatch) -> None:
    """The wrapper's plumbing, on any machine: torch.autocast("cuda", bfloat16) is entered around
    the model's own generate, which gets the caller's arguments and whose result is returned."""
    model = tiny_model()
    entered = []

    @contextlib.contextmanager
    def autocast(device_type, dtype=None, **kwargs):
        entered.append((device_type, dtype))
        yield

    calls = []
    model.generate = lambda *a, **k: calls.append((a, k)) or "generated"
    monkeypatch.setattr(torch, "autocast", autocast)
    generate_under_autocast(model, "cuda:0")
    assert model.generate(1, max_new_tokens=2) == "generated"
    assert entered == [("cuda", torch.bfloat16)] and calls == [((1,), {"max_new_tokens": 2})]
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_wrapped_model_saves_and_loads_as_plain_weights(tmp_path) -> None:
    import transformers

    model = generate_under_autocast(tiny_model(), "cuda")
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


@pytest.mark.gpu
def test_gpu_generate_computes_in_bf16_with_float32_weights() -> None:
    model = tiny_model().to("cuda")
    assert linear_dtypes_during_generate(model, "cuda") == {torch.float32}
    generate_under_autocast(model, "cuda")
    assert linear_dtypes_during_generate(model, "cuda") == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def decode_compile_requests(model, monkeypatch) -> list[bool]:
    """`disable_compile` as transformers' generate sees it when it decides whether to compile the
    decode step, for a call with TRL's generation config (compile disabled, a static cache)."""
    from transformers import GenerationConfig

    seen = []
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    model._valid_auto_compile_criteria = lambda kwargs, config: seen.append(config.disable_compile) and False
    ids = torch.tensor([[1, 2, 3, 4]])
    trl_config = GenerationConfig(
        max_new_tokens=3, do_sample=False, pad_token_id=0, cache_implementation="static", disable_compile=True
    )
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=trl_config)
    assert out.shape == (1, 7)
    assert trl_config.disable_compile  # the caller's config is left as it was
    return seen


def test_the_static_cache_decode_is_compiled_though_trl_disables_it(monkeypatch) -> None:
    """train.grpo.static_cache: TRL's GRPOTrainer generates with `disable_compile=True`; the
    wrapper lifts it for its own call, so transformers compiles the decode step on a GPU."""
    assert decode_compile_requests(generate_under_autocast(tiny_model(), "cuda", compile_decode=True), monkeypatch) == [
        False
    ]


def test_without_the_static_cache_trls_disable_compile_stands(monkeypatch) -> None:
    assert decode_compile_requests(generate_under_autocast(tiny_model(), "cuda"), monkeypatch) == [True]


def test_the_static_cache_length_is_a_bucket_that_covers_prompt_and_answer() -> None:
    assert static_cache_length(1195, 256) == static_cache_length(1318 - 256, 256) == 3 * STATIC_CACHE_BUCKET
    assert static_cache_length(STATIC_CACHE_BUCKET - 6, 6) == STATIC_CACHE_BUCKET
    assert static_cache_length(STATIC_CACHE_BUCKET - 5, 6) == 2 * STATIC_CACHE_BUCKET


def test_prompts_of_different_lengths_in_one_bucket_decode_with_one_cache(monkeypatch) -> None:
    """A cache that grows recompiles the compiled decode step; prompts of 4 and 9 tokens share one."""
    from transformers import GenerationConfig

    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    model = generate_under_autocast(tiny_model(), "cuda", compile_decode=True)
    config = GenerationConfig(
        max_new_tokens=3, do_sample=False, pad_token_id=0, cache_implementation="static", disable_compile=True
    )
    lengths = []
    for prompt in (4, 9):
        ids = torch.arange(1, prompt + 1).unsqueeze(0)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        assert out.shape == (1, prompt + 3)
        lengths.append(model._previous_max_cache_length)
    assert lengths == [STATIC_CACHE_BUCKET, STATIC_CACHE_BUCKET]


@pytest.mark.gpu
def test_gpu_static_cache_decode_runs_compiled() -> None:
    from transformers import GenerationConfig

    model = generate_under_autocast(tiny_model().to("cuda"), "cuda", compile_decode=True)
    ids = torch.tensor([[1, 2, 3, 4]], device="cuda")
    config = GenerationConfig(
        max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static", disable_compile=True
    )
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    assert out.shape == (1, 8) and hasattr(model, "_compiled_call")


def cuda_stop_check_deferred() -> bool:
    from transformers.generation.utils import DeferredStopCheck

    return DeferredStopCheck.is_supported(torch.device("cuda"), None, False, False)


def test_the_deferred_stop_check_is_on_for_cuda_only_within_its_context() -> None:
    """transformers defers generate's per-token 'all finished?' read only on mps; the context turns
    it on for CUDA under the same rule, and leaves it as it was after, also after an error."""
    from transformers.generation.utils import DeferredStopCheck

    from speedforge.train.stages import deferred_stop_check

    assert not cuda_stop_check_deferred()
    with deferred_stop_check("cuda:0"):
        assert cuda_stop_check_deferred()
        assert not DeferredStopCheck.is_supported(torch.device("cuda"), None, False, True)  # an assistant model: never
        assert not DeferredStopCheck.is_supported(torch.device("cpu"), None, False, False)
    assert not cuda_stop_check_deferred()
    assert DeferredStopCheck.is_supported(torch.device("mps"), None, False, False)  # the library's own rule stands
    with deferred_stop_check("cpu"):
        assert not cuda_stop_check_deferred()
    with pytest.raises(RuntimeError), deferred_stop_check("cuda"):
        raise RuntimeError("a failing generate call")
    assert not cuda_stop_check_deferred()


def deferred_during_generate(model, monkeypatch) -> list[bool]:
    """Whether the CUDA stop check is deferred while the model's forward runs inside generate."""
    seen: list[bool] = []
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    model.register_forward_hook(lambda *_: seen.append(cuda_stop_check_deferred()))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False, pad_token_id=0
        )
    assert seen and not cuda_stop_check_deferred()
    return sorted(set(seen))


def test_the_compiled_decode_defers_the_stop_check_during_its_call(monkeypatch) -> None:
    assert deferred_during_generate(
        generate_under_autocast(tiny_model(), "cuda", compile_decode=True), monkeypatch
    ) == [True]
    assert deferred_during_generate(generate_under_autocast(tiny_model(), "cuda"), monkeypatch) == [False]
    model = generate_under_autocast(tiny_model(), "cuda", compile_decode=True, defer_stop=False)
    assert deferred_during_generate(model, monkeypatch) == [False]


@pytest.mark.gpu
def test_gpu_deferred_stop_check_gives_the_same_tokens() -> None:
    """On a GPU the deferred check runs one extra forward and drops its token: with the same seed,
    sampled sequences (some ending early at EOS) are the same as with the per-token read."""
    from transformers import GenerationConfig

    outputs = []
    for defer in (False, True):
        model = generate_under_autocast(tiny_model().to("cuda"), "cuda", compile_decode=True, defer_stop=defer)
        ids = torch.tensor([[1, 2, 3, 4]] * 8, device="cuda")
        config = GenerationConfig(
            max_new_tokens=24,
            do_sample=True,
            top_k=0,
            pad_token_id=0,
            eos_token_id=5,
            cache_implementation="static",
            disable_compile=True,
        )
        torch.manual_seed(3)
        with torch.no_grad():
            outputs.append(
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config).cpu()
            )
    assert outputs[0].shape == outputs[1].shape and torch.equal(outputs[0], outputs[1])


def test_without_bf16_the_static_cache_still_compiles_and_defers_in_float32(monkeypatch) -> None:
    """A GPU without bf16 trains in float32: no autocast, but the compiled decode and the deferred
    stop check still apply (they were set up only inside the bf16 wrapper before)."""
    assert decode_compile_requests(
        generate_under_autocast(tiny_model(), "cuda", compile_decode=True, autocast=False), monkeypatch
    ) == [False]
    assert deferred_during_generate(
        generate_under_autocast(tiny_model(), "cuda", compile_decode=True, autocast=False), monkeypatch
    ) == [True]
    autocasts = []
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: autocasts.append(a) or contextlib.nullcontext())
    model = generate_under_autocast(tiny_model(), "cuda", compile_decode=True, autocast=False)
    assert linear_dtypes_during_generate(model, "cpu") == {torch.float32} and autocasts == []
    generate_under_autocast(tiny_model(), "cuda", compile_decode=True).generate(
        input_ids=torch.tensor([[1, 2]]), max_new_tokens=1, do_sample=False, pad_token_id=0
    )
    assert autocasts == [("cuda",)]  # the bf16 default does use it
