"""The attention methods the evaluations compare, and the one place a method's name becomes a config.

``lola niah`` (:func:`lola.eval.runner.method_configs`), ``lola perplexity``
(:func:`lola.eval.perplexity.perplexity_configs`) and ``lola demo`` (:func:`lola.eval.demo.run_demo`)
all build their configurations with :func:`method_config`:

- ``full``: stock attention and a growing cache (no LoLA config: ``None``).
- ``window``: sinks + a sliding window, softmax only.
- ``hybrid``: sinks + a sliding window + the linear state (LoLCATs' hybrid; ``lolcats``, its old
  name here, still works with a warning).
- ``lola``: sinks + window + sparse cache + linear state, with a scoring policy.

The window-only methods get the whole exact budget ``window + sparse_size`` as their window (the
same exact tokens as ``lola``), or, with ``hybrid_window="window"``, the window alone (the hybrid as
it was trained).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, StrictInt

from lola.config import LoLAConfig
from lola.limits import MAX_TOKENS

__all__ = [
    "ExactDistanceOption",
    "METHODS",
    "POSITION_OPTIONS",
    "PositionsOption",
    "StatePositionsOption",
    "holds_length",
    "position_options",
    "RENAMED_METHODS",
    "LinearDecayOption",
    "LinearShareCapFromOption",
    "LinearShareCapOption",
    "linear_state_options",
    "method_config",
    "method_name",
]

METHODS = ("full", "window", "hybrid", "lola")
"""Every method name, in the order the evaluations run and report them."""

RENAMED_METHODS = {"lolcats": "hybrid"}
"""Old method names → today's (``lolcats`` was also the name of a mixing rule)."""


def method_name(name: str, warn: bool = True) -> str:
    """Today's name of method ``name``: an old name (:data:`RENAMED_METHODS`) with a
    :class:`FutureWarning` (a user's option: shown by default), any other name as it is.

    Args:
        warn: ``False`` for names read back from files an older version wrote (results, records).
    """
    new = RENAMED_METHODS.get(name)
    if new is None:
        return name
    if warn:
        warnings.warn(f"the method {name!r} is now called {new!r}", FutureWarning, stacklevel=3)
    return new


def method_config(
    method: str,
    *,
    window: int,
    sparse_size: int,
    sinks: int,
    chunk: int,
    policy: str | None = None,
    mixing: str | None = None,
    trained_maps: bool = False,
    hybrid_window: Literal["budget", "window"] = "budget",
    overrides: Mapping[str, Any] | None = None,
) -> LoLAConfig | None:
    """The :class:`~lola.LoLAConfig` of ``method`` (``None`` for ``full``: stock attention).

    Args:
        method: one of :data:`METHODS`.
        window: the ``lola`` method's sliding window.
        sparse_size: the ``lola`` method's sparse cache.
        sinks: pinned first tokens (every method but ``full``).
        chunk: tokens between select-and-evict steps (every method but ``full``).
        policy: the ``lola`` method's scoring policy (``None``: left unset, i.e. ``"sre"``).
        mixing: the mixing rule of ``lola``. ``None``: ``softmax_only``, or with ``trained_maps``
            left unset for :func:`lola.pretrained.resolve.resolve_mixing` to decide when the maps are loaded
            (the paper's ``lola_authors``). ``hybrid`` mixes the same way, except that
            ``softmax_only`` (which would ignore the linear state) becomes ``lola_authors``; with
            ``trained_maps`` its rule is always left unset (the rule the maps were trained with).
            ``window`` is ``softmax_only``.
        trained_maps: trained feature maps will be loaded into the config
            (``apply_lola(..., feature_maps=...)``).
        hybrid_window: ``"budget"``: ``window`` and ``hybrid`` keep ``window + sparse_size``
            tokens in their window; ``"window"``: ``window`` tokens.
        overrides: further :class:`~lola.LoLAConfig` fields, set last (e.g. ``gqa_storage``, or
            a variant's settings).

    Raises:
        ValueError: an unknown method (or, as :class:`pydantic.ValidationError`, a bad field).
    """
    method = method_name(method)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; available: {', '.join(METHODS)}")
    if hybrid_window not in ("budget", "window"):
        raise ValueError(f"hybrid_window must be 'budget' or 'window', got {hybrid_window!r}")
    if method == "full":
        return None
    if trained_maps:
        lola_mixing = {"mixing": mixing} if mixing else {}
        hybrid_mixing: dict[str, Any] = {}
    else:
        lola_mixing = {"mixing": mixing or "softmax_only"}
        hybrid_mixing = {"mixing": "lola_authors" if lola_mixing["mixing"] == "softmax_only" else lola_mixing["mixing"]}
    common: dict[str, Any] = {"sinks": sinks, "chunk": chunk}
    wide = window + sparse_size if hybrid_window == "budget" else window
    if method == "window":
        fields = {"window": wide, "sparse_size": 0, "mixing": "softmax_only", **common}
    elif method == "hybrid":
        fields = {"window": wide, "sparse_size": 0, **hybrid_mixing, **common}
    else:
        fields = {"window": window, "sparse_size": sparse_size, **({"policy": policy} if policy is not None else {}), **lola_mixing, **common}
    return LoLAConfig(**{**fields, **(overrides or {})})


# The lola method's linear-state options of an evaluation run (``lola niah``, ``lola perplexity``):
# ``None`` leaves the LoLAConfig's own value.
LinearDecayOption = Annotated[
    Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)] | None,
    Field(description="the lola method's linear-state decay per token (1: none, the paper's state; 0.5 ** (1 / n): a half-life of n tokens)"),
]
LinearShareCapOption = Annotated[
    Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)] | None,
    Field(description="the lola method's cap on the linear state's share of each output (none: no cap)"),
]
LinearShareCapFromOption = Annotated[
    Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)] | None,
    Field(
        description="the share cap applies to queries at positions >= this (none or 0: every query; the length the feature maps were trained at leaves the reads inside it untouched)"
    ),
]
PositionsOption = Annotated[
    Literal["absolute", "bounded"] | None,
    Field(
        description="positions of every method but full: absolute (as the model rotated them) or bounded (re-assigned within the trained range, "
        "so a stream may run past the model's context); none: the config's own (absolute)"
    ),
]
ExactDistanceOption = Annotated[
    Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None,
    Field(description="with bounded positions, the largest distance an exact read sees (none: the model's context less one chunk)"),
]
StatePositionsOption = Annotated[
    Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None,
    Field(description="with bounded positions, the feature maps see positions below this (none: the maps' trained length, else the model's context)"),
]
POSITION_OPTIONS = ("positions", "exact_distance", "state_positions")
"""The names a run gives the position options (the :class:`~lola.LoLAConfig` fields they set)."""


def position_options(run: Any) -> dict[str, Any]:
    """The position options ``run`` sets (those not ``None``), as ``LoLAConfig`` overrides of
    every method but ``full``."""
    return {k: v for k in POSITION_OPTIONS if (v := getattr(run, k)) is not None}


def holds_length(config: LoLAConfig | None, length: int, model_positions: int | None) -> bool:
    """Whether a method of ``config`` (``None``: full attention) may read a stream of ``length``
    tokens on a model of ``model_positions`` positions: always with bounded positions, else
    within the model's context."""
    if config is not None and config.positions == "bounded" and not config.full_attention_layers:
        return True
    return not (type(model_positions) is int and model_positions > 0 and length > model_positions)


LINEAR_STATE_OPTIONS = ("linear_decay", "linear_share_cap", "linear_share_cap_from")
"""The names a run gives those options (the :class:`~lola.LoLAConfig` fields they set)."""


def linear_state_options(run: Any) -> dict[str, Any]:
    """The linear-state options ``run`` sets (those not ``None``), as ``LoLAConfig`` overrides
    of the ``lola`` method."""
    return {k: v for k in LINEAR_STATE_OPTIONS if (v := getattr(run, k)) is not None}


LOLA_ONLY_OPTIONS = ("policies", "linear_decay", "linear_share_cap", "linear_share_cap_from", "fold_repeats", "fold_copies")
"""Options of an evaluation run that set the lola method alone (the other methods have no
sparse cache to score, and full attention and the window no linear state)."""


def check_lola_options(given: Mapping[str, Any], methods: list[str] | tuple[str, ...]) -> None:
    """Refuse options of the lola method given for a run without it: they would do nothing.

    Args:
        given: the options the user gave (command line or config file), by field name.
        methods: the methods the run evaluates.

    Raises:
        ValueError: naming the options and the methods.
    """
    found = ["--" + field.replace("_", "-") for field in LOLA_ONLY_OPTIONS if given.get(field) is not None]
    if found and "lola" not in methods:
        raise ValueError(
            f"{', '.join(found)} {'sets' if len(found) == 1 else 'set'} the lola method, which is not among the methods {list(methods)}: "
            f"add lola to --methods or drop {'it' if len(found) == 1 else 'them'}"
        )
