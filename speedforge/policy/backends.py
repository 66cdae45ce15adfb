"""Generation backends, registered by name: `hf` (a local transformers model) and `openai`
(any OpenAI-compatible chat-completions endpoint, e.g. vLLM or `speedforge serve-policy`).

A backend is built from a PolicyConfig and turns chat messages into `n` completions. Problems a
user can fix before the run starts (a model path that does not exist, an unknown backend) are
UserErrors; a request that fails during a run raises BackendError, which the search loop
records as a failed sample.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from speedforge.config import PolicyConfig
from speedforge.registry import Registry
from speedforge.errors import UserError, first_line
from speedforge.extras import require
from speedforge.policy.default_model import DEFAULT_MODEL_NAME, default_model_file

API_KEY_ENV = ("SPEEDFORGE_OPENAI_API_KEY", "OPENAI_API_KEY")
BASE_URL_ENV = ("SPEEDFORGE_OPENAI_BASE_URL", "OPENAI_BASE_URL")
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# SmolLM2's chat format, used when a tokenizer carries no chat template of its own.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class BackendError(RuntimeError):
    """A generation request that failed; the search loop records it as a failed sample."""


@dataclasses.dataclass(frozen=True)
class Generation:
    """One completion."""

    text: str
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str = "stop"  # stop | length


class Backend(Protocol):
    name: str
    model_name: str

    def generate(
        self,
        messages: list[dict[str, str]],
        n: int = 1,
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> list[Generation]: ...


BACKENDS: Registry[Callable[[PolicyConfig], Backend]] = Registry("generation backend")
register_backend = BACKENDS.register  # a factory `f(config: PolicyConfig) -> Backend` under a name
known_backends = BACKENDS.names


def make_backend(config: PolicyConfig) -> Backend:
    """The backend that config.backend names, built from config."""
    return BACKENDS.get(config.backend)(config)


# -- hf: a local transformers model ------------------------------------------------------------


def resolve_model(model: str) -> tuple[str, str | None, str]:
    """(folder, gguf file name or None, display name) for a model setting of the hf backend.

    "" is the default model; a path to a .gguf file loads that file; a folder is a Hugging Face
    checkpoint (config.json and weights), e.g. one the trainer saved, or a LoRA adapter that names
    its base (speedforge.policy.adapters: loaded on that base); a store URI (s3://...) is
    either of them in the object store, copied to the cache first (speedforge.store.models);
    `champion` or models:/NAME@N is a version in the model registry, fetched to the cache
    (speedforge.models.fetch).
    """
    from speedforge.models.fetch import is_reference, local_reference
    from speedforge.policy.adapters import is_adapter
    from speedforge.store.models import is_model_uri, local_model

    if is_reference(model):
        folder, gguf_file, _ = resolve_model(local_reference(model))
        return folder, gguf_file, model
    if is_model_uri(model):
        folder, gguf_file, _ = resolve_model(local_model(model))
        return folder, gguf_file, model.rstrip("/")
    if not model:
        path = default_model_file()
        return str(path.parent), path.name, DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.parent), path.name, path.stem
    if path.is_dir():
        if not (path / "config.json").is_file() and not is_adapter(path):
            raise UserError(
                f"model folder {path} has no config.json: expected a Hugging Face checkpoint folder or a LoRA "
                "adapter with its base named (speedforge.policy.adapters)"
            )
        return str(path), None, path.name
    if path.exists():
        raise UserError(f"model path {path} is neither a .gguf file nor a checkpoint folder")
    raise UserError(f"model path {path} does not exist (expected a .gguf file or a checkpoint folder)")


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {device!r} asked for, but torch sees no CUDA device (use --device cpu)")
    return device


def model_dtype(configured: str, device: str, gguf_file: str | None) -> str:
    """The hf backend's weights dtype: `policy.dtype`, or with "auto" bfloat16 on a GPU except for
    a GGUF file (where transformers keeps its weights packed through the `kernels` package, the
    kernels compute in float32 and a bfloat16 model casts around every matmul: 86-111 ms a decode
    step against 27 ms in float32 on an H100, docs/benchmarks/generation.md), float32 elsewhere."""
    if configured != "auto":
        return configured
    return "bfloat16" if device.startswith("cuda") and not gguf_file else "float32"


def release_cached_memory(device: str) -> None:
    """Hand the CUDA memory torch's caching allocator keeps after a generate call (its KV cache)
    back to the device, where the evaluator's sandboxes, which time candidates on the same GPU,
    allocate theirs: a held-out check on an H100 had 5 of 128 samples fail with CUDA out of memory
    (2.6 of 79 GiB free) beside the generator's cached KV memory. Nothing on another device."""
    if not str(device).startswith("cuda"):
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cpu_threads(configured: int) -> int:
    """Torch threads for generation on CPU: the configured count, or with 0 the CPUs that the last
    minute's load average leaves free, counting this busy process as one of them (at least 1).
    On a shared machine more threads than free CPUs make generation many times slower (measured
    10x on 2 cores at load 8: the threads wait on each other); an idle one gets every CPU."""
    if configured > 0:
        return configured
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, round(cpus + 1 - os.getloadavg()[0])))


class HFBackend:
    """A causal LM loaded with transformers; sampling with torch's generator seeded per call."""

    name = "hf"

    def __init__(self, config: PolicyConfig):
        require("train", "transformers", "gguf", "accelerate", purpose="the hf policy backend")
        import torch
        import transformers

        from speedforge.policy.adapters import is_adapter, load_adapted

        self.config = config
        folder, gguf_file, self.model_name = resolve_model(config.model)
        self.device = pick_device(config.device)
        self.threads = cpu_threads(config.cpu_threads) if self.device == "cpu" else 0
        dtype = getattr(torch, model_dtype(config.dtype, self.device, gguf_file))
        transformers.logging.set_verbosity_error()
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
            if is_adapter(folder):  # base + adapter: the base fetched and checked by the adapter's record
                self.model = load_adapted(folder, dtype)
            else:
                self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load model {self.model_name} from {folder}: {first_line(exc)}") from None
        self.model.to(self.device).eval()
        self._adopt()

    @classmethod
    def wrap(cls, model, tokenizer, config: PolicyConfig, model_name: str) -> "HFBackend":
        """A backend around a model that is loaded already (the trainer's), on its device."""
        backend = cls.__new__(cls)
        backend.config, backend.model, backend.tokenizer, backend.model_name = config, model, tokenizer, model_name
        backend.device = str(next(model.parameters()).device)
        backend.threads = 0  # the caller's thread settings stay
        backend._adopt()
        return backend

    def _adopt(self) -> None:
        """Chat template, padding token and context length of the loaded model and tokenizer."""
        if not self.tokenizer.chat_template:
            self.tokenizer.chat_template = CHATML_TEMPLATE
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.context_tokens = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    def encode(self, messages: list[dict[str, str]]):
        """Token ids [1 x T] of the chat prompt, ending with the assistant's turn."""
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]

    def generate_ids(self, input_ids, n: int, max_new_tokens: int, **generate_kwargs):
        """Token ids [n x (T + new)] of n continuations of one prompt [1 x T].

        generate runs the prompt once per sequence. Running it once and sharing its KV cache
        (repeated n times) was tried: prefill 7.9 s -> 3.1 s for 4 x 883 tokens, but decode got
        slower (26.8 -> 18.3 tokens/s), a net loss beyond ~64 new tokens (docs/benchmarks/generation.md).
        """
        import torch

        with torch.inference_mode():
            return self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                num_return_sequences=n,
                pad_token_id=self.tokenizer.pad_token_id,
                **generate_kwargs,
            )

    def generate(self, messages, n=1, *, max_new_tokens=None, temperature=None, top_p=None, seed=None):
        import torch

        max_new_tokens = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        temperature = self.config.temperature if temperature is None else temperature
        top_p = self.config.top_p if top_p is None else top_p
        if self.threads:  # per call: OpenMP settings are per thread, and the server generates in its own
            torch.set_num_threads(self.threads)
        input_ids = self.encode(messages).to(self.device)
        prompt_tokens = int(input_ids.shape[1])
        if self.context_tokens and prompt_tokens >= self.context_tokens:
            raise BackendError(f"prompt of {prompt_tokens} tokens does not fit the model's {self.context_tokens}")
        if self.context_tokens:
            max_new_tokens = min(max_new_tokens, self.context_tokens - prompt_tokens)
        if seed is not None:
            torch.manual_seed(seed)
        if temperature > 0:
            output = self.generate_ids(
                input_ids, n, max_new_tokens, do_sample=True, temperature=temperature, top_p=top_p
            )
        else:  # greedy: every sample is the same, decode it once
            output = self.generate_ids(input_ids, 1, max_new_tokens, do_sample=False).repeat(n, 1)
        generations = []
        eos = self.tokenizer.eos_token_id
        for row in output[:, prompt_tokens:].tolist():
            ended = eos in row
            tokens = row[: row.index(eos) + 1] if ended else row
            generations.append(
                Generation(
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    completion_tokens=len(tokens),
                    prompt_tokens=prompt_tokens,
                    finish_reason="stop" if ended else "length",
                )
            )
        return generations

    def generate_batch(
        self,
        conversations: list[list[dict[str, str]]],
        n: int = 1,
        *,
        max_new_tokens=None,
        temperature=None,
        top_p=None,
        seed=None,
    ) -> list[list[Generation]]:
        """`n` samples of each conversation, all in one batched `generate` call (prompts padded on
        the left, one KV cache for the batch): [conversation][sample]."""
        import torch

        max_new_tokens = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        temperature = self.config.temperature if temperature is None else temperature
        top_p = self.config.top_p if top_p is None else top_p
        if self.threads:
            torch.set_num_threads(self.threads)
        texts = [
            self.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in conversations
        ]
        side, self.tokenizer.padding_side = self.tokenizer.padding_side, "left"
        try:
            batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        finally:
            self.tokenizer.padding_side = side
        width = int(batch["input_ids"].shape[1])
        if self.context_tokens:
            if width >= self.context_tokens:
                raise BackendError(f"a prompt of {width} tokens does not fit the model's {self.context_tokens}")
            max_new_tokens = min(max_new_tokens, self.context_tokens - width)
        if seed is not None:
            torch.manual_seed(seed)
        greedy = temperature <= 0  # every sample of a prompt is the same: decode it once
        sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p)
        with torch.inference_mode():
            output = self.model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                num_return_sequences=1 if greedy else n,
                pad_token_id=self.tokenizer.pad_token_id,
                **sampling,
            )
        if greedy:
            output = output.repeat_interleave(n, dim=0)
        output = output.cpu()
        release_cached_memory(self.device)  # the samples are evaluated next, on this GPU
        eos = self.tokenizer.eos_token_id
        prompt_tokens = batch["attention_mask"].sum(dim=1).tolist()
        out: list[list[Generation]] = [[] for _ in conversations]
        for index, row in enumerate(output[:, width:].tolist()):
            ended = eos in row
            tokens = row[: row.index(eos) + 1] if ended else row
            out[index // n].append(
                Generation(
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    completion_tokens=len(tokens),
                    prompt_tokens=int(prompt_tokens[index // n]),
                    finish_reason="stop" if ended else "length",
                )
            )
        return out


@register_backend("hf")
def _hf_backend(config: PolicyConfig) -> HFBackend:
    return HFBackend(config)


# -- openai: any OpenAI-compatible chat-completions endpoint -----------------------------------


def _first_env(names: tuple[str, ...]) -> str:
    return next((os.environ[n] for n in names if os.environ.get(n)), "")


class OpenAIBackend:
    """Chat completions over HTTP (stdlib urllib); the key comes from the environment."""

    name = "openai"

    def __init__(self, config: PolicyConfig):
        self.config = config
        self.base_url = (config.base_url or _first_env(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise UserError(f"endpoint {self.base_url!r} is not an http(s) URL")
        self._api_key = _first_env(API_KEY_ENV)
        self.model_name = config.model or self._served_model()

    def _request(self, path: str, body: dict | None = None) -> dict:
        url = f"{self.base_url}{path}"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(request, timeout=self.config.request_timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise BackendError(f"{url} answered HTTP {exc.code}: {_error_message(exc.read())}") from None
        except urllib.error.URLError as exc:
            raise BackendError(f"cannot reach {url}: {exc.reason}") from None
        except (TimeoutError, socket.timeout):
            raise BackendError(f"{url} did not answer within {self.config.request_timeout_s:g} s") from None
        except (ConnectionError, OSError) as exc:
            raise BackendError(f"connection to {url} failed: {exc}") from None
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BackendError(f"{url} answered with something that is not JSON: {raw[:120]!r}") from None
        if not isinstance(payload, dict):
            raise BackendError(f"{url} answered with JSON that is not an object: {str(payload)[:120]}")
        if "error" in payload:
            raise BackendError(f"{url} answered with an error: {_error_message(raw)}")
        return payload

    def _served_model(self) -> str:
        """The first model the endpoint lists (vLLM and serve-policy serve one)."""
        try:
            payload = self._request("/models")
        except BackendError as exc:
            raise UserError(f"no model named and the endpoint's model list failed: {exc} (pass --model NAME)") from None
        models = payload.get("data")
        if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
            raise UserError(f"{self.base_url}/models lists no model; pass --model NAME")
        return str(models[0]["id"])

    def generate(self, messages, n=1, *, max_new_tokens=None, temperature=None, top_p=None, seed=None):
        body = {
            "model": self.model_name,
            "messages": messages,
            "max_tokens": self.config.max_new_tokens if max_new_tokens is None else max_new_tokens,
            "temperature": self.config.temperature if temperature is None else temperature,
            "top_p": self.config.top_p if top_p is None else top_p,
        }
        if seed is not None:
            body["seed"] = seed
        generations: list[Generation] = []
        while len(generations) < n:  # some endpoints ignore n > 1: ask again for the rest
            body["n"] = n - len(generations)
            payload = self._request("/chat/completions", body)
            new = _parse_choices(payload, f"{self.base_url}/chat/completions")
            if not new:
                raise BackendError(f"{self.base_url}/chat/completions returned no choices")
            generations.extend(new)
        return generations[:n]


def _parse_choices(payload: dict, url: str) -> list[Generation]:
    choices = payload.get("choices")
    if not isinstance(choices, list):
        raise BackendError(f"{url} answered without a 'choices' list: {json.dumps(payload)[:120]}")
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    prompt_tokens = _as_int(usage.get("prompt_tokens"))
    generations = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise BackendError(f"{url} answered with a choice without a message: {str(choice)[:120]}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise BackendError(f"{url} answered with message content that is not text: {str(content)[:120]}")
        generations.append(
            Generation(
                text=content or "",
                completion_tokens=_as_int(usage.get("completion_tokens")) // max(len(choices), 1),
                prompt_tokens=prompt_tokens,
                finish_reason=str(choice.get("finish_reason") or "stop"),
            )
        )
    return generations


def _as_int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _error_message(raw: bytes) -> str:
    """The message of an OpenAI-style error body, else its first characters."""
    try:
        payload = json.loads(raw)
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or error)[:300]
        return str(error)[:300]
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return raw[:200].decode(errors="replace")


@register_backend("openai")
def _openai_backend(config: PolicyConfig) -> OpenAIBackend:
    return OpenAIBackend(config)
