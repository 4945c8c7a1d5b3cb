"""Hostile inputs, class ``state``: a state or a saved cache no run could have written is refused
when it is loaded, naming the tensor (or the file and the tensor).

The mechanism: :func:`lola.engine.state_checks.check_state`, run by ``LoLAMemory.load_state_dict``
(and so by ``LoLACache.load``) for every state that comes from outside, compares it with what
the memory holds (:meth:`~lola.LoLAMemory.reference_state`): keys, dtypes, shapes but the batch,
finite values, positions, and sums of non-negative terms. A state belongs to one layer
(``LoLAAttention._check_spec`` / ``_check_owner``); ``LoLAMemory``'s row methods check their
index; ``LoLACache.load`` bounds the lengths it reads and ``save`` removes only what its earlier
``cache.json`` names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import lola
from lola.engine.state_checks import check_state
from lola.layer import compose, memory_from_config
from tests.hostile.common import CFG, Case, cut, edit_cache, ids, layer, make_file, make_folder, padded_mask, params, run_layer, tiny_lola

transformers = pytest.importorskip("transformers")

# -- states edited from outside: non-finite values, positions, seen --------------------------------


def _state():
    attn = compose(lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4), num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 4, 8, generator=g)
    state = attn.new_state()
    attn(x, x[:, :, :2], x[:, :, :2], state=state)
    return attn, state.state_dict()


def _damage(name):
    def nan(sd, key):
        sd[key] = sd[key].clone()
        sd[key].view(-1)[0] = float("nan")

    def inf(sd, key):
        sd[key] = sd[key].clone()
        sd[key].view(-1)[-1] = float("inf")

    return {"nan": nan, "inf": inf}[name]


FLOAT_KEYS = ["sinks.k", "sinks.v", "window.k", "window.v", "sparse.k", "sparse.v", "linear.H", "linear.s"]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_non_finite_values_are_refused_naming_the_tensor(key, kind):
    attn, sd = _state()
    _damage(kind)(sd, key)
    with pytest.raises(ValueError, match=rf"state\['{key}'\] holds non-finite values"):
        attn.new_state().load_state_dict(sd)


@pytest.mark.parametrize("key", ["sinks.pos", "window.pos", "sparse.pos"])
def test_a_position_beyond_seen_is_refused(key):
    attn, sd = _state()
    sd[key] = sd[key].clone()
    sd[key][0, 0, 0] = sd["seen"][0] + 5
    with pytest.raises(ValueError, match=rf"state\['{key}'\] holds a position at or beyond"):
        attn.new_state().load_state_dict(sd)


@pytest.mark.parametrize("source, target", [("sinks.pos", "sparse.pos"), ("window.pos", "sparse.pos"), ("sparse.pos", "sparse.pos")])
def test_a_position_held_twice_is_refused(source, target):
    attn, sd = _state()
    sd[target] = sd[target].clone()
    held = sd[source][0, 0][sd[source][0, 0] >= 0]
    slot = 1 if source == target else 0
    sd[target][0, 0, slot] = held[0]
    with pytest.raises(ValueError, match="a position is held twice"):
        attn.new_state().load_state_dict(sd)


def test_negative_seen_and_float_positions_are_refused():
    attn, sd = _state()
    bad = dict(sd, seen=-sd["seen"])
    with pytest.raises(ValueError, match="negative counts"):
        attn.new_state().load_state_dict(bad)
    bad = dict(sd, **{"window.pos": sd["window.pos"].float()})
    with pytest.raises(ValueError, match=r"state\['window.pos'\] must be .* integers"):
        attn.new_state().load_state_dict(bad)


def test_a_valid_state_loads_and_reproduces():
    attn, sd = _state()
    state = attn.new_state()
    state.load_state_dict(sd)
    loaded = state.state_dict()
    for k, t in loaded.items():
        if k.endswith((".k", ".v")):  # stored tokens bit-exact; empty slots are zeroed on load
            held = loaded[k.rsplit(".", 1)[0] + ".pos"] >= 0
            torch.testing.assert_close(t[held], sd[k][held], rtol=0, atol=0)
        else:
            torch.testing.assert_close(t, sd[k], rtol=0, atol=0)
    state.select_rows(torch.tensor([1, 0, 1]))  # reordering skips the check, and stays valid
    from lola.engine.state_checks import check_state

    check_state(state.state_dict())


# -- a state against its memory ---------------------------------------------------------------------


def _saved(cfg: lola.LoLAConfig = CFG):
    """A layer, and the state dict it reached after 30 tokens."""
    attn = layer(cfg)
    _, state = run_layer(attn)
    return attn, {k: t.clone() for k, t in state.state_dict().items()}


def _cast(*keys, dtype):
    def edit(sd):
        for key in keys:
            sd[key] = sd[key].to(dtype)

    return edit


def _narrow_head_dim(*keys):
    def edit(sd):
        for key in keys:
            sd[key] = sd[key][..., :4].contiguous()

    return edit


def _negative(key):
    def edit(sd):
        sd[key] = -sd[key].abs() - 0.5

    return edit


def _drop_newest(key):
    """Empty the slot of the newest position held (the window then no longer ends at seen - 1)."""

    def edit(sd):
        pos = sd[key]
        sd[key] = torch.where(pos == pos.amax(-1, keepdim=True), -1, pos)

    return edit


ATTENTION_FUSION = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy="fusion", policy_kwargs={"policies": ["attention", "recency"]})
EXPECTED = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy="expected_attention")
ATTENTION = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy="attention")
ELU = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="elu")
PADDED = lola.LoLAConfig(window=5, sparse_size=2, sinks=1, chunk=2)  # run with a left-padded row


# (id, config, edit of the state dict, the tensor the refusal must name)
STATE_FAULTS = [
    ("unknown-linear-tensor", CFG, lambda sd: sd.update({"linear.bias": torch.zeros(1)}), "linear.bias"),
    ("acc-without-a-tracking-policy", CFG, lambda sd: sd.update({"window.acc": torch.zeros(sd["window.pos"].shape)}), "window.acc"),
    ("acc-missing-for-a-fusion-with-attention", ATTENTION_FUSION, lambda sd: sd.pop("sparse.acc"), "sparse.acc"),
    ("sink-keys-bfloat16", CFG, _cast("sinks.k", "sinks.v", dtype=torch.bfloat16), "sinks.k"),
    ("window-positions-int16", CFG, _cast("window.pos", dtype=torch.int16), "window.pos"),
    ("seen-uint8", CFG, _cast("seen", dtype=torch.uint8), "seen"),
    ("sink-head-dim-4", CFG, _narrow_head_dim("sinks.k", "sinks.v"), "sinks.k"),
    ("linear-head-dim-4", CFG, _narrow_head_dim("linear.H"), "linear.H"),
    ("linear-rows-2", CFG, lambda sd: sd.update({"linear.s": sd["linear.s"].expand(2, -1, -1).clone()}), "linear.s"),
    ("elu-normaliser-negative", ELU, _negative("linear.s"), "linear.s"),
    ("attention-mass-negative", ATTENTION, _negative("sparse.acc"), "sparse.acc"),
    ("query-weight-negative", EXPECTED, _negative("queries.n"), "queries.n"),
    ("linear-state-on-meta", CFG, lambda sd: sd.update({"linear.H": sd["linear.H"].to("meta")}), "linear.H"),
    ("window-emptied", CFG, lambda sd: sd.update({"window.pos": torch.full_like(sd["window.pos"], -1)}), "window.pos"),
    ("window-lost-its-newest-token", CFG, _drop_newest("window.pos"), "window.pos"),
    ("seen-lowered-by-one-below-the-window", CFG, lambda sd: sd.update(seen=sd["seen"] + 1), "window.pos"),
]


class TestAStateAgainstItsMemory:
    """``check_state(state, memory)``: one check of every state from outside, at load."""

    @pytest.mark.parametrize("cfg, edit, key", [f[1:] for f in STATE_FAULTS], ids=[f[0] for f in STATE_FAULTS])
    def test_a_state_no_run_could_write_is_refused_at_load_naming_the_tensor(self, cfg, edit, key):
        attn, sd = _saved(cfg)
        edit(sd)
        with pytest.raises(ValueError, match=re.escape(key)):
            attn.new_state().load_state_dict(sd)

    def test_a_memory_no_layer_took_is_checked_against_the_state_s_own_geometry(self):
        """A hand-built memory knows no layout: the geometry is read off the state's linear.H and
        window.k, and a memory that disagrees with it is named."""
        _, sd = _saved()
        _narrow_head_dim("sparse.k", "sparse.v")(sd)
        with pytest.raises(ValueError, match=r"state\['sparse.k'\] has shape .*\[B, 2, 3, 8\]"):
            memory_from_config(CFG).load_state_dict(sd)

    def test_a_state_on_another_device_than_the_memory_s_is_refused_naming_the_tensor(self):
        attn, sd = _saved()
        _, used = run_layer(attn)  # allocated on the CPU
        sd["sparse.v"] = sd["sparse.v"].to("meta")
        with pytest.raises(ValueError, match=r"state\['sparse.v'\] lies on the meta device"):
            used.load_state_dict(sd)

    def test_the_odd_dtype_out_is_named_not_the_others(self):
        _, sd = _saved()
        _cast("window.k", "window.v", dtype=torch.float16)(sd)
        with pytest.raises(ValueError, match=r"state\['window.k'\] must be torch.float32 floats like the state's other keys"):
            check_state(sd, layer().new_state())

    @pytest.mark.parametrize(
        "cfg",
        [
            lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="taylor"),  # features of either sign
            lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, sparse_size_per_head=[3, 0]),  # ragged storage
            lola.LoLAConfig(window=6, sparse_size=3, sinks=0, chunk=3, gqa_storage="query_head", policy="expected_attention"),
            ATTENTION_FUSION,
            lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, window_per_head=[6, 2]),
            lola.LoLAConfig(window=6, sparse_size=3, sinks=2, chunk=1, schedule="tokenwise"),
            lola.LoLAConfig(window=0, sparse_size=3, sinks=1, chunk=3),
            PADDED,
        ],
        ids=["taylor", "ragged-sparse", "query-head-storage", "tracked-attention", "per-head-windows", "tokenwise", "no-window", "padded-rows"],
    )
    def test_a_state_a_run_wrote_loads_and_continues_alike(self, cfg):
        attn = layer(cfg)
        padded = cfg is PADDED
        _, state = run_layer(attn, batch=2 if padded else 1, mask=padded_mask() if padded else None)
        sd = {k: t.clone() for k, t in state.state_dict().items()}
        if cfg.feature_map == "taylor":  # the check is the map's: here s has negative entries
            assert bool((sd["linear.s"] < 0).any())
        loaded = attn.new_state()
        loaded.load_state_dict(sd)
        a, _ = run_layer(attn, tokens=5, batch=2 if padded else 1, state=state, seed=1)
        b, _ = run_layer(attn, tokens=5, batch=2 if padded else 1, state=loaded, seed=1)
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # (id, edit of the saved tensors, fragment)
    FILE_FAULTS = [
        ("sink-values-float16", _cast("layers.1.sinks.k", "layers.1.sinks.v", dtype=torch.float16), "layers.1.sinks.k|'sinks.k'"),
        ("window-positions-int32", _cast("layers.0.window.pos", dtype=torch.int32), "'window.pos'"),
        ("normaliser-negative", _negative("layers.1.linear.s"), "'linear.s'"),
        ("unknown-tensor", lambda t: t.update({"layers.0.sparse.scale": torch.ones(1)}), "'sparse.scale'"),
        ("linear-head-dim-4", _narrow_head_dim("layers.0.linear.H"), "'linear.H'"),
    ]

    @pytest.mark.parametrize("edit, fragment", [f[1:] for f in FILE_FAULTS], ids=[f[0] for f in FILE_FAULTS])
    def test_an_edited_saved_cache_is_refused_at_load_naming_file_and_tensor(self, tmp_path, edit, fragment):
        from lola.integrations.transformers import LoLACache

        model = saved_cache(tmp_path / "c")
        edit_cache(tmp_path / "c", tensors=edit)
        with pytest.raises(ValueError, match=r"cache-[0-9a-f]{16}\.safetensors: layer \d's state does not fit .*(" + fragment + ")"):
            LoLACache.load(tmp_path / "c", model)


# -- a state belongs to one layer -----------------------------------------------------------------


class TestAStateBelongsToOneLayer:
    """A state records its layer's index and the layer object that took it; no other reads it."""

    def test_a_state_of_another_layer_index_is_refused(self):
        _, state = run_layer(layer(layer=2))
        with pytest.raises(ValueError, match="state belongs to layer 2, this is layer 5"):
            run_layer(layer(layer=5), state=state)

    @pytest.mark.parametrize("allocated", [True, False], ids=["used", "fresh"])
    def test_a_state_taken_by_another_layer_of_the_same_configuration_is_refused(self, allocated):
        a, b = layer(), layer()
        state = run_layer(a)[1] if allocated else a.new_state()
        with pytest.raises(ValueError, match="taken by another LoLA layer of the same configuration"):
            run_layer(b, state=state)

    def test_a_state_no_layer_took_is_taken_by_the_first_that_reads_it(self):
        a, b = layer(), layer()
        state = memory_from_config(CFG)
        run_layer(a, state=state)
        assert state.owner() is a
        with pytest.raises(ValueError, match="taken by another LoLA layer"):
            run_layer(b, state=state)

    def test_a_state_moved_to_another_layer_of_the_same_cache_is_refused(self):
        from lola.integrations.transformers import LoLACache

        model = tiny_lola()
        cache = LoLACache(model)
        with torch.no_grad():
            model(ids(20), cache=cache)
            cache.layers[0].state = cache.layers[1].state
            with pytest.raises(ValueError, match="state belongs to layer 1, this is layer 0"):
                model(ids(1, seed=1), cache=cache)

    def test_a_state_of_an_identical_model_s_cache_is_refused(self, tmp_path):
        """Two models with the same weights are still two models: a state belongs to the layer
        object that took it (so a loaded cache is taken by the model it was loaded for)."""
        from lola.integrations.transformers import LoLACache

        a = saved_cache(tmp_path / "c")
        b = tiny_lola()
        theirs = LoLACache.load(tmp_path / "c", a)
        ours = LoLACache.load(tmp_path / "c", b)  # same weights: the fingerprint matches
        ours.layers[1].state = theirs.layers[1].state
        with torch.no_grad(), pytest.raises(ValueError, match="another model's"):
            b(ids(1, seed=2), cache=ours)

    def test_a_state_from_before_lola_was_reapplied_is_refused(self):
        from lola.integrations.transformers import LoLACache, apply_lola, remove_lola

        model = tiny_lola()
        old = LoLACache(model)
        with torch.no_grad():
            model(ids(20), cache=old)
        remove_lola(model)
        apply_lola(model, CFG)
        cache = LoLACache(model)
        cache.layers[0].state = old.layers[0].state
        with torch.no_grad(), pytest.raises(ValueError, match="before LoLA was re-applied"):
            model(ids(1, seed=3), cache=cache)


# -- LoLAMemory's methods given what they cannot take ----------------------------------------------


def used_state(batch: int = 2, cfg: lola.LoLAConfig = CFG):
    """A layer and the state it reached after 20 tokens of ``batch`` rows."""
    attn = layer(cfg)
    return attn, run_layer(attn, tokens=20, batch=batch, state=attn.new_state())[1]


def _load(make):
    def run(tmp_path):
        attn, state = used_state()
        attn.new_state().load_state_dict(make(state.state_dict()))

    return run


def _rows(index):
    def run(tmp_path):
        _, state = used_state()
        state.select_rows(index)

    return run


def _write_rows(index, other_batch=1, other=None):
    def run(tmp_path):
        attn, state = used_state()
        theirs = other if other is not None else used_state(other_batch)[1]
        state.write_rows(index, theirs)

    return run


def _bind(edit):
    def run(tmp_path):
        attn, state = used_state(1)
        memory = attn.new_state()
        sd = state.state_dict()
        layout = memory.page_layout(4, 2, 8, sd["linear.H"].shape[2], torch.float32)
        pages = {k: torch.zeros((3, *shape), dtype=dtype) for k, (shape, dtype) in layout.items()}
        rows = torch.tensor([0])
        pages, rows, seen = edit(pages, rows, sd["seen"].clone())
        memory.bind_pages(pages, rows, seen)

    return run


MEMORY = [
    Case("load_state_dict(None)", _load(lambda sd: None), TypeError, "state must be a mapping"),
    Case("load_state_dict of a list", _load(lambda sd: list(sd.items())), TypeError, "state must be a mapping"),
    Case("load_state_dict of an empty mapping", _load(lambda sd: {}), ValueError, "seen"),
    Case("seen as a Python int", _load(lambda sd: {**sd, "seen": 20}), (TypeError, ValueError), r"'seen'"),
    Case("window keys as a NumPy array", _load(lambda sd: {**sd, "window.k": sd["window.k"].numpy()}), (TypeError, ValueError), r"window\.k"),
    Case("keys of two batch sizes", _load(lambda sd: {**sd, "window.k": sd["window.k"][:1].clone()}), ValueError, r"window\.k"),
    Case("state_dict of an unallocated memory reloaded", _load(lambda sd: layer().new_state().state_dict()), ValueError, "seen"),
    Case("select_rows beyond the batch", _rows(torch.tensor([0, 5])), ValueError, "index .*rows"),
    Case("select_rows with float indices", _rows(torch.tensor([0.0, 1.0])), TypeError, "index .*int"),
    Case("select_rows with a 2-D index", _rows(torch.tensor([[0, 1]])), ValueError, "index .*1-D"),
    Case("select_rows with a negative index", _rows(torch.tensor([-1])), ValueError, "index .*rows"),
    Case("select_rows with a list", _rows([0, 1]), TypeError, "index .*tensor"),
    Case("select_rows with a bool mask", _rows(torch.tensor([True, False])), TypeError, "index .*int"),
    Case("select_rows before any call", lambda t: layer().new_state().select_rows(torch.tensor([0])), RuntimeError, "not allocated"),
    Case("write_rows beyond the batch", _write_rows(torch.tensor([7])), ValueError, "index .*rows"),
    Case("write_rows with float indices", _write_rows(torch.tensor([0.0])), TypeError, "index .*int"),
    Case("write_rows from a dict", _write_rows(torch.tensor([0]), other={"seen": torch.zeros(1)}), TypeError, "other must be a LoLAMemory"),
    Case(
        "write_rows from an unallocated state",
        _write_rows(torch.tensor([0]), other=layer().new_state()),
        ValueError,
        "other .*not allocated",
    ),
    Case(
        "write_rows from another configuration",
        _write_rows(torch.tensor([0]), other=used_state(1, lola.LoLAConfig(window=5, sparse_size=3, sinks=1, chunk=3))[1]),
        ValueError,
        "another configuration",
    ),
    Case("bind_pages missing a page", _bind(lambda p, r, s: ({k: v for k, v in list(p.items())[1:]}, r, s)), ValueError, "pages"),
    Case("bind_pages with a row beyond the pages", _bind(lambda p, r, s: (p, torch.tensor([3]), s)), ValueError, "rows"),
    Case(
        "bind_pages with a fractional row",
        _bind(lambda p, r, s: (p, torch.tensor([0.7]), s)),
        TypeError,
        "rows",
    ),
    Case(
        "bind_pages with pages of another dtype",
        _bind(lambda p, r, s: ({k: (v.half() if v.is_floating_point() else v) for k, v in p.items()}, r, s)),
        ValueError,
        "pages|dtype",
    ),
    Case("bind_pages with seen for two rows", _bind(lambda p, r, s: (p, r, torch.cat([s, s]))), ValueError, "seen"),
]


# -- saved caches ----------------------------------------------------------------------------------


def saved_cache(folder: Path, cfg: lola.LoLAConfig = CFG):
    """A LoLA model and the cache of 30 tokens it saved to ``folder``."""
    from lola.integrations.transformers import LoLACache

    model = tiny_lola(cfg)
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids(30), cache=cache)
    cache.save(folder)
    return model


def test_a_saved_cache_with_a_damaged_state_is_refused(tmp_path):
    """Through LoLACache.load, with the checksums recomputed (an edit, not damage)."""
    from lola.integrations.transformers import LoLACache, apply_lola
    from lola.models import tiny_random

    model, _ = tiny_random()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=2))
    cache = LoLACache(model)
    with torch.no_grad():
        model(torch.randint(0, 100, (1, 30)), cache=cache)
    cache.save(tmp_path / "c")
    edit_cache(tmp_path / "c", tensors=lambda t: t.update({"layers.0.linear.s": torch.full_like(t["layers.0.linear.s"], float("nan"))}))
    with pytest.raises(ValueError, match=r"layer 0's state does not fit .*linear.s'\] holds non-finite values"):
        LoLACache.load(tmp_path / "c", model)


def test_a_forward_with_another_models_cache_is_refused():
    from lola.integrations.transformers import LoLACache, apply_lola
    from lola.models import tiny_random

    ids = torch.randint(0, 100, (1, 20))
    a, b = tiny_random()[0], tiny_random()[0]
    for m in (a, b):
        apply_lola(m, lola.LoLAConfig(window=8, sparse_size=4, sinks=2))
    cache = LoLACache(a)
    with torch.no_grad():
        a(ids, cache=cache)
        with pytest.raises(ValueError, match="another model's LoLACache"):
            b(ids[:, -1:], cache=cache)
        a(ids[:, -1:], cache=cache)  # its own model still extends it


class TestCacheFiles:
    """``LoLACache.load`` bounds the lengths it reads; ``save`` removes only what its earlier
    ``cache.json`` names."""

    @pytest.mark.parametrize("length", [8193, 2**40], ids=["one-past-the-positions", "2**40"])
    def test_lengths_beyond_the_model_s_positions_are_refused_naming_the_file(self, tmp_path, length):
        from lola.integrations.transformers import LoLACache

        model = saved_cache(tmp_path / "c")
        assert model.config.max_position_embeddings == 8192
        edit_cache(tmp_path / "c", meta=lambda m: m.update(cumulative_lengths=[30, length]))
        with pytest.raises(ValueError, match=r"c/cache.json: cumulative_lengths must be 2 integers from 0 to the model's max_position_embeddings \(8192\)"):
            LoLACache.load(tmp_path / "c", model)

    def test_lengths_up_to_the_model_s_positions_load(self, tmp_path):
        from lola.integrations.transformers import LoLACache

        model = saved_cache(tmp_path / "c")
        edit_cache(tmp_path / "c", meta=lambda m: m.update(cumulative_lengths=[8192, 8192]))
        assert LoLACache.load(tmp_path / "c", model).get_seq_length() == 8192

    @pytest.mark.parametrize("beside", ["no-cache-json", "a-cache-json-naming-other-tensors"])
    def test_someone_s_cache_safetensors_is_kept(self, tmp_path, beside):
        folder = tmp_path / "c"
        if beside == "a-cache-json-naming-other-tensors":
            saved_cache(folder)
        else:
            folder.mkdir()
        (folder / "cache.safetensors").write_bytes(b"not ours")
        saved_cache(folder, lola.LoLAConfig(window=5, sparse_size=3, sinks=1, chunk=3))
        assert (folder / "cache.safetensors").read_bytes() == b"not ours"

    def test_the_legacy_tensors_an_earlier_cache_json_names_are_replaced(self, tmp_path):
        from lola.integrations.transformers import LoLACache

        folder = tmp_path / "c"
        saved_cache(folder)
        named = json.loads((folder / "cache.json").read_text())["tensors"]
        (folder / named).rename(folder / "cache.safetensors")  # as the earlier format named it
        edit_cache(folder, meta=lambda m: m.update(tensors="cache.safetensors"))
        (folder / ".lola-files.json").unlink()  # an earlier lola kept no record of what it wrote
        model = saved_cache(folder)
        assert not (folder / "cache.safetensors").exists()
        LoLACache.load(folder, model)

    def test_a_cache_json_giving_a_key_twice_is_refused_naming_it(self, tmp_path):
        from lola.integrations.transformers import LoLACache

        model = saved_cache(tmp_path / "c")
        text = (tmp_path / "c" / "cache.json").read_text()
        (tmp_path / "c" / "cache.json").write_text(text.replace('"format"', '"tensors": "elsewhere.safetensors",\n  "format"', 1))
        with pytest.raises(ValueError, match=r"cache.json is not valid JSON .*: key 'tensors' appears twice"):
            LoLACache.load(tmp_path / "c", model)


def _cache_load(prepare):
    def run(tmp_path):
        from lola.integrations.transformers import LoLACache

        model = saved_cache(tmp_path / "c")
        target = prepare(tmp_path / "c")
        LoLACache.load(target, model)

    return run


def _drop_layer_tensors(i):
    return lambda folder: edit_cache(folder, tensors=lambda t: [t.pop(k) for k in list(t) if k.startswith(f"layers.{i}.")]) or folder


def _cache_save(prepare):
    def run(tmp_path):
        from lola.integrations.transformers import LoLACache

        model = tiny_lola()
        cache = LoLACache(model)
        with torch.no_grad():
            model(ids(12), cache=cache)
        cache.save(prepare(tmp_path))

    return run


def _cache_json_folder(folder):
    (folder / "cache.json").unlink()
    (folder / "cache.json").mkdir()
    return folder


def _unapplied_load(tmp_path):
    from lola.integrations.transformers import LoLACache
    from lola.models import tiny_random

    saved_cache(tmp_path / "c")
    LoLACache.load(tmp_path / "c", tiny_random()[0])


def _empty_cache_round_trip(tmp_path):
    """A cache saved before any token: loading it and decoding from it must not pretend to hold a context."""
    from lola.integrations.transformers import LoLACache

    model = tiny_lola()
    cache = LoLACache(model)
    cache.save(tmp_path / "c")
    edit_cache(tmp_path / "c", meta=lambda m: m.update(cumulative_lengths=[30, 30]))
    LoLACache.load(tmp_path / "c", model)


CACHES = [
    Case("load from a missing folder", _cache_load(lambda f: f.parent / "nowhere"), ValueError, "nowhere"),
    Case("load from a file", _cache_load(lambda f: Path(make_file(f.parent, "cache.bin", b"x"))), ValueError, "cache.bin"),
    Case("cache.json of no bytes", _cache_load(lambda f: Path(make_file(f, "cache.json", "")).parent), ValueError, "cache.json"),
    Case("cache.json cut short", _cache_load(lambda f: cut(f / "cache.json") or f), ValueError, "cache.json"),
    Case("cache.json a list", _cache_load(lambda f: Path(make_file(f, "cache.json", "[1, 2]")).parent), ValueError, "does not hold a lola cache"),
    Case("cache.json a folder", _cache_load(_cache_json_folder), ValueError, "cache.json"),
    Case("tensors of one layer removed", _cache_load(_drop_layer_tensors(1)), ValueError, "layer 1 has seen 30 tokens .* no state"),
    Case(
        "tensors of a layer the model lacks",
        _cache_load(lambda f: edit_cache(f, tensors=lambda t: t.update({"layers.7.window.k": torch.zeros(1)})) or f),
        ValueError,
        "layers.7",
    ),
    Case("tensors file cut short", _cache_load(lambda f: cut(next(f.glob("cache-*.safetensors"))) or f), ValueError, "cache-"),
    Case("a model without LoLA", _unapplied_load, ValueError, "LoLA"),
    Case("lengths for a cache of no tokens", _empty_cache_round_trip, ValueError, "layer 0 has seen 30 tokens"),
    Case("save into a file's place", _cache_save(lambda t: Path(make_file(t, "c", "mine"))), ValueError, "c is a file|not a folder"),
    Case(
        "save through a linked cache.json",
        _cache_save(lambda t: (Path(make_folder(t, "c")) / "cache.json").symlink_to(Path(make_file(t, "v.json", "{}"))) or t / "c"),
        ValueError,
        "symbolic link",
    ),
    Case("save over another tool's cache.json", _cache_save(lambda t: Path(make_file(t, "c/cache.json", '{"mine": 1}')).parent), ValueError, "cache.json"),
]


@pytest.mark.parametrize("case", params(MEMORY + CACHES))
def test_an_api_input_is_refused_naming_it(case, tmp_path):
    with pytest.raises(case.error, match=case.match):
        case.run(tmp_path)


# -- layouts, not totals ----------------------------------------------------------------------------


@pytest.mark.parametrize("saved, loaded", [([4, 2], [2, 4]), ([3, 3], [6, 0]), ([4, 2], None)], ids=["swapped", "moved", "uniform"])
def test_a_state_loads_only_into_the_per_head_layout_it_was_saved_from(saved, loaded):
    # The same total gives the same shapes: without the layout in the state, tokens would move
    # to another head (or a head hold more than its size).
    def make(sizes):
        cfg = lola.LoLAConfig(window=2, sparse_size=3, sinks=1, chunk=2, sparse_size_per_head=sizes)
        return compose(cfg, num_heads=2, head_dim=4, num_kv_heads=2)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, 2, 4, generator=g) for _ in range(3))
    with torch.no_grad():
        _, state = make(saved)(q, k, v)
    target = make(loaded).new_state()
    expected = (
        rf"a state of sparse per-head sizes \[{saved[0]}, {saved[1]}\] cannot load into a layer of sparse per-head sizes \[{loaded[0]}, {loaded[1]}\]"
        if loaded
        else "per-head sizes"
    )
    with pytest.raises(ValueError, match=expected):
        target.load_state_dict(state.state_dict())
    again = make(saved).new_state()
    again.load_state_dict(state.state_dict())  # its own layout loads
    assert again.state_dict()["sparse.head_sizes"].tolist() == [saved]


# -- inference mode ---------------------------------------------------------------------------------


def test_a_cache_prefilled_under_inference_mode_generates_as_transformers_own_does():
    # Tensors made under torch.inference_mode() cannot be written in place outside it; the
    # stock cache concatenates, so it works across the boundary, and a LoLACache must too
    # (the same tokens as a cache prefilled outside inference mode).
    from lola.integrations.transformers import LoLACache

    model, x = tiny_lola(), ids(20)
    with torch.inference_mode():
        inside = LoLACache(model)
        model(x, cache=inside)
    with torch.no_grad():
        outside = LoLACache(model)
        model(x, cache=outside)
    runs = [model.generate(x, cache=c, max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True) for c in (inside, outside)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert all(torch.equal(a, b) for a, b in zip(runs[0].scores, runs[1].scores))


def test_a_layer_state_made_under_inference_mode_continues_outside_it():
    attn = layer()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 20, attn.num_heads if i == 0 else attn.num_kv_heads, attn.head_dim, generator=g) for i in range(3))
    with torch.inference_mode():
        _, state = attn(q[:, :12], k[:, :12], v[:, :12])
    with torch.no_grad():
        o, _ = attn(q[:, 12:], k[:, 12:], v[:, 12:], state=state)
        _, fresh = attn(q[:, :12], k[:, :12], v[:, :12])
        ref, _ = attn(q[:, 12:], k[:, 12:], v[:, 12:], state=fresh)
    assert torch.equal(o, ref) and not state.seen.is_inference()


def test_pages_written_by_one_per_head_layout_are_refused_by_another():
    # Pages of [4, 2] and of [2, 4] have the same shapes: bound by the other layout, a head
    # would read another head's slots (and hold one position twice).
    from lola.engine.state_pages import clear_rows

    def make(sizes):
        cfg = lola.LoLAConfig(window=2, sparse_size=3, sinks=1, chunk=2, sparse_size_per_head=sizes)
        return compose(cfg, num_heads=2, head_dim=4, num_kv_heads=2)

    writer, reader = make([4, 2]), make([2, 4])
    state = writer.new_state()
    layout = state.page_layout(2, 2, 4, writer.feature_dim, torch.float32)
    assert layout == reader.new_state().page_layout(2, 2, 4, reader.feature_dim, torch.float32)  # the same shapes
    pages = {key: torch.zeros(3, *shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
    rows = torch.tensor([1])
    clear_rows(pages, rows)
    state.bind_pages(pages, rows, seen=torch.tensor([0]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        writer(*(torch.randn(1, 12, 2, 4, generator=g) for _ in range(3)), state=state)
    state.release_pages()
    other = reader.new_state()
    with pytest.raises(ValueError, match=r"page 1 holds a state of sparse per-head sizes \[4, 2\], but this layer is of sparse per-head sizes \[2, 4\]"):
        other.bind_pages(pages, rows, seen=torch.tensor([12]))
    again = writer.new_state()
    again.bind_pages(pages, rows, seen=torch.tensor([12]))  # its own layout binds


# -- one layout descriptor: what decides how a state is read, beyond its shapes ---------------------

HEDGEHOG_8 = {"feature_map": "hedgehog", "feature_dim": 8}  # F = 16, as hedgehog_identity with D = 8


def _of(**changes) -> lola.LoLAConfig:
    return lola.LoLAConfig(**{**CFG.model_dump(), "mixing": "lola_authors", **changes})


@pytest.mark.parametrize(
    "writer, reader, match",
    [
        (_of(**HEDGEHOG_8), _of(), r"a state of feature map hedgehog \(F=16\) cannot load into a layer of feature map hedgehog_identity \(F=16\)"),
        (
            _of(feature_map="hedgehog", feature_dim=4),
            _of(feature_map="elu"),
            r"feature map hedgehog \(F=8\) cannot load into a layer of feature map elu \(F=8\)",
        ),
    ],
    ids=["hedgehog-f8-into-identity", "hedgehog-f4-into-elu"],
)
def test_a_state_of_another_feature_map_of_the_same_size_is_refused(writer, reader, match):
    # The same F gives the same shapes; the linear state holds other features.
    _, state = run_layer(layer(writer))
    target = layer(reader).new_state()
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(state.state_dict())


def test_write_rows_of_another_feature_map_is_refused():
    _, theirs = run_layer(layer(_of(**HEDGEHOG_8)))
    _, ours = run_layer(layer(_of()), batch=2)
    with pytest.raises(
        ValueError, match=r"another configuration: it holds a state of feature map hedgehog \(F=16\), this state is of feature map hedgehog_identity"
    ):
        ours.write_rows(torch.tensor([0]), theirs)


def _pages_bound_by(writer: lola.LoLAAttention, reader: lola.LoLAAttention):
    """Pages ``writer`` wrote over 30 tokens (page 1 of 3), released, then bound by ``reader``."""
    from lola.engine.state_pages import clear_rows

    state = writer.new_state()
    layout = state.page_layout(4, writer.storage_heads(state), 8, writer.feature_dim, torch.float32)
    assert layout == reader.new_state().page_layout(4, reader.storage_heads(state), 8, reader.feature_dim, torch.float32)  # the same shapes
    pages = {key: torch.zeros(3, *shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
    rows = torch.tensor([1])
    clear_rows(pages, rows)
    state.bind_pages(pages, rows, seen=torch.tensor([0]))
    run_layer(writer, state=state)
    state.release_pages()
    writer.new_state().bind_pages({k: p.clone() for k, p in pages.items()}, rows, seen=torch.tensor([30]))  # its own layout binds
    reader.new_state().bind_pages(pages, rows, seen=torch.tensor([30]))


@pytest.mark.parametrize(
    "writer, reader, match",
    [
        (_of(**HEDGEHOG_8), _of(), r"page 1 holds a state of feature map hedgehog \(F=16\), but this layer is of feature map hedgehog_identity \(F=16\)"),
        (_of(window=8, sparse_size=4), _of(window=4, sparse_size=8), r"page 1 holds a state of window size 8, but this layer is of window size 4"),
        (
            _of(window_per_head=[4, 8]),
            _of(window_per_head=[8, 4]),
            r"page 1 holds a state of window per-head sizes \[4, 8\], but this layer is of window per-head sizes \[8, 4\]",
        ),
        (_of(sinks=2, window=8, chunk=4), _of(sinks=4, window=6, chunk=4), r"page 1 holds a state of 2 sinks, but this layer is of 4 sinks"),
    ],
    ids=["hedgehog-into-identity", "window-sparse-traded", "window-per-head-swapped", "sinks-window-shifted"],
)
def test_pages_of_another_layout_of_the_same_shapes_are_refused_at_bind(writer, reader, match):
    # Before the descriptor only per-head sparse sizes were stamped on pages: these bound, and
    # were read as the reader's layout (or failed at the next call, inside the window).
    with pytest.raises(ValueError, match=match):
        _pages_bound_by(layer(writer), layer(reader))


def test_a_state_saved_without_a_layout_descriptor_still_loads():
    # States saved before the descriptor: the other checks alone, as then.
    attn = layer()
    _, state = run_layer(attn)
    saved = state.state_dict()
    old = {k: t for k, t in saved.items() if k != "layout"}
    loaded = attn.new_state()
    loaded.load_state_dict(old)
    again = attn.new_state()
    again.load_state_dict(saved)
    assert torch.equal(run_layer(attn, 6, state=loaded, seed=1)[0], run_layer(attn, 6, state=again, seed=1)[0])
    assert torch.equal(loaded.state_dict()["layout"], saved["layout"])  # stamped when saved again


def test_a_cache_of_the_previous_format_still_loads(tmp_path):
    from lola.integrations.transformers import LoLACache

    model = saved_cache(tmp_path / "c")

    def strip(tensors):
        for key in [k for k in tensors if k.endswith(".layout")]:
            del tensors[key]

    assert json.loads((tmp_path / "c" / "cache.json").read_text())["format"] == "lola-cache/2"
    edit_cache(tmp_path / "c", strip, lambda meta: meta.__setitem__("format", "lola-cache/1"))
    cache = LoLACache.load(tmp_path / "c", model)
    assert cache.layers[0].state.seen.tolist() == [30]


def test_a_bool_mask_not_of_the_batch_is_refused_by_batch_select_indices():
    from lola.integrations.transformers import LoLACache

    model = tiny_lola()
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids(10, batch=2), cache=cache)
    with pytest.raises(ValueError, match=r"a bool mask must hold one entry per row of the cache \(2\), got shape \(1,\); give the rows to keep as int indices"):
        cache.batch_select_indices(torch.tensor([True]))
    with pytest.raises(ValueError, match=r"must hold rows in \[0, 2\)"):
        cache.batch_select_indices(torch.tensor([2]))
    cache.batch_select_indices(torch.tensor([False, True]))  # a mask of the batch keeps its rows
    assert cache.layers[0].state.batch_size == 1
