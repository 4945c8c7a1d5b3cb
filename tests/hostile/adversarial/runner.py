"""Run cases in child processes under a memory limit, one fork per case.

The parent imports torch, transformers and lola once and forks a child per case (``jobs`` at a
time): each child sets ``RLIMIT_AS``, works in its own folder, writes what happened to
``result.json`` and exits. A child that is killed (the kernel's OOM killer, a crash) counts as
``oom``; one that outlives its case's timeout is killed and counts as ``timeout``. The parent
itself never runs torch code, so forking it is safe.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from .harness import Case, Ctx, execute

GIB = 2**30


def preload() -> None:
    """Import what the cases use, once, before forking (each child then starts at once)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.pop("LOLA_DEBUG", None)
    import matplotlib

    matplotlib.use("Agg")
    import importlib

    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    # transformers imports a model's code on first use (seconds each): once here, not per case
    for name in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "starcoder2", "mixtral", "phi"):
        importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    for name in (
        "lola.cli",
        "lola.eval.demo",
        "lola.eval.runner",
        "lola.eval.perplexity",
        "lola.eval.calibrate",
        "lola.linearize",
        "lola.integrations.transformers",
        "lola.integrations.lm_eval.model",  # registers the "lola" model with lm-eval
        "lola.integrations.lm_eval.niah",
        "peft",
        "safetensors.torch",
        "yaml",
        "tqdm.auto",
        "wonderwords",
    ):
        importlib.import_module(name)


def check_limit_allows_imports(limit: int) -> str:
    """Import torch, transformers and lola in a fresh interpreter under ``limit``: the limit must
    not break them (else every case would look like an ``oom``)."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, ({0}, {0}));"
        "import torch, transformers, lola.cli, lola.integrations.transformers, lola.integrations.lm_eval.model;"
        "x = torch.ones(1 << 20); assert float(x.sum()) == 1 << 20"
    ).format(limit)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"FAILED (exit {done.returncode}): {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
    return "ok"


def _child(case: Case, folder: Path, limit: int) -> None:
    """The child's whole life: run the case and write ``result.json``; never returns."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        work = folder / "case"
        work.mkdir()
        os.chdir(work)
        log = os.open(folder / "output.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        import torch

        torch.set_num_threads(1)
        record = execute(case, Ctx(work))
        (folder / "result.json").write_text(json.dumps(record))
    except BaseException as err:  # noqa: BLE001 - the harness itself failed: say so
        try:
            (folder / "result.json").write_text(json.dumps({"kind": "killed", "why": f"harness error {type(err).__name__}: {err}"}))
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(0)


def _finish(case: Case, folder: Path, status: int) -> dict:
    result = folder / "result.json"
    if result.is_file():
        try:
            return json.loads(result.read_text())
        except json.JSONDecodeError:
            pass
    if os.WIFSIGNALED(status):
        return {"kind": "killed", "why": f"killed by {signal.Signals(os.WTERMSIG(status)).name}"}
    return {"kind": "killed", "why": f"exited {os.WEXITSTATUS(status)} without a result"}


def run_cases(cases: list[Case], root: Path, limit: int, jobs: int = 1, report=None) -> dict[str, dict]:
    """Run every case (``jobs`` at a time) and return ``{case id: record}``; ``report(case,
    record, seconds)`` is called as each one finishes."""
    pending = list(cases)
    running: dict[int, tuple[Case, float, Path]] = {}
    records: dict[str, dict] = {}
    while pending or running:
        while pending and len(running) < jobs:
            case = pending.pop(0)
            folder = root / case.id
            folder.mkdir(parents=True)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(case, folder, limit)
            running[pid] = (case, time.monotonic(), folder)
        time.sleep(0.05)
        for pid, (case, start, folder) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            elapsed = time.monotonic() - start
            if done == 0 and elapsed <= case.timeout:
                continue
            if done == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                record = {"kind": "timeout"}
            else:
                record = _finish(case, folder, status)
            record["seconds"] = round(elapsed, 2)
            records[case.id] = record
            del running[pid]
            if report is not None:
                report(case, record, elapsed)
    return records
