"""The prompts and LoLA configs both sides of the equivalence test use (no dependencies)."""

BASE = "LoLA keeps sinks, a sliding window, a sparse cache and a linear state. "
# different lengths: under the window, over window + sparse cache (steps, evictions, linear state);
# the first two of one length in characters (tokens, with a byte-level tokenizer): they prefill together
PROMPTS = [(BASE * 8)[:300], (BASE * 8)[9:309], (BASE * 4)[:150], BASE[:40], (BASE * 12)[:520]]
MAX_TOKENS = 16
LOGPROBS = 3  # the top log-probabilities of each generated token both sides compare
CONFIGS = {
    "softmax_only": {"window": 32, "sparse_size": 16, "sinks": 4, "chunk": 16},
    "lolcats": {"window": 32, "sparse_size": 16, "sinks": 4, "chunk": 16, "mixing": "lolcats"},
    # per-head sparse sizes (a ragged run in the pages) and the linear state: prefix caching's case
    "ragged": {"window": 32, "sparse_size": 16, "sparse_size_per_head": [8, 24], "sinks": 4, "chunk": 16, "mixing": "lolcats"},
    # the folder's own config.json (written by `lola export`): no override
    "saved": None,
    # the tiny model exported with the lolcats config and LoLA parameters that differ per head
    # (make_tiny_trained.py): a rank must load its own heads' slice
    "tiny-saved": None,
    # the tiny model with a 256-position context exported with BOUNDED (test_bounded.py)
    "bounded": None,
}
# bounded positions, limits inside the tiny model's 256 positions: prompts of 600 and 900 bytes
# (tokens, byte-level) read the sinks and sparse tokens at re-assigned positions
BOUNDED = {"window": 32, "sparse_size": 16, "sinks": 4, "chunk": 16, "mixing": "lolcats", "positions": "bounded", "exact_distance": 128, "state_positions": 128}


def close_logprobs(outputs, expected: list, tolerance: float = 2e-3) -> float:
    """The largest difference between vLLM's top log-probabilities of every generated token
    (``outputs``: its RequestOutputs, asked with ``logprobs=LOGPROBS``) and the reference's;
    asserts it is below ``tolerance``."""
    worst = 0.0
    for out, steps in zip(outputs, expected, strict=True):
        got = [sorted((x.logprob for x in step.values()), reverse=True)[:LOGPROBS] for step in out.outputs[0].logprobs]
        assert len(got) == len(steps)
        worst = max([worst] + [abs(a - b) for g, e in zip(got, steps) for a, b in zip(g, e, strict=True)])
    assert worst < tolerance, worst
    return worst


def prompts(case: str) -> list[str]:
    """The prompts of ``case``: a saved (exported) model is a real one with BPE tokens, so one
    prompt is long enough (about 450 tokens) to fill window and sparse cache and fold tokens into
    the trained linear state."""
    if case == "bounded":  # past the model's 256 positions
        return [(BASE * 10)[:600], (BASE * 14)[:900]]
    return PROMPTS + [BASE * 30] if case == "saved" else PROMPTS
