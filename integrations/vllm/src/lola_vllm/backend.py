"""vLLM attention backend of the LoLA layers: per-step metadata (which requests decode, where each
prefill starts, how many tokens each has seen, its state slot)."""

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport, AttentionMetadataBuilder, CommonAttentionMetadata
from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor, split_decodes_and_prefills


@dataclass
class LoLAMetadata:
    num_decodes: int  # requests [0, num_decodes) have one token each (decodes come first)
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    query_start_loc_cpu: torch.Tensor  # [num_reqs + 1]
    num_computed_cpu: torch.Tensor  # [num_reqs] tokens each request has already seen (0 = new)
    state_indices: torch.Tensor  # [num_reqs] state slot of each request


class LoLAMetadataBuilder(AttentionMetadataBuilder[LoLAMetadata]):
    reorder_batch_threshold: int = 1
    _cudagraph_support = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False) -> LoLAMetadata:
        m = common_attn_metadata
        n = m.num_reqs
        state_indices = mamba_get_block_table_tensor(m.block_table_tensor, m.seq_lens, self.kv_cache_spec, self.vllm_config.cache_config.mamba_cache_mode)[
            :n, 0
        ]
        nd, np_, ndt, npt = split_decodes_and_prefills(m, decode_threshold=1)
        qsl = m.query_start_loc_cpu[: n + 1]
        seq_lens_cpu = m.seq_lens[:n].to("cpu")
        return LoLAMetadata(nd, np_, ndt, npt, qsl, seq_lens_cpu - (qsl[1:] - qsl[:-1]), state_indices.long())


class LoLAAttentionBackend(AttentionBackend):
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]

    @staticmethod
    def get_name() -> str:
        return "LOLA"

    @staticmethod
    def get_builder_cls():
        return LoLAMetadataBuilder

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("LoLA layers compute attention themselves")

    @classmethod
    def is_ssm(cls) -> bool:
        return True
