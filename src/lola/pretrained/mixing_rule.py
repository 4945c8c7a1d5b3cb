"""The mixing rule a config runs with on trained feature maps, when it leaves ``mixing`` unset.

The decision itself (:mod:`lola.pretrained.resolve` explains it and puts it together with the
budgets and the maps); a module of its own so that reading a feature-map folder
(:mod:`lola.pretrained.folder`) and resolving a run's config need not import each other.
"""

from __future__ import annotations

from lola.config import LoLAConfig

__all__ = ["PAPER_MIXING", "default_mixing", "has_sparse_cache", "resolve_mixing"]

PAPER_MIXING = "lola_authors"
"""The LoLA paper's rule: how LoLA reads a hybrid trained with another rule."""


def has_sparse_cache(config: LoLAConfig) -> bool:
    """Whether ``config`` keeps a sparse cache: in its base sizes (the layers it does not override)
    or in a layer override (per-head sizes replace ``sparse_size``, as in the layers)."""

    def keeps(cfg: LoLAConfig) -> bool:
        return any(x > 0 for x in cfg.sparse_size_per_head) if cfg.sparse_size_per_head is not None else cfg.sparse_size > 0

    return keeps(config) or any(keeps(config.for_layer(i)) for i in config.layer_overrides)


def default_mixing(config: LoLAConfig, trained_mixing: str | None) -> str:
    """The rule ``config`` runs with when it leaves ``mixing`` unset.

    Args:
        config: the config (its own ``mixing`` is not read).
        trained_mixing: the rule the loaded feature maps were trained with, or ``None`` (no
            trained maps).
    """
    if trained_mixing is None:
        return LoLAConfig.model_fields["mixing"].default
    return PAPER_MIXING if has_sparse_cache(config) else trained_mixing


def resolve_mixing(config: LoLAConfig, trained_mixing: str | None) -> LoLAConfig:
    """``config`` with its mixing rule decided by :func:`default_mixing` when the caller left it
    unset (a rule set explicitly is kept)."""
    if "mixing" in config.model_fields_set:
        return config
    return config.model_copy(update={"mixing": default_mixing(config, trained_mixing)})
