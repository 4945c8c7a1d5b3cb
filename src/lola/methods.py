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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, StrictInt

from lola.config import LoLAConfig
from lola.errors import option_name
from lola.limits import MAX_TOKENS

__all__ = [
    "NIAH_SCOPES",
    "NOT_FULL",
    "OptionScope",
    "PERPLEXITY_SCOPES",
    "check_lola_options",
    "check_options",
    "ExactDistanceOption",
    "METHODS",
    "POSITION_OPTIONS",
    "PositionsOption",
    "StateKeyPositionsOption",
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
    prefill_chunk: int | None = None,
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
        prefill_chunk: tokens between steps within a call of many tokens (``schedule_kwargs``
            of :class:`lola.schedules.Chunkwise`); ``None`` or ``chunk``: every ``chunk``.
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
    # (a prefill chunk equal to the chunk is the plain schedule: the config says nothing of it)
    steps = {"schedule_kwargs": {"prefill_chunk": prefill_chunk}} if prefill_chunk is not None and prefill_chunk != chunk else {}
    common: dict[str, Any] = {"sinks": sinks, "chunk": chunk, **steps}
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
    Field(description="the lola method's cap on the linear state's share of each output (none: the feature maps' read default, else no cap; 1: no cap)"),
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
StateKeyPositionsOption = Annotated[
    Literal["clamped", "spread"] | None,
    Field(
        description="with bounded positions, where a folded key past the feature maps' trained positions enters them: clamped (at the "
        "last trained position, as the queries past it) or spread (its distances from the query spread over the trained range); none: the feature maps' read default, else clamped"
    ),
]
PrefillChunkOption = Annotated[
    Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None,
    Field(
        description="tokens between steps within a prefill (a multiple of --chunk; decoding still steps every chunk, and the cache "
        "between calls holds the window of one chunk); none: every chunk"
    ),
]
POSITION_OPTIONS = ("positions", "exact_distance", "state_positions", "state_key_positions")
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


NOT_FULL = ("window", "hybrid", "lola")
"""Every method with a LoLA config: full attention is the stock model's."""


@dataclass(frozen=True)
class OptionScope:
    """Where an option of a run acts, so that one that would do nothing is refused.

    Attributes:
        methods: the methods it sets (empty: the run as a whole).
        idle: given the run, why the option does nothing although a method it sets runs
            (``None``: it acts).
        neutral: values that ask for nothing (``--feature-maps none``): accepted with any methods.
    """

    methods: tuple[str, ...] = ()
    idle: Callable[[Any], str | None] | None = None
    neutral: tuple[Any, ...] = ()


def _methods_text(methods: tuple[str, ...]) -> str:
    if tuple(methods) == NOT_FULL:
        return "every method but full"
    if len(methods) == 1:
        return f"the {methods[0]} method"
    return "the " + " and ".join(methods) + " methods"


FOLDED_POLICIES = ("learned",)
"""Policies ``fold_repeats`` wraps: those whose score is a function of the token's own key and
value, so every copy of a repeated token scores alike. SRE reads each candidate against the
linear state, which already recalls a folded copy well (its error is low): folding repeats
under it tied at 2K and 4K and lost at 8K (docs/results.md, "What the misses at 8K are")."""


def _fold_repeats_idle(run: Any) -> str | None:
    if not any(p in FOLDED_POLICIES for p in run.policies):
        return f"repeats are folded under the {', '.join(FOLDED_POLICIES)} policy only, and --policies is {list(run.policies)}"
    return None


def _fold_copies_idle(run: Any) -> str | None:
    if not run.fold_repeats:
        return "it counts the copies that fold a repeat, and repeats are not folded (--fold-repeats is 0)"
    return _fold_repeats_idle(run)


_LOLA = ("lola",)
NIAH_SCOPES: dict[str, OptionScope] = {
    **dict.fromkeys(("policies", "linear_decay", "linear_share_cap", "linear_share_cap_from"), OptionScope(_LOLA)),
    "fold_repeats": OptionScope(_LOLA, _fold_repeats_idle),
    "fold_copies": OptionScope(_LOLA, _fold_copies_idle),
    "budgets": OptionScope(_LOLA, neutral=("auto",)),
    # the window and hybrid methods keep window + sparse_size tokens in their window
    **dict.fromkeys(("window", "sparse_size", "sinks", "chunk", "prefill_chunk", "gqa_storage", *POSITION_OPTIONS), OptionScope(NOT_FULL)),
    "feature_maps": OptionScope(NOT_FULL, neutral=("none", "auto", None)),
    "mixing": OptionScope(("hybrid", "lola")),  # the window method reads its exact tokens alone
}
"""``lola niah``'s and ``lola probe``'s options (:class:`~lola.eval.runner.NiahRun` fields) that set some methods only."""

PERPLEXITY_SCOPES: dict[str, OptionScope] = {
    # the hybrid keeps its window alone here (hybrid_window="window"): the sparse cache is lola's
    **dict.fromkeys(("policy", "linear_decay", "linear_share_cap", "linear_share_cap_from", "sparse_size"), OptionScope(_LOLA)),
    "budgets": OptionScope(_LOLA, neutral=("uniform",)),
    **dict.fromkeys(("window", "sinks", "chunk", "prefill_chunk", "mixing", *POSITION_OPTIONS), OptionScope(("hybrid", "lola"))),
    "feature_maps": OptionScope(("hybrid", "lola"), neutral=("none", None)),
    "generate_windows": OptionScope(idle=lambda run: None if run.generate else "it sets the windows continued for the repetition check, and --generate is 0"),
}
"""``lola perplexity``'s options (:class:`~lola.eval.perplexity.PerplexityRun` fields) that set some methods only."""


def check_options(given: Mapping[str, Any], run: Any, scopes: Mapping[str, OptionScope], name: Callable[[str], str] = option_name) -> None:
    """Refuse options ``given`` for ``run`` that would do nothing: one that sets none of the
    methods the run evaluates, or whose :attr:`OptionScope.idle` says why it does nothing there.

    Args:
        given: the options the user gave (command line or config file), by field name.
        run: the run they built (its ``methods`` and settings).
        scopes: where each option acts (:data:`NIAH_SCOPES`, :data:`PERPLEXITY_SCOPES`).
        name: how a field is named to the user (default: its option).

    Raises:
        ValueError: one line naming the options and the methods they set (or why they are idle).
    """
    methods = list(run.methods)
    unused: dict[tuple[str, ...], list[str]] = {}
    for field, scope in scopes.items():
        value = given.get(field)
        if value is None or value in scope.neutral:
            continue
        if scope.methods and not set(scope.methods) & set(methods):
            unused.setdefault(scope.methods, []).append(name(field))
        elif scope.idle is not None and (why := scope.idle(run)) is not None:
            raise ValueError(f"{name(field)} would do nothing: {why}; drop it")
    for sets, found in unused.items():
        one = len(found) == 1
        add = sets[0] if len(sets) == 1 else "one of " + ", ".join(sets)
        raise ValueError(
            f"{', '.join(found)} {'sets' if one else 'set'} {_methods_text(sets)}, {'which is not' if len(sets) == 1 else 'none of which is'} "
            f"among the methods {methods}: add {add} to --methods or drop {'it' if one else 'them'}"
        )


def check_lola_options(given: Mapping[str, Any], methods: list[str] | tuple[str, ...]) -> None:
    """Refuse options of the lola method given for a run without it (:func:`check_options` with
    the lola method's options of :data:`NIAH_SCOPES` alone)."""
    from types import SimpleNamespace

    lola_only = {f: OptionScope(_LOLA) for f, s in NIAH_SCOPES.items() if s.methods == _LOLA and f != "budgets"}
    check_options(given, SimpleNamespace(methods=list(methods)), lola_only)
