"""The LoLA attention layer of vLLM's Llama: a constant-state (Mamba-type) layer.

vLLM keeps one page of state per sequence slot and hands the layer one tensor per state
(``self.kv_cache``, ``[slots, ...]``); each step's metadata lists the decode requests first
(one token each) and then the prefills. The pages are the engine's own layout
(:func:`lola.engine.state_pages.page_layout`: the exact slots as one buffer, the linear state), and
the batch's rows are *bound* to them (:meth:`lola.LoLAMemory.bind_pages`): rows whose slots
form one range are views of the pages, written in place; other rows are gathered once and the
engine writes back by index what each call changed (one window slot per decoded row, whole
rows at a select-and-evict step). A slot that starts a new request is cleared first (vLLM does
not clear slots).

The decoding rows stay bound between steps: vLLM keeps a running batch for many steps, so when
the next step decodes the same slots one token further, the layer continues the bound state
instead of binding (gathering) again; the pages are current after every step either way.
"""

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.model_loader.weight_utils import sharded_weight_loader
from vllm.model_executor.models.utils import extract_layer_index
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from lola.core.positions import RotaryEmbedding
from lola.engine.state_pages import clear_rows
from lola.head_share import head_axes
from lola.layer import compose
from lola.pretrained.resolve import resolve_config, resolve_positions

#: What the layers of this process ran (tests read it to see that LoLA, not a fallback, served).
CALLS = {"decode_rows": 0, "prefill_seqs": 0, "prefill_batches": 0, "resets": 0, "page_binds": 0, "live_steps": 0}


class LoLALlamaAttention(nn.Module, MambaBase):
    """Drop-in for vLLM's ``LlamaAttention`` (same constructor keywords); the LoLA config comes
    from ``config.lola`` (per-layer overrides applied). Under tensor parallelism each rank
    computes its share of the heads (:func:`lola.compose` with ``heads=``): its query and K/V
    heads of ``qkv_proj``, their LoLA parameters (sliced from the checkpoint's along each
    parameter's head axis) and state pages; ``o_proj`` sums the ranks' outputs."""

    def __init__(
        self,
        config,
        hidden_size,
        num_heads,
        num_kv_heads,
        max_position_embeddings=8192,
        quant_config=None,
        bias=False,
        bias_o_proj=False,
        cache_config=None,
        prefix="",
        attn_type="decoder",
    ):
        super().__init__()
        vllm_config = get_current_vllm_config()
        self.prefix = prefix
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
        tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        # this rank's heads (LoLAModelConfig refuses sizes that do not split in whole groups)
        self.num_heads, self.num_kv_heads = num_heads // tp, num_kv_heads // tp
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, num_heads, num_kv_heads, bias=bias, quant_config=quant_config, prefix=f"{prefix}.qkv_proj"
        )
        self.o_proj = RowParallelLinear(num_heads * self.head_dim, hidden_size, bias=bias_o_proj, quant_config=quant_config, prefix=f"{prefix}.o_proj")
        layer = extract_layer_index(prefix)
        cfg = resolve_config(getattr(config, "lola", None)).for_layer(layer)  # lola's defaults, decided where lola decides them
        # Bounded positions read every stream with positions the model was trained on, so the
        # rotation itself must reach max_model_len (past the model's context; LoLAModelConfig
        # refuses that for absolute positions).
        reach = max(max_position_embeddings, vllm_config.model_config.max_model_len) if cfg.positions == "bounded" else max_position_embeddings
        self.rotary_emb = get_rope(self.head_dim, max_position=reach, rope_parameters=getattr(config, "rope_parameters", None), is_neox_style=True)
        rotary = None
        if cfg.positions == "bounded":
            cfg = resolve_positions(cfg, max_position_embeddings)  # limits a config leaves unset: from the model's context
            rotary = rotation_of(self.rotary_emb, self.head_dim, reach)
        share = (rank * self.num_heads, (rank + 1) * self.num_heads) if tp > 1 else None
        self.lola = compose(cfg, num_heads, self.head_dim, num_kv_heads, layer=layer, heads=share, rotary=rotary)
        if tp > 1:  # a checkpoint holds every head's LoLA parameters: each rank loads its slice
            for name, axis in head_axes(self.lola).items():
                set_weight_attrs(self.lola.get_parameter(name), {"weight_loader": sharded_weight_loader(axis)})
        dtype = vllm_config.model_config.dtype
        t = self.lola.new_state()
        layout = t.page_layout(self.num_heads, self.lola.storage_heads(t), self.head_dim, self.lola.feature_dim, dtype)
        # widest dtypes first: every state's byte offset in the page stays aligned for .view(dtype)
        self._keys = sorted(layout, key=lambda k: -torch.empty((), dtype=layout[k][1]).element_size())
        self._shapes = tuple(layout[k][0] for k in self._keys)
        self._dtypes = tuple(layout[k][1] for k in self._keys)
        self._live = None  # (slots, their counts at the next step, the LoLAMemory bound to those rows)
        ctx = vllm_config.compilation_config.static_forward_context
        if prefix in ctx:
            raise ValueError(f"Duplicate layer name: {prefix}")
        ctx[prefix] = self

    # -- MambaBase contract ---------------------------------------------------------------------
    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.CUSTOM

    def get_state_shape(self):
        return self._shapes

    def get_state_dtype(self):
        return self._dtypes

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        out = torch.empty_like(q)
        torch.ops.vllm.lola_attention(q.contiguous(), k.contiguous(), v.contiguous(), out, self.prefix)
        o, _ = self.o_proj(out)
        return o

    def _bind(self, slots: torch.Tensor, seen: torch.Tensor):
        """A state bound to the pages of ``slots``; those starting a request (``seen == 0``) are
        cleared first."""
        pages = dict(zip(self._keys, self.kv_cache))
        new = seen == 0
        if bool(new.any()):
            CALLS["resets"] += int(new.sum())
            clear_rows(pages, slots[new])
        CALLS["page_binds"] += 1
        mem = self.lola.new_state()
        # The pages are this layer's own, cleared above for every new request: their content is
        # not checked again at every step (a read back per layer and step).
        mem.bind_pages(pages, slots, seen=seen.to(torch.long), check=False)
        return mem

    def _forward(self, q, k, v, out) -> None:
        md = get_forward_context().attn_metadata
        if isinstance(md, dict):
            md = md.get(self.prefix)
        if md is None:  # profiling / dummy run
            out.zero_()
            return
        H, Hk, D = self.num_heads, self.num_kv_heads, self.head_dim
        nd, ndt = md.num_decodes, md.num_decode_tokens
        qsl, seen, slots = md.query_start_loc_cpu, md.num_computed_cpu, md.state_indices
        if nd:
            CALLS["decode_rows"] += nd
            rows, counts = slots[:nd], seen[:nd]
            mem = self._decode_state(rows, counts)
            o, mem = self.lola(q[:ndt].view(nd, 1, H, D), k[:ndt].view(nd, 1, Hk, D), v[:ndt].view(nd, 1, Hk, D), state=mem)
            out[:ndt] = o.reshape(ndt, H * D)  # the pages are current: the engine wrote them
            self._live = (rows.clone(), counts + 1, mem)
        if md.num_prefills:
            prefilling = slots[nd : nd + md.num_prefills]
            if self._live is not None and bool(torch.isin(prefilling, self._live[0]).any()):
                self._release_live()  # a live slot was given to a new request
            self._prefill(q, k, v, out, qsl[nd : nd + md.num_prefills + 1], seen[nd:], slots[nd:])

    def _decode_state(self, slots: torch.Tensor, seen: torch.Tensor):
        """The state of the decoding rows: the bound one when the same slots decode again one
        token further (its pages hold the same), else bound to their pages anew."""
        live = self._live
        if live is not None and torch.equal(live[0], slots) and torch.equal(live[1], seen):
            CALLS["live_steps"] += 1
            return live[2]
        self._release_live()  # its pages are current; their rows may be bound anew now
        return self._bind(slots, seen)

    def _release_live(self) -> None:
        """Give up the state kept bound between steps (a page has one owner at a time)."""
        if self._live is not None:
            self._live[2].release_pages()
            self._live = None

    def _prefill(self, q, k, v, out, bounds, seen, slots) -> None:
        """The prefilling sequences, those of one length at one position in one call each: their
        blocks then fall together, known on the host, with no padding (a padded batch of
        unequal sequences reads each block's length back from the device and gathers its
        tokens; the engine's chunked prefill mostly mixes the tail of one prompt with the head
        of the next)."""
        H, Hk, D = self.num_heads, self.num_kv_heads, self.head_dim
        spans = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        counts = seen[: len(spans)].tolist()
        groups: dict[tuple[int, int], list[int]] = {}
        for row, ((s, e), n) in enumerate(zip(spans, counts)):
            groups.setdefault((e - s, n), []).append(row)
        CALLS["prefill_seqs"] += len(spans)
        for (length, _), rows in groups.items():
            CALLS["prefill_batches"] += 1
            take = lambda x, heads: torch.stack([x[spans[r][0] : spans[r][1]].view(length, heads, D) for r in rows])  # noqa: E731
            index = torch.tensor(rows, device=slots.device)
            mem = self._bind(slots.index_select(0, index), seen.index_select(0, index))
            o, mem = self.lola(take(q, H), take(k, Hk), take(v, Hk), state=mem)
            mem.release_pages()  # the pages hold its state; the next step binds them anew
            for i, r in enumerate(rows):
                out[spans[r][0] : spans[r][1]] = o[i].reshape(length, H * D)


def rotation_of(rotary_emb: nn.Module, head_dim: int, reach: int) -> RotaryEmbedding:
    """lola's :class:`~lola.core.positions.RotaryEmbedding` of vLLM's rotary module: its
    frequencies (scaling applied), checked against vLLM's own rotation: moving a vector vLLM
    rotated at ``n`` by ``Δ`` must equal vLLM's rotation at ``n + Δ``.

    Raises:
        ValueError: a rotary module whose frequencies cannot be read, or whose rotation a delta
            does not reproduce (frequencies that change with the length, another layout).
    """
    compute, base = getattr(rotary_emb, "_compute_inv_freq", None), getattr(rotary_emb, "base", None)
    name = type(rotary_emb).__name__
    if compute is None or base is None or not getattr(rotary_emb, "is_neox_style", False):
        raise ValueError(f"bounded positions need a rotate-half rotary embedding of fixed frequencies; vLLM's {name} is not one")
    rotary = RotaryEmbedding(compute(base).float())
    x = torch.randn(2, head_dim, generator=torch.Generator().manual_seed(0))
    n, delta = 5, reach - 8
    with torch.no_grad():
        at_n, _ = rotary_emb.forward_native(torch.tensor([n, n + 1]), x.clone(), x.clone())
        at_m, _ = rotary_emb.forward_native(torch.tensor([n + delta, n + 1 + delta]), x.clone(), x.clone())
    moved = rotary.rotate(at_n.float(), torch.full((2,), delta))
    err = float((moved - at_m.float()).norm() / at_m.float().norm().clamp_min(1e-30))
    if not err < 1e-3:
        raise ValueError(f"rotating by a position delta does not reproduce vLLM's {name} (relative error {err:.2g}): bounded positions are refused")
    return rotary


def served_heads(model: nn.Module) -> list[tuple[int, int, tuple]]:
    """What this rank's LoLA layers serve: per layer, its query heads, its K/V heads and its
    state pages' shapes (``llm.apply_model(served_heads)`` gives one list per rank)."""
    return [(m.num_heads, m.num_kv_heads, m.get_state_shape()) for m in model.modules() if isinstance(m, LoLALlamaAttention)]


def lola_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    self = get_forward_context().no_compile_layers[layer_name]
    self._forward(q, k, v, output)


def lola_attention_fake(q, k, v, output, layer_name) -> None:
    return None


direct_register_custom_op(op_name="lola_attention", op_func=lola_attention, mutates_args=["output"], fake_impl=lola_attention_fake)
