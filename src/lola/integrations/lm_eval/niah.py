"""Export the prompts of ``lola niah`` as a local lm-evaluation-harness task.

:func:`export_niah` builds exactly the samples that ``lola niah`` (:func:`lola.eval.runner.run_niah`)
builds for the same options — the same :func:`lola.eval.runner.niah_prompts`, depths and
seeds — and writes them to a folder that lm-eval reads with ``--include_path``:

- ``<name>.<digest>.jsonl``: one line per sample (``text``, ``answers``, ``length``, ``depth``, …);
- ``<name>_utils_<digest>.py``: RULER's ``string_match_all`` as ``process_results`` (the
  fraction of the reference strings found, case-insensitive, in the prediction), overall and
  per length;
- ``<name>.yaml``: the task (``dataset_path: json``, ``output_type: generate_until``,
  ``doc_to_text: text``, greedy decoding for as many tokens as ``lola niah`` generates), which
  names the other two (:func:`exported_files`). Those are named by their content and the YAML
  is moved into place last: an export cut short leaves the previous task whole, and a new one
  removes the files of the previous.

The prompts are already wrapped in the model's chat template and end with the answer prefix;
evaluate them *without* lm-eval's ``--apply_chat_template`` (its default), so that lm-eval
tokenizes the very text ``lola niah`` does. No lm-eval import is needed to export.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["export_niah", "exported_files", "load_tokenizer", "task_name"]

_UTILS = '''"""Scoring of the exported lola niah task (written by lola.integrations.lm_eval.niah)."""

LENGTHS = {lengths!r}


def string_match_all(prediction, references):
    """RULER's score: the fraction of references found (case-insensitive) in the prediction."""
    pred = prediction.lower()
    return sum(r.lower() in pred for r in references) / len(references)


def process_results(doc, results):
    score = string_match_all(results[0], doc["answers"])
    out = {{"string_match_all": score}}
    for n in LENGTHS:  # -1: not a sample of this length (left out by aggregate)
        out[f"string_match_all_{{n}}"] = score if doc["length"] == n else -1.0
    return out


def aggregate(values):
    kept = [v for v in values if v != -1.0]
    return sum(kept) / len(kept) if kept else -1.0
'''


def task_name(task: str) -> str:
    """The lm-eval task name of an exported lola niah task (``lola_`` + the niah task name,
    so that it never shadows lm-eval's own RULER tasks)."""
    return f"lola_{task}"


def load_tokenizer(name_or_path: str | os.PathLike) -> Any:
    """The tokenizer ``lola niah --model NAME_OR_PATH`` uses, without loading the model.

    A registered name (``smollm2-135m-instruct``: its GGUF file is fetched once, as by
    :func:`lola.models.load`; ``tiny-random-llama``: :class:`lola.data.text.ByteTokenizer`), a
    ``.gguf`` file, or a Hugging Face folder.
    """
    from lola import models

    key = str(name_or_path)
    if key == models.TINY_RANDOM:
        from lola.data.text import ByteTokenizer

        return ByteTokenizer()
    from transformers import AutoTokenizer

    path = models.model_path(key)
    if path.is_file():
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoTokenizer.from_pretrained(path)


def exported_files(yaml_path: str | os.PathLike) -> tuple[Path, Path]:
    """The prompts (``.jsonl``) and scoring module (``.py``) an exported task's YAML names."""
    yaml_path = Path(yaml_path)
    text = yaml_path.read_text(encoding="utf-8")
    data = json.loads(re.search(r"^    test: (.+)$", text, re.M).group(1))
    module = re.search(r"^process_results: !function (\w+)\.process_results$", text, re.M).group(1)
    return Path(data), yaml_path.with_name(f"{module}.py")


def _previous_export(out: Path, name: str) -> list[str]:
    """The prompt and scoring files of earlier exports of task ``name`` in ``out`` (removed once
    the new YAML is in place): those of the YAML there now, and the older fixed names."""
    old = [out / f"{name}.jsonl", out / f"{name}_utils.py"]
    if (out / f"{name}.yaml").is_file():
        try:
            old += list(exported_files(out / f"{name}.yaml"))
        except (AttributeError, ValueError, OSError):  # not one of ours: check_target refuses it
            pass
    return [p.name for p in old if p.parent == out and _exported_by_us(p)]


def _yaml(name: str, data_file: Path, utils_module: str, new_tokens: int, lengths: list[int], header: str) -> str:
    metrics = "\n".join(f"  - metric: string_match_all_{n}\n    aggregation: !function {utils_module}.aggregate\n    higher_is_better: true" for n in lengths)
    return f"""{header}
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data_file))}
test_split: test
output_type: generate_until
# the prompt text as is: chat-wrapped by lola niah already, ending with the answer prefix
doc_to_text: text
doc_to_target: "{{{{answers | join(', ')}}}}"
target_delimiter: ""
process_results: !function {utils_module}.process_results
metric_list:
  - metric: string_match_all
    aggregation: mean
    higher_is_better: true
{metrics}
generation_kwargs:
  until: []
  max_gen_toks: {new_tokens}
  do_sample: false
  temperature: 0.0
repeats: 1
metadata:
  version: 1.0
"""


def export_niah(
    out_dir: str | os.PathLike,
    tokenizer: Any,
    task: str = "niah_single_1",
    lengths: list[int] | tuple[int, ...] = (1024, 2048),
    samples: int = 5,
    seed: int = 0,
    max_new_tokens: int | None = None,
    haystack_file: str | os.PathLike | None = None,
    needle: str | None = None,
    question: str | None = None,
    answer_prefix: str | None = None,
    name: str | None = None,
    max_positions: int | None = None,
) -> Path:
    """Write the prompts of ``lola niah`` with these options as an lm-eval task; returns the YAML path.

    The options mean what they mean for ``lola niah`` (:class:`lola.eval.runner.NiahRun`),
    and the samples are the same: sample ``i`` of ``samples`` at each length sits at depth
    ``(i + 0.5) / samples`` and is seeded with ``seed * 100003 + i``.

    Args:
        out_dir: the folder to write (created); pass it to lm-eval as ``--include_path``.
        tokenizer: the evaluated model's tokenizer (prompts are sized in its tokens and
            wrapped in its chat template); see :func:`load_tokenizer`.
        name: the lm-eval task name (default :func:`task_name` of ``task``).
        max_positions: the positions of the model to be evaluated (:func:`lola.models.max_positions`);
            a longer length is refused.

    The data file is referenced by its absolute path: export again after moving the folder.
    A warning is printed when a prompt would not tokenize back to the same ids in lm-eval
    (a tokenizer that adds a BOS token to text that does not start with it: evaluate with
    ``add_bos_token=False`` then).
    """
    from lola.eval.runner import NiahRun, niah_prompts

    run = NiahRun(
        task=task,
        lengths=list(lengths),
        samples=samples,
        seed=seed,
        max_new_tokens=max_new_tokens,
        haystack_file=None if haystack_file is None else str(haystack_file),
        needle=needle,
        question=question,
        answer_prefix=answer_prefix,
        methods=["full"],
        budgets=None,
    )
    if max_positions is not None and max(run.lengths) > max_positions:
        raise ValueError(f"--lengths: {max(run.lengths)} exceeds what the model can hold ({max_positions} positions)")
    name = name or task_name(task)
    if not name.isidentifier():
        raise ValueError(f"the task name must be a Python identifier (letters, digits, underscores), got {name!r}")
    out = Path(out_dir).resolve()
    from lola.io.outputs import check_output_folder, check_target, write_files

    check_output_folder(out, "--out")
    check_target(out / f"{name}.yaml", _exported_by_us, "export-niah")  # before any prompt is built
    # The prompts run_niah builds (a test compares the two).
    rows = []
    mismatched = 0
    for (n, i), s in niah_prompts(run, tokenizer).items():
        ids = s.input_ids[0].tolist()
        mismatched += _lm_eval_ids(tokenizer, s.text) != ids
        row = {"index": i, "length": n, "depth": s.depth, "key": s.key, "answers": s.answers, "prompt_tokens": len(ids), "text": s.text}
        rows.append(row)
    if mismatched:
        print(
            f"lola: {mismatched} of {len(rows)} prompts get a BOS token that lola niah does not add when lm-eval tokenizes them; "
            "evaluate with model_args add_bos_token=False",
            file=sys.stderr,
        )
    options = run.model_dump(
        mode="json", include={"task", "lengths", "samples", "seed", "max_new_tokens", "haystack_file", "needle", "question", "answer_prefix"}
    )
    header = f"{_YAML_MARK}: the prompts of `lola niah` with\n# " + json.dumps(options)
    data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    utils = _UTILS.format(lengths=list(run.lengths))
    # lm-eval reads the YAML, which names the other two: they are named by their content and the
    # YAML is renamed into place last, so a kill mid-export leaves the previous task whole.
    digest = hashlib.sha256((data + utils).encode("utf-8")).hexdigest()[:16]
    data_file, utils_module = out / f"{name}.{digest}.jsonl", f"{name}_utils_{digest}"
    yaml_text = _yaml(name, data_file, utils_module, run.new_tokens, list(run.lengths), header)
    written = write_files(
        out,
        {data_file.name: data, f"{utils_module}.py": utils, f"{name}.yaml": yaml_text},
        ours=_exported_by_us,
        writer="export-niah",
        remove=_previous_export(out, name),
    )
    return written[-1]


_YAML_MARK = "# Exported by `python -m lola.integrations.lm_eval export-niah`"
_UTILS_MARK = '"""Scoring of the exported lola niah task (written by lola.integrations.lm_eval.niah)."""'
_ROW_KEYS = {"index", "length", "depth", "key", "answers", "prompt_tokens", "text"}


def _exported_by_us(path: Path) -> bool:
    """Whether ``path`` is a file that ``export-niah`` wrote (task YAML, scoring module or prompts),
    which a new export may replace; anything else in their place is someone else's."""
    if path.is_symlink() or not path.is_file():  # a link, a folder, a FIFO (reading it would block)
        return False
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if path.suffix == ".yaml":
        return first.startswith(_YAML_MARK)
    if path.suffix == ".py":
        return first.rstrip("\n") == _UTILS_MARK
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and set(row) == _ROW_KEYS


def _lm_eval_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids lm-eval's ``HFLM`` gives ``text`` with default model_args (special tokens added
    unless the text starts with the BOS token)."""
    bos = getattr(tokenizer, "bos_token", None)
    add = not (bos and text.startswith(bos))
    return list(tokenizer(text, add_special_tokens=add).input_ids)
