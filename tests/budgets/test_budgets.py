import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lola
from lola import budgets
from lola.budgets import HeadBudgets, allocate


@given(
    layers=st.integers(1, 6),
    heads=st.integers(1, 4),
    per_head=st.integers(0, 300),
    power=st.sampled_from([0.0, 0.3, 0.5, 1.0, 2.0]),
    floor_frac=st.floats(0, 1),
    cap=st.one_of(st.none(), st.integers(0, 2000)),
    data=st.data(),
)
def test_allocation_never_exceeds_the_uniform_total(layers, heads, per_head, power, floor_frac, cap, data):
    scores = torch.tensor(data.draw(st.lists(st.floats(0, 1), min_size=layers * heads, max_size=layers * heads))).view(layers, heads)
    floor = int(floor_frac * per_head)
    if cap is not None and cap < floor:
        cap = floor
    sizes = allocate(scores, per_head, power=power, floor=floor, cap=cap)
    total = per_head * layers * heads
    assert sizes.dtype == torch.int64 and sizes.shape == scores.shape
    assert int(sizes.sum()) <= total
    assert int(sizes.min()) >= floor
    if cap is not None:
        assert int(sizes.max()) <= cap
    if cap is None or cap * layers * heads >= total:
        assert int(sizes.sum()) == total  # nothing is thrown away unless every head is capped
    # A higher score never gets fewer slots (up to one slot of rounding).
    flat_s, flat_n = scores.flatten(), sizes.flatten()
    for i in range(flat_s.numel()):
        for j in range(flat_s.numel()):
            if flat_s[i] > flat_s[j]:
                assert flat_n[i] >= flat_n[j] - 1


def test_allocation_is_proportional_to_the_powered_scores():
    sizes = allocate(torch.tensor([[1.0, 4.0], [0.0, 0.0]]), 100, power=0.5)
    assert sizes.tolist() == [[133, 267], [0, 0]]  # 400 slots split 1 : 2 (√1 : √4)
    capped = allocate(torch.tensor([[1.0, 4.0], [0.0, 0.0]]), 100, power=1.0, cap=250)
    assert capped.tolist() == [[150, 250], [0, 0]]  # the cap's excess goes to the other head


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(scores=torch.tensor([1.0])), "layers, kv_heads"),
        (dict(scores=torch.tensor([[-1.0]])), ">= 0"),
        (dict(scores=torch.tensor([[float("nan")]])), "finite"),
        (dict(floor=300), "floor"),
        (dict(power=-1), "power"),
        (dict(cap=1, floor=2), "cap"),
    ],
)
def test_allocation_refuses_bad_input(bad, match):
    args = dict(scores=torch.ones(2, 2), per_head=100, power=0.5, floor=0, cap=None) | bad
    with pytest.raises(ValueError, match=match):
        allocate(args.pop("scores"), args.pop("per_head"), **args)


def test_budgets_apply_to_a_config_and_keep_its_overrides():
    b = HeadBudgets(sparse_size_per_head=[[10, 0], [4, 6]], uniform_sparse_size=5, scores=[[1, 0], [0.4, 0.6]], power=1.0)
    cfg = b.apply(lola.LoLAConfig(sparse_size=5, window=8, layer_overrides={1: {"window": 3}}))
    assert cfg.for_layer(0).sparse_size_per_head == [10, 0]
    assert cfg.for_layer(1).sparse_size_per_head == [4, 6] and cfg.for_layer(1).window == 3
    other = b.apply(lola.LoLAConfig(sparse_size=3, window=8))  # another total: re-allocated from the scores
    assert [other.for_layer(i).sparse_size_per_head for i in range(2)] == [[6, 0], [2, 4]]
    with pytest.raises(ValueError, match="kv_head"):
        b.apply(lola.LoLAConfig(sparse_size=5, gqa_storage="query_head"))
    with pytest.raises(ValueError, match="covers|cover"):
        b.apply(lola.LoLAConfig(sparse_size=5, layer_overrides={7: {"window": 1}}))


def test_budgets_leave_unset_fields_unset_so_trained_maps_can_fill_them_in():
    """Regression: applying budgets used to mark every field as set, so trained feature maps
    could no longer bring their fields nor have the mixing rule decided (lola niah --feature-maps
    ran softmax_only)."""
    from lola.pretrained.folder import FeatureMaps

    b = HeadBudgets(sparse_size_per_head=[[10, 0], [4, 6]], uniform_sparse_size=5, scores=[[1, 0], [0.4, 0.6]], power=1.0)
    cfg = b.apply(lola.LoLAConfig(sparse_size=5, window=8))
    assert cfg.model_fields_set == {"sparse_size", "window", "layer_overrides"}
    maps = FeatureMaps(config=lola.LoLAConfig(feature_map="hedgehog", feature_dim=8, mixing="lolcats"), geometry={}, tensors={}, path="maps")
    merged = maps.merge_into(cfg)
    assert merged.mixing == "lola_authors" and merged.feature_map == "hedgehog"  # LoLA on trained maps: the paper's rule
    hybrid = maps.merge_into(b.apply(lola.LoLAConfig(sparse_size=0, window=8)))  # every budget 0: the hybrid, as trained
    assert hybrid.mixing == "lolcats"
    assert merged.for_layer(1).sparse_size_per_head == [4, 6]


def test_budgets_over_the_uniform_total_are_refused(tmp_path):
    with pytest.raises(ValueError, match="more than the uniform"):
        HeadBudgets(sparse_size_per_head=[[10, 1]], uniform_sparse_size=5, scores=[[1, 0]], power=1.0)
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"sparse_size_per_head": [[10, 1]], "uniform_sparse_size": 5, "scores": [[1, 0]], "power": 1.0}))
    with pytest.raises(ValueError, match="b.json is not a valid budgets file"):
        budgets.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid budgets file"):
        budgets.load(path)
    with pytest.raises(ValueError, match="does not exist"):
        budgets.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="no shipped budgets named 'nope'"):
        budgets.load("nope")


def test_save_and_load_round_trip(tmp_path):
    b = HeadBudgets(sparse_size_per_head=[[3, 2]], uniform_sparse_size=3, scores=[[0.6, 0.4]], power=0.5, source={"command": "x"})
    b.save(tmp_path / "b.json")
    assert budgets.load(tmp_path / "b.json") == b


def test_shipped_budgets_fit_their_model_and_the_uniform_bytes():
    # The registered SmolLM2 budgets: 30 layers x 3 K/V heads, never more slots than uniform.
    assert "smollm2-135m-instruct" in budgets.available()
    b = budgets.load("smollm2-135m-instruct")
    assert (b.num_layers, b.num_kv_heads) == (30, 3)
    assert b.total_slots <= b.uniform_sparse_size * 90
    cfg = b.apply(lola.LoLAConfig(window=60, sparse_size=b.uniform_sparse_size, sinks=4))
    # Bytes of the exact memories per layer, summed: ragged sparse storage holds Σ λ_h slots.
    from lola.layer import memory_from_config

    total, uniform = 0, 0
    for i in range(30):
        for c, acc in ((cfg.for_layer(i), "calibrated"), (lola.LoLAConfig(window=60, sparse_size=b.uniform_sparse_size, sinks=4), "uniform")):
            mem = memory_from_config(c)
            mem.allocate(1, 9, 3, 64, 128, torch.float32, torch.device("cpu"))
            n = sum(t.numel() * t.element_size() for k, t in mem.state_dict().items() if k.startswith("sparse.") and k != "sparse.head_sizes")
            if acc == "calibrated":
                total += n
            else:
                uniform += n
    assert total <= uniform
