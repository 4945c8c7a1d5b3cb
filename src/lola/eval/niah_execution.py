"""Executing a needle-in-a-haystack run: prompts, generation per method (batched, left-padded), resumable."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from lola.eval.niah_records import RESULTS_FILE, SAMPLES_FILE, _write_results, check_out_folder, check_saved_configs, sample_depth
from lola.eval.niah_report import plot_results, refused_record
from lola.eval.niah_spec import NiahRun, check_budgets, method_configs, run_inputs
from lola.methods import holds_length
from lola.pretrained.resolve import run_config


def _cache_bytes(cache: Any) -> int:
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes())
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


def niah_prompts(run: NiahRun, tokenizer: Any) -> dict[tuple[int, int], Any]:
    """Every prompt of ``run``: ``{(length, index): NiahSample}``, lengths outer, samples inner.

    Sample ``i`` of ``n`` sits at depth ``(i + 0.5) / n`` with seed ``seed · 100003 + i``, so the
    same options give the same prompts (``lola niah`` and the lm-eval export share this).
    """
    from lola.eval.niah import make_sample

    depths = [sample_depth(i, run.samples) for i in range(run.samples)]
    from lola.data.text import read_text_file

    haystack = read_text_file(run.haystack_file) if run.haystack_file else None
    return {
        (n, i): make_sample(
            tokenizer,
            run.task,
            n,
            d,
            seed=run.seed * 100_003 + i,
            max_new_tokens=run.new_tokens,
            haystack=haystack,
            needle=run.needle,
            question=run.question,
            answer_prefix=run.answer_prefix,
            haystack_name=f"--haystack-file {run.haystack_file}" if run.haystack_file else None,
        )
        for n in run.lengths
        for i, d in enumerate(depths)
    }


def run_niah(run: NiahRun, model: Any, tokenizer: Any, out_dir: str | Path, progress: bool = True, batch_size: int = 1) -> list[dict]:
    """Run (or resume) ``run`` on ``model``; returns every sample's record.

    Records are appended to ``out_dir/samples.jsonl`` as they finish, so an interrupted run
    continues where it stopped when called again with the same ``out_dir``;
    ``out_dir/results.json`` holds the run, versions and the summary.

    Args:
        batch_size: samples of one length generated together as one left-padded batch
            (greedy decoding; each row's answer is the same as alone, up to float rounding).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    from tqdm.auto import tqdm

    out = Path(out_dir)
    done = check_out_folder(out, run, model)  # before anything is written (and on the weights now loaded)
    inputs = run_inputs(run, model)
    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = getattr(tokenizer, "eos_token_id", None) if pad_id is None else pad_id
    if batch_size > 1 and pad_id is None:
        raise ValueError("batch_size > 1 needs a tokenizer with a pad or eos token id")
    maps = None
    if run.feature_maps is not None:  # read and checked once, before any generation
        from lola.pretrained.folder import check_geometry, read_feature_maps

        maps = read_feature_maps(run.feature_maps)
        check_geometry(maps, model)
    check_budgets(run, model)
    configs = method_configs(run)
    # What each method really runs: trained maps fill in the fields a config leaves unset.
    # (and the limits of bounded positions that apply_lola takes from the model and the maps)
    effective = {m: run_config(c, maps, max_positions) for m, c in configs.items()}
    # Full attention, and LoLA with absolute positions, cannot read past the model's context:
    # their cells there are refused (shown so), a run with nothing left to read is refused whole.
    refused = [(m, n) for m, c in effective.items() for n in run.lengths if not holds_length(c, n, max_positions)]
    if len(refused) == len(effective) * len(run.lengths):
        raise ValueError(
            f"length {max(run.lengths)} exceeds what the model can hold ({max_positions} positions) and no method bounds its positions: "
            "give --positions bounded (every method but full) or shorter --lengths"
        )
    prompts = niah_prompts(run, tokenizer)
    from lola.io.outputs import run_lock

    with run_lock(out, "lola niah"):  # one run per folder: a second is refused at once
        results_path = out / RESULTS_FILE
        reason = f"past the model's {max_positions} positions"
        # again, under the lock: what a run before this one finished, each record bound to this run's prompt
        done = check_out_folder(out, run, model, prompts)
        check_saved_configs(out, effective)  # the same options, the same configs as the saved samples'
        records = list(done.values()) + [refused_record(m, n, reason) for m, n in refused]
        _write_results(results_path, run, records, effective, inputs)  # claims the folder; a resume keeps its summary
        samples_path = out / SAMPLES_FILE
        todo = [(m, n, i) for m in configs for n in run.lengths for i in range(run.samples) if (m, n, i) not in done and (m, n) not in refused]
        total = (len(configs) * len(run.lengths) - len(refused)) * run.samples
        bar = tqdm(total=total, initial=total - len(todo), desc="niah", disable=not progress)
        try:
            _generate_all(run, model, tokenizer, configs, todo, prompts, samples_path, records, bar, batch_size, pad_id, maps)
        except BaseException:  # interrupted or failed: results.json still summarises every saved sample
            bar.close()
            try:
                _write_results(results_path, run, records, effective, inputs)
            except Exception:  # noqa: S110 - the original error is the one to report
                pass
            raise
        bar.close()
        _write_results(results_path, run, records, effective, inputs)
        plot_results(records, out)
        return records


def _generate_all(
    run: NiahRun,
    model: Any,
    tokenizer: Any,
    configs: dict,
    todo: list,
    prompts: dict,
    samples_path: Path,
    records: list,
    bar: Any,
    batch_size: int,
    pad_id: int | None,
    maps: Any = None,
) -> None:
    """Generate every sample of ``todo``, appending each record to ``samples_path`` and ``records``
    (``maps``: the run's feature maps, already read)."""
    from transformers import DynamicCache

    from lola.eval.niah import string_match_all
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola
    from lola.io.outputs import check_held
    from lola.io.records import append_record, drop_cut_record, open_record_file

    samples_path = Path(samples_path)
    drop_cut_record(samples_path, "lola niah")  # a record a kill cut short: redone, not appended to
    # A plain file only (never through a link, never a FIFO); a hard link (`cp -al` snapshot) is
    # first rewritten as this folder's own, so that appending does not write into every copy.
    with open_record_file(samples_path, "lola niah") as log:
        for method, cfg in configs.items():
            mine = [(n, i) for (m, n, i) in todo if m == method]
            if not mine:
                continue
            if cfg is not None:
                apply_lola(model, cfg, feature_maps=maps)
            try:
                for batch in _batches(mine, batch_size):
                    samples = [prompts[key] for key in batch]
                    ids, mask, width = _left_pad([s.input_ids[0] for s in samples], pad_id)
                    cache = DynamicCache() if cfg is None else LoLACache(model)
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        out_ids = model.generate(ids, attention_mask=mask, max_new_tokens=run.new_tokens, do_sample=False, cache=cache, pad_token_id=pad_id)
                    seconds = (time.perf_counter() - t0) / len(batch)
                    cache_bytes = _cache_bytes(cache)
                    for row, ((n, i), s) in enumerate(zip(batch, samples)):
                        prediction = tokenizer.decode(out_ids[row, width:], skip_special_tokens=True)
                        tokens = s.length + out_ids.shape[1] - width
                        # A stock cache holds every row padded to the longest: count this row's share.
                        share = 1 / len(batch) if cfg is not None else tokens / (len(batch) * out_ids.shape[1])
                        rec = {
                            "method": method,
                            "length": n,
                            "index": i,
                            "depth": s.depth,
                            "prompt_tokens": s.length,
                            "answers": s.answers,
                            "prediction": prediction,
                            "score": string_match_all(prediction, s.answers),
                            "cache_bytes": round(cache_bytes * share),
                            "seconds": seconds,
                            "tokens_per_second": tokens / seconds,
                        }
                        check_held(samples_path.parent)  # the folder is still the one the run holds
                        append_record(log, rec)
                        records.append(rec)
                        bar.update(1)
            finally:
                if cfg is not None:
                    remove_lola(model)


def _batches(items: list[tuple[int, int]], size: int) -> list[list[tuple[int, int]]]:
    """Consecutive groups of at most ``size`` samples, never mixing lengths."""
    out: list[list[tuple[int, int]]] = []
    for item in items:
        if out and len(out[-1]) < size and out[-1][0][0] == item[0]:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def _left_pad(rows: list[torch.Tensor], pad_id: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``[B, T]`` left-padded ids, the ``[B, T]`` attention mask and ``T``."""
    width = max(r.shape[0] for r in rows)
    ids = torch.full((len(rows), width), 0 if pad_id is None else pad_id, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[0] :] = r
        mask[i, width - r.shape[0] :] = 1
    return ids, mask, width
