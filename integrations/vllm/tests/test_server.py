"""vLLM's OpenAI-compatible server on a LoLA model: started as a real process on a folder whose
config.json names the plug-in (no code, no overrides), 8 concurrent clients (completions and
chat, streaming and not), answers equal lola's own transformers path, a bad request answered
with vLLM's error while the server keeps serving, a clean stop. Run by ../run_tests.sh with
LOLA_VLLM_MODEL (the configured tiny Llama) and LOLA_VLLM_REFERENCE (its reference tokens);
every wait is bounded, and the server only listens on the loopback address."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from cases import MAX_TOKENS, PROMPTS

MODEL = os.environ["LOLA_VLLM_MODEL"]
REFERENCE = json.load(open(os.environ["LOLA_VLLM_REFERENCE"]))["softmax_only"]  # the config in the folder's config.json
HOST = "127.0.0.1"
START_TIMEOUT_S = 420
REQUEST_TIMEOUT_S = 120
# A plain chat template (the tiny tokenizer has none): the rendered prompt is known to the test.
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _stream(url: str, body: dict) -> list[dict]:
    """The JSON events of a server-sent stream, up to ``[DONE]``."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(), headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return events
            events.append(json.loads(data))
    raise AssertionError("the stream ended without [DONE]")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(TEMPLATE)
    port = _free_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--host", HOST, "--port", str(port)]
    cmd += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "4", "--no-enable-prefix-caching"]
    cmd += ["--served-model-name", "lola", "--chat-template", str(template)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://{HOST}:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"the server exited with {proc.returncode} before it was healthy:\n{log.read()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the server was not healthy within {START_TIMEOUT_S} s")
            time.sleep(2)
        yield base, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: vLLM shuts its engine down
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


EXPECTED = dict(zip(PROMPTS, REFERENCE))
# Greedy, a fixed length, and the generated token ids in the answer (compared as ids: a random
# model's bytes need not form text).
SAMPLING = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def _completion(base: str, prompt: str, stream: bool) -> list[int]:
    body = {"model": "lola", "prompt": prompt, **SAMPLING}
    if stream:
        return [t for e in _stream(f"{base}/v1/completions", body) for t in e["choices"][0].get("token_ids") or []]
    status, out = _post(f"{base}/v1/completions", body)
    assert status == 200, out
    return out["choices"][0]["token_ids"]


def _chat(base: str, content: str, stream: bool) -> list[int]:
    body = {"model": "lola", "messages": [{"role": "user", "content": content}], **SAMPLING}
    if stream:
        return [t for e in _stream(f"{base}/v1/chat/completions", body) if e["choices"] for t in e["choices"][0].get("token_ids") or []]
    status, out = _post(f"{base}/v1/chat/completions", body)
    assert status == 200, out
    return out["choices"][0]["token_ids"]


def test_eight_concurrent_clients_get_lolas_answers(server):
    base, _ = server
    jobs = [(p, stream) for p in PROMPTS for stream in (False, True)]  # 10 requests from 8 clients, 4 slots: queued and batched
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda job: _completion(base, *job), jobs))
    assert answers == [EXPECTED[p] for p, _ in jobs]


def test_chat_answers_are_the_completions_of_the_rendered_prompt(server):
    base, _ = server
    contents = [p[:60] for p in PROMPTS]
    jobs = [(c, stream) for c in contents for stream in (False, True)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        chats = list(pool.map(lambda job: _chat(base, *job), jobs))
        plain = list(pool.map(lambda c: _completion(base, f"user: {c}\nassistant:", False), contents))
    assert chats == [plain[contents.index(c)] for c, _ in jobs]


def test_a_bad_request_gets_an_error_and_the_server_keeps_serving(server):
    base, proc = server
    status, out = _post(f"{base}/v1/completions", {"model": "lola", "prompt": PROMPTS[0], "max_tokens": 5000})  # past max_model_len
    assert status == 400 and "error" in out, out
    status, out = _post(f"{base}/v1/completions", {"model": "nobody", "prompt": PROMPTS[0], "max_tokens": 4})
    assert status == 404, out
    assert proc.poll() is None
    assert _completion(base, PROMPTS[2], stream=False) == EXPECTED[PROMPTS[2]]


def test_the_server_stops_cleanly(server):
    _, proc = server
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    assert proc.wait(timeout=60) == 0
