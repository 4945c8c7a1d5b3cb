"""Multi-query associative recall (MQAR, Arora et al. 2023), generated from a seed.

A sequence holds ``num_pairs`` key-value pairs ``k1 v1 k2 v2 …`` (keys drawn without
replacement from ``[1, V/2)``, values from ``[V/2, V)``), then every key again as a query at
positions drawn with a power law (``a = 0.01`` favours early ones), separated by token 0. The
label at a query is the value it was paired with; every other position is ``-100`` (ignored
by ``torch.nn.functional.cross_entropy``). Small models trained on it in minutes on a CPU make
the place to study scoring policies against a *trained* linear state.
"""

from __future__ import annotations

import torch

__all__ = ["make_mqar", "mqar_accuracy"]


def make_mqar(
    num_examples: int, seq_len: int, num_pairs: int, vocab_size: int = 8192, power_a: float = 0.01, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate MQAR examples.

    Args:
        num_examples: ``N``.
        seq_len: ``L``, at least ``4 · num_pairs`` (context plus one query slot pair per key).
        num_pairs: key-value pairs per example (all queried).
        vocab_size: ``V``; keys come from ``[1, V/2)`` and values from ``[V/2, V)``.
        power_a: exponent of the power law over query gaps.
        seed: RNG seed.

    Returns:
        ``inputs [N, L]`` int64 and ``labels [N, L]`` int64 (``-100`` where unlabelled).
    """
    if num_pairs < 1:
        raise ValueError(f"num_pairs must be >= 1, got {num_pairs}")
    if seq_len < 4 * num_pairs:
        raise ValueError(f"seq_len must be >= 4 * num_pairs = {4 * num_pairs}, got {seq_len}")
    if vocab_size // 2 - 1 < num_pairs:
        raise ValueError(f"vocab_size {vocab_size} leaves fewer than num_pairs = {num_pairs} distinct keys")
    if num_examples < 1 or power_a <= 0:
        raise ValueError(f"num_examples must be >= 1 and power_a > 0, got {num_examples}, {power_a}")
    g = torch.Generator().manual_seed(seed)
    half = vocab_size // 2
    inputs = torch.zeros(num_examples, seq_len, dtype=torch.long)
    labels = torch.full((num_examples, seq_len), -100, dtype=torch.long)
    space = (seq_len - 2 * num_pairs) // 2  # query slots: every other position after the context
    weights = power_a * torch.arange(1, space + 1, dtype=torch.float64) ** (power_a - 1)
    for n in range(num_examples):
        keys = torch.randperm(half - 1, generator=g)[:num_pairs] + 1
        values = torch.randperm(vocab_size - half, generator=g)[:num_pairs] + half
        inputs[n, 0 : 2 * num_pairs : 2] = keys
        inputs[n, 1 : 2 * num_pairs : 2] = values
        slots = torch.multinomial(weights, num_pairs, replacement=False, generator=g)
        order = torch.randperm(num_pairs, generator=g)  # which key each slot asks for
        at = 2 * num_pairs + 2 * slots
        inputs[n, at] = keys[order]
        labels[n, at] = values[order]
    return inputs, labels


def mqar_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of labelled positions whose argmax prediction is the label.

    Args:
        logits: ``[N, L, V]``; labels: ``[N, L]`` with ``-100`` where unlabelled.
    """
    mask = labels != -100
    if not bool(mask.any()):
        raise ValueError("labels hold no labelled position")
    return float((logits.argmax(-1)[mask] == labels[mask]).float().mean())
