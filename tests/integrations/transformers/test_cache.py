import json
import os
import shutil

import pytest
import torch

import lola
from lola.integrations.transformers import LoLACache, apply_lola
from lola.io.provenance import versions
from tests.integrations.transformers.conftest import left_padded, tiny
from tests.oracles import assert_rel_close

SMALL = lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4)


def test_generate_greedy_and_sampled_with_left_padding():
    model = apply_lola(tiny("llama"), SMALL)
    ids, mask = left_padded(length=25)
    with torch.no_grad():
        greedy = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, cache=LoLACache(model))
        torch.manual_seed(0)
        sampled = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=True, top_k=20, cache=LoLACache(model))
        # greedy generation equals re-running the whole sequence without a cache, token by token
        for row in range(ids.shape[0]):
            keep = torch.cat([mask[row].bool(), torch.ones(12, dtype=torch.bool)])
            seq = greedy[row, keep]
            logits = model(seq[None, :-1], use_cache=False).logits
            assert torch.equal(logits[0, -12:].argmax(-1), seq[-12:])
    assert greedy.shape == sampled.shape == (3, 37)


def test_beam_search_reorders_the_cache():
    # The reference recomputes every beam from its tokens at each step (no cache): a cache whose
    # rows were not reordered with the beams continues another beam's state and drifts from it.
    model = apply_lola(tiny("llama"), SMALL)
    ids, mask = left_padded(batch=2, length=20)
    beams = dict(attention_mask=mask, max_new_tokens=8, num_beams=3, num_return_sequences=3, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(ids, cache=LoLACache(model), **beams)
        recomputed = model.generate(ids, use_cache=False, **beams)
    assert cached.sequences.shape == (6, 28)
    assert torch.equal(cached.sequences, recomputed.sequences)
    assert_rel_close(cached.sequences_scores, recomputed.sequences_scores, 1e-4)


def test_crop_is_refused_clearly():
    model = apply_lola(tiny("llama"), SMALL)
    cache = LoLACache(model)
    with pytest.raises(NotImplementedError, match="cannot be cropped"):
        cache.crop(3)


def test_cache_bytes_stop_growing_during_a_long_generation():
    from transformers import StoppingCriteria, StoppingCriteriaList

    model = apply_lola(
        tiny("llama", layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16),
        lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=8),
    )
    cache = LoLACache(model)
    sizes = []

    class RecordBytes(StoppingCriteria):  # called once per generated token
        def __call__(self, input_ids, scores, **kwargs):
            sizes.append(cache.nbytes())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    ids = torch.randint(0, 101, (1, 4))
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=2000, min_new_tokens=2000, do_sample=False, cache=cache, stopping_criteria=StoppingCriteriaList([RecordBytes()])
        )
    assert out.shape[1] == 2004 and len(sizes) == 2000
    assert cache.get_seq_length() == 2003  # the last token generated is never fed back
    assert len(set(sizes)) == 1 and sizes[0] > 0


def test_save_and_resume_in_a_fresh_cache(tmp_path):
    model = apply_lola(tiny("llama"), SMALL)
    ids, mask = left_padded(length=40)
    with torch.no_grad():
        full = model(ids, attention_mask=mask, cache=LoLACache(model)).logits
        cache = LoLACache(model)
        model(ids[:, :27], attention_mask=mask[:, :27], cache=cache)
        cache.save(tmp_path / "c")
        restored = LoLACache.load(tmp_path / "c", model)
        rest = model(ids[:, 27:], attention_mask=mask, cache=restored).logits
    assert restored.get_seq_length() == 40
    assert_rel_close(full[:, 27:], rest, 1e-5)
    assert json.loads((tmp_path / "c" / "cache.json").read_text())["versions"] == versions()


def test_loading_a_cache_for_another_config_is_refused(tmp_path):
    model = apply_lola(tiny("llama"), SMALL)
    cache = LoLACache(model)
    with torch.no_grad():
        model(torch.randint(0, 101, (1, 10)), cache=cache)
    cache.save(tmp_path / "c")
    other = apply_lola(tiny("llama"), SMALL.model_copy(update={"window": 7}))
    with pytest.raises(ValueError, match="saved for another model"):
        LoLACache.load(tmp_path / "c", other)
    meta = json.loads((tmp_path / "c" / "cache.json").read_text())
    meta["format"] = "something-else"
    (tmp_path / "c" / "cache.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not hold a lola cache"):
        LoLACache.load(tmp_path / "c", model)


def _saved_cache(tmp_path, model):
    cache = LoLACache(model)
    with torch.no_grad():
        model(torch.randint(0, 101, (1, 30)), cache=cache)
    cache.save(tmp_path / "c")
    return tmp_path / "c"


def test_a_cache_for_other_weights_or_feature_maps_is_refused(tmp_path):
    model = apply_lola(tiny("llama"), SMALL)
    folder = _saved_cache(tmp_path, model)
    LoLACache.load(folder, model)  # the same model: fine
    with torch.no_grad():
        model.model.layers[1].self_attn.lola.window_factors.add_(0.5)  # other trained LoLA weights
    with pytest.raises(ValueError, match=r"other weights or feature maps.*\['weights'\]"):
        LoLACache.load(folder, model)
    other = apply_lola(tiny("llama"), SMALL)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.01)  # same shapes and config, other model weights
    with pytest.raises(ValueError, match="weights"):
        LoLACache.load(folder, other)


@pytest.mark.parametrize("lengths", [[-50, -50], [5000, 5000], [30], "30"])
def test_edited_lengths_are_refused(tmp_path, lengths):
    model = apply_lola(tiny("llama"), SMALL)
    folder = _saved_cache(tmp_path, model)
    meta = json.loads((folder / "cache.json").read_text())
    meta["cumulative_lengths"] = lengths
    (folder / "cache.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="cache.json does not match its own checksum"):
        LoLACache.load(folder, model)


def _tensors_file(folder):
    (found,) = folder.glob("cache-*.safetensors")
    return found


def test_damaged_files_are_named(tmp_path):
    model = apply_lola(tiny("llama"), SMALL)
    folder = _saved_cache(tmp_path, model)
    tensors = _tensors_file(folder)
    weights = tensors.read_bytes()
    tensors.write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match=rf"{tensors.name} does not match the checksum"):
        LoLACache.load(folder, model)
    (folder / "cache.json").write_text('{"format": "lola-cache/1", "fingerp')
    with pytest.raises(ValueError, match=r"cache.json is not valid JSON"):
        LoLACache.load(folder, model)
    (folder / "cache.json").unlink()
    with pytest.raises(ValueError, match=r"cache.json is missing"):
        LoLACache.load(folder, model)


def test_a_damaged_state_with_a_valid_checksum_is_still_checked(tmp_path):
    """Lengths below what a state has seen are refused even when the files agree with their checksums."""
    from lola.integrations.transformers.cache import _meta_checksum

    model = apply_lola(tiny("llama"), SMALL)
    folder = _saved_cache(tmp_path, model)
    meta = json.loads((folder / "cache.json").read_text())
    meta["cumulative_lengths"] = [3, 3]
    meta["checksum"] = _meta_checksum(meta)
    (folder / "cache.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"cumulative_lengths\[0\] = 3 is less than the 30 tokens"):
        LoLACache.load(folder, model)


def test_saving_over_a_cache_is_atomic_and_leaves_one_cache(tmp_path, monkeypatch):
    """A crash at any point of a save leaves a whole cache: the earlier one until the save's
    journal is written, the new one after (the next load completes the renames it lists); no
    temporary file stays behind."""
    import lola.io.outputs

    model = apply_lola(tiny("llama"), SMALL)
    folder = _saved_cache(tmp_path, model)
    first = _tensors_file(folder)
    cache = LoLACache(model)
    with torch.no_grad():
        model(torch.randint(0, 101, (1, 45)), cache=cache)
    real_replace = os.replace
    calls = []

    def crash_on_replace(n):
        def replace(src, dst):
            calls.append(dst)
            if len(calls) == n:
                raise KeyboardInterrupt("killed")
            real_replace(src, dst)

        return replace

    for n, expected in ((1, 30), (2, 45), (3, 45)):  # the journal, the tensors, cache.json
        calls.clear()
        monkeypatch.setattr(lola.io.outputs.os, "replace", crash_on_replace(n))
        with pytest.raises(KeyboardInterrupt):
            cache.save(folder)
        monkeypatch.setattr(lola.io.outputs.os, "replace", real_replace)
        assert LoLACache.load(folder, model).layers[0].cumulative_length == expected  # one whole cache
        assert not list(folder.glob(".lola-tmp-*"))
        if expected == 45:  # back to the first cache for the next kill
            shutil.rmtree(folder)
            folder = _saved_cache(tmp_path, model)
            first = _tensors_file(folder)
    cache.save(folder)
    assert LoLACache.load(folder, model).layers[0].cumulative_length == 45
    assert not first.exists() and len(list(folder.glob("cache-*.safetensors"))) == 1  # the superseded tensors are gone


def test_save_refuses_foreign_files_and_links(tmp_path):
    model = apply_lola(tiny("llama"), SMALL)
    cache = LoLACache(model)
    with torch.no_grad():
        model(torch.randint(0, 101, (1, 20)), cache=cache)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "cache.json").write_text('{"format": "someone-else"}')
    with pytest.raises(ValueError, match=r"cache.json exists and was not written by LoLACache.save"):
        cache.save(foreign)
    assert (foreign / "cache.json").read_text() == '{"format": "someone-else"}'
    linked = tmp_path / "linked"
    linked.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (linked / "cache.json").symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        cache.save(linked)
    assert target.read_text() == "keep me"


def test_a_cache_saved_by_the_earlier_layout_still_loads(tmp_path):
    """Caches written as ``cache.safetensors`` (before the tensors were named by their content)."""
    from lola.integrations.transformers.cache import _meta_checksum

    model = apply_lola(tiny("llama"), SMALL)
    folder = _saved_cache(tmp_path, model)
    _tensors_file(folder).rename(folder / "cache.safetensors")
    meta = json.loads((folder / "cache.json").read_text())
    del meta["tensors"]
    meta["checksum"] = _meta_checksum(meta)
    (folder / "cache.json").write_text(json.dumps(meta))
    (folder / ".lola-files.json").unlink()  # that lola kept no record of what it wrote
    assert LoLACache.load(folder, model).layers[0].cumulative_length == 30
    LoLACache.load(folder, model).save(folder)  # saving over it moves to the new layout
    assert not (folder / "cache.safetensors").exists()
    assert LoLACache.load(folder, model).layers[0].cumulative_length == 30


@pytest.mark.parametrize("name", ["../cache-0123456789abcdef.safetensors", "/etc/passwd", "cache.json", 5])
def test_a_description_cannot_point_elsewhere(tmp_path, name):
    from lola.integrations.transformers.cache import _meta_checksum

    model = apply_lola(tiny("llama"), SMALL)
    folder = _saved_cache(tmp_path, model)
    meta = json.loads((folder / "cache.json").read_text())
    meta["tensors"] = name
    meta["checksum"] = _meta_checksum(meta)
    (folder / "cache.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="tensors must be a file name"):
        LoLACache.load(folder, model)
