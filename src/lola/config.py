"""LoLAConfig: every option of a LoLA layer, validated and serialisable (pydantic)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, StrictBool, ValidationError, ValidationInfo, field_validator, model_validator

from lola.core.mixing import MIXING_NAMES
from lola.errors import short_repr
from lola.feature_maps.registry import DEFAULT_FEATURE_MAP, FEATURE_MAPS
from lola.limits import MAX_FEATURE_DIM, MAX_HEADS, MAX_SCALE, MAX_TOKENS

__all__ = ["LoLAConfig", "MAX_FEATURE_DIM", "MAX_HEADS", "MAX_TOKENS"]

_MODEL_LEVEL_FIELDS = {"layer_overrides", "full_attention_layers"}
# Fields every layer of a model shares (carried to each layer's config, never overridden per layer):
# the positions a model may be fed depend on all of its layers bounding them alike.
_SHARED_FIELDS = {"positions", "exact_distance", "state_positions", "state_key_positions"}


def _layer_index(value: Any) -> Any:
    """A layer index: an int (never a bool), or its decimal string (JSON object keys)."""
    if isinstance(value, bool):
        raise ValueError(f"layer indices must be ints, got {value!r} (bool)")
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


# Strict: a bool, float or string is refused where an int is expected (``window=True`` is not 1).
Tokens = Annotated[int, Strict(), Field(ge=0, le=MAX_TOKENS)]
LayerIndex = Annotated[int, BeforeValidator(_layer_index), Strict()]
FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class LoLAConfig(BaseModel):
    """Configuration of a LoLA attention layer.

    The exact-token budget of a layer is ``sinks + window + sparse_size`` (plus up to
    ``chunk − 1`` buffered tokens between select-and-evict steps); everything else lives in the
    constant-size linear state. Invalid values raise :class:`pydantic.ValidationError` naming
    the field: integer fields are strict (``window=True`` or ``window=64.0`` is refused, not
    read as 1 or 64), token counts lie in ``[0, MAX_TOKENS]``, floats must be finite, and
    ``policy_kwargs`` must be accepted by the policy. ``LoLAConfig.model_validate_json(
    cfg.model_dump_json()) == cfg``.

    Attributes:
        window: ``η``, the newest tokens kept exact (each query sees at least its ``η`` newest
            tokens, itself included).
        sparse_size: ``λ``, tokens kept exact by the scoring policy.
        sinks: first real tokens of each row pinned exact (not in the paper; cheap and helpful
            for training-free use).
        chunk: ``C``, tokens between select-and-evict steps with ``schedule="chunkwise"``.
        schedule: a registered :mod:`lola.schedules` name: ``"chunkwise"`` (every ``chunk``
            tokens, the default), ``"tokenwise"`` (every token), or one registered with
            :func:`lola.schedules.register` or the ``lola.schedules`` entry-point group.
        schedule_kwargs: keyword arguments for the schedule's factory (besides ``chunk``).
        policy: name of a registered scoring policy (``"sre"``, ``"attention"``, ``"recency"``,
            ``"random"``, ``"key_norm"`` or a plug-in's name).
        policy_kwargs: keyword arguments for the policy (e.g. ``{"seed": 1}`` for ``random``).
        mixing: ``"softmax_only"`` (default: the output reads the exact tokens alone and the
            linear state only informs the scoring policy, which keeps an untrained model's text
            intact), ``"lola_authors"`` (the LoLA authors' rule) or ``"lolcats"`` (what
            LoLCATs checkpoints were trained with). With untrained feature maps the two rules
            that add the linear state change the model's output (it loops on prose: docs/results.md,
            "Pass-key retrieval, training-free");
            :func:`~lola.integrations.transformers.apply_lola` with trained maps uses the rule
            they were trained with unless one is set here (see :mod:`lola.core.mixing`).
        affine: with ``lolcats`` mixing, weight the linear term by ``1 − w`` instead of ``1``.
        linear_decay: ``γ ∈ (0, 1]``, the linear state's decay per token (``1``: none, the
            paper's state; a half-life of ``n`` tokens is ``γ = 0.5 ** (1 / n)``): tokens are
            folded with weight ``γ^{age}`` and the state shrinks by ``γ^P`` at each step
            (:class:`~lola.memory.LinearState`), so far tokens fade instead of piling up.
        linear_share_cap: at most this share of each output comes from the linear state
            (``None``: no cap; :func:`lola.core.mix`); a decoded token is capped in the fused decode step.
        linear_share_cap_from: the cap applies to queries at positions ``>=`` this (``0``:
            every query). Trained feature maps read positions they were not trained at
            differently (their kernel grows with absolute position: docs/results.md, "The cap from
            the trained length: the shipped default"): set it
            to the length the maps were trained at to leave every read inside it untouched.
        positions: ``"absolute"`` (default: every read sees the positions the model rotated
            its keys and queries at) or ``"bounded"``: the layer assigns the positions of each
            read (:mod:`lola.core.positions`), so that a stream of any length reads with
            distances and positions the model was trained on: exact keys farther than
            ``exact_distance`` from a block's first query are re-rotated to that distance, and
            queries and keys enter the feature maps at positions below ``state_positions``.
            Needs the model's rotary embedding (:func:`~lola.integrations.transformers.apply_lola`
            takes it from the model; :func:`lola.compose` takes ``rotary=``). A stream shorter
            than both limits reads exactly as under ``"absolute"``. Streams past the model's
            ``max_position_embeddings`` are accepted only with ``"bounded"``.
        exact_distance: with ``positions="bounded"``, the largest distance an exact read sees
            (plus up to ``chunk − 1``); ``None``: the length trained maps were trained at, else
            the model's ``max_position_embeddings − chunk``
            (:func:`~lola.pretrained.resolve.resolve_positions`).
        state_positions: with ``positions="bounded"``, the feature maps see positions below
            this; ``None``: the length trained maps were trained at (their folder's
            ``linear_share_cap_from`` read default), else the model's ``max_position_embeddings``.
        state_key_positions: with ``positions="bounded"``, where a key past ``state_positions``
            enters the feature maps when it is folded into the linear state: ``"clamped"``
            (default) at ``state_positions − 1``, where the queries past it are too (distance
            zero); ``"spread"`` at its position modulo ``state_positions − window``, so that the
            state's keys sit at distances from the window to ``state_positions`` from the query,
            as in a stream the maps were trained on (docs/results.md, "Keys spread over the
            trained distances").
        window_factor_init: initial per-head logit of the softmax weight ``w = sigmoid(·)``
            (LoLCATs: ``−2.1972``, i.e. ``w = 0.1``).
        feature_map: a name of :data:`lola.feature_maps.FEATURE_MAPS` (default
            ``"hedgehog_identity"``; ``"hedgehog"`` is meant to be trained).
        feature_dim: Hedgehog's projection size ``f`` (features ``F = 2f``).
        scale: softmax scale; ``None`` means ``1/√D``.
        gqa_storage: with fewer K/V heads than query heads, store exact K/V once per K/V head
            (``"kv_head"``, the query heads of a group share one selection, scored by their
            mean) or once per query head (``"query_head"``: ``H/H_kv`` times the exact-memory
            bytes, an independent selection per query head).
        check_inputs: validate tensors on every call (shapes, dtypes, devices, finiteness).
        window_per_head: one window size per storage head (K/V heads with ``gqa_storage=
            "kv_head"``, query heads otherwise), replacing ``window``.
        sparse_size_per_head: one sparse-cache size per storage head, replacing ``sparse_size``.
        layer_overrides: per-layer changes for whole models, as a mapping ``{layer: {field:
            value}}`` or a list with one mapping per layer (e.g. a larger window in layer 0).
        full_attention_layers: layers left as stock full attention by
            :func:`lola.integrations.transformers.apply_lola`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    window: Tokens = 64
    sparse_size: Tokens = 64
    sinks: Tokens = 4
    chunk: Annotated[int, Strict(), Field(ge=1, le=MAX_TOKENS)] = 64
    schedule: str = "chunkwise"
    schedule_kwargs: dict[str, Any] = Field(default_factory=dict)
    policy: str = "sre"
    policy_kwargs: dict[str, Any] = Field(default_factory=dict)
    mixing: Literal[MIXING_NAMES] = "softmax_only"
    affine: StrictBool = False
    linear_decay: Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    linear_share_cap: Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    linear_share_cap_from: Tokens = 0
    positions: Literal["absolute", "bounded"] = "absolute"
    exact_distance: Annotated[int, Strict(), Field(ge=1, le=MAX_TOKENS)] | None = None
    state_positions: Annotated[int, Strict(), Field(ge=1, le=MAX_TOKENS)] | None = None
    state_key_positions: Literal["clamped", "spread"] = "clamped"
    # sigmoid(window_factor_init) weighs the two terms: beyond +-1e4 it is 0 or 1 anyway.
    window_factor_init: Annotated[float, Strict(), Field(ge=-1e4, le=1e4, allow_inf_nan=False)] = -2.1972
    feature_map: Literal[FEATURE_MAPS] = DEFAULT_FEATURE_MAP
    feature_dim: Annotated[int, Strict(), Field(ge=1, le=MAX_FEATURE_DIM)] = 64
    # Bounded: the default is 1/sqrt(head_dim); a scale of 1e300 overflows every logit to inf.
    scale: Annotated[float, Strict(), Field(gt=0, le=MAX_SCALE, allow_inf_nan=False)] | None = None
    gqa_storage: Literal["kv_head", "query_head"] = "kv_head"
    check_inputs: StrictBool = True
    window_per_head: list[Tokens] | None = Field(None, min_length=1, max_length=MAX_HEADS)
    sparse_size_per_head: list[Tokens] | None = Field(None, min_length=1, max_length=MAX_HEADS)
    layer_overrides: dict[LayerIndex, dict[str, Any]] = Field(default_factory=dict)
    full_attention_layers: list[LayerIndex] = Field(default_factory=list)

    @field_validator("layer_overrides", mode="before")
    @classmethod
    def _overrides_from_list(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            out = {}
            for i, entry in enumerate(value):
                if entry is None:
                    continue
                if not isinstance(entry, Mapping):
                    raise ValueError(f"layer_overrides[{i}] must be a mapping of LoLAConfig fields (or None), got {entry!r} ({type(entry).__name__})")
                if entry:
                    out[i] = dict(entry)
            return out
        if isinstance(value, Mapping):  # "0" and 0 name one layer: refuse both rather than keep one
            seen: dict[Any, Any] = {}
            for key in value:
                index = _layer_index(key)
                if index in seen:
                    raise ValueError(f"layer_overrides names layer {index} twice ({seen[index]!r} and {key!r})")
                seen[index] = key
        return value

    @field_validator("layer_overrides")
    @classmethod
    def _overridable_fields(cls, value: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        allowed = set(cls.model_fields) - _MODEL_LEVEL_FIELDS - _SHARED_FIELDS
        for layer, fields in value.items():
            if layer < 0:
                raise ValueError(f"layer indices must be >= 0, got {layer}")
            unknown = set(fields) - allowed
            if unknown:
                raise ValueError(f"layer {layer}: cannot override {sorted(unknown)}; overridable fields: {sorted(allowed)}")
        return value

    @field_validator("full_attention_layers")
    @classmethod
    def _non_negative_layers(cls, value: list[int]) -> list[int]:
        if any(i < 0 for i in value):
            raise ValueError(f"layer indices must be >= 0, got {value}")
        return sorted(set(value))  # a set of layers: a repeat changes nothing

    @model_validator(mode="after")
    def _overrides_are_valid(self) -> "LoLAConfig":
        for layer in self.layer_overrides:
            try:
                self.for_layer(layer)
            except ValidationError as err:  # one line naming the layer and the field
                raise ValueError(f"layer_overrides[{layer}]: {validation_summary(err)}") from None
        return self

    @model_validator(mode="after")
    def _set_fields_act(self, info: ValidationInfo) -> "LoLAConfig":
        # A field the caller set (to other than its default) that the rest of the config makes
        # do nothing is refused, naming it and what it would act on. Fields left unset keep
        # their defaults quietly, and so do the configs of one layer (for_layer).
        if info.context and info.context.get("layer") is not None:
            return self
        given = {f for f in self.model_fields_set if getattr(self, f) != type(self).model_fields[f].get_default(call_default_factory=True)}
        mixing_set = "mixing" in self.model_fields_set
        idle = {
            "feature_dim": f"feature_dim={self.feature_dim} sizes the hedgehog map only: feature_dim does nothing with {self.feature_map} (its size is the head's)"
            if self.feature_map == "hedgehog_identity"
            else None,
            # Unset, the rule is decided when trained maps load (lola.pretrained.resolve): a cap may act then.
            "linear_share_cap": f"linear_share_cap={self.linear_share_cap} caps the linear state's share of each output, and under mixing='softmax_only' "
            "the state has no share: the cap does nothing when the state has no share"
            if mixing_set and self.mixing == "softmax_only"
            else None,
            "window_factor_init": f"window_factor_init={self.window_factor_init} starts the window factor that weighs the exact and linear terms, "
            "and under mixing='softmax_only' the window factor is never read"
            if self.mixing == "softmax_only"
            else None,
        }
        # (a chunk under the tokenwise schedule, or a policy with no sparse cache, stay accepted:
        # configs drawn over a grid carry them for the points that use them; the commands refuse
        # them where a user gave them, lola.methods.check_options)
        found = [why for field, why in idle.items() if why is not None and field in given]
        if found:
            raise ValueError(f"{found[0]}; leave it unset")
        return self

    @model_validator(mode="after")
    def _cap_from_needs_a_cap(self) -> "LoLAConfig":
        if self.linear_share_cap_from and self.linear_share_cap is None:
            raise ValueError(
                f"linear_share_cap_from={self.linear_share_cap_from} says where the share cap starts, but linear_share_cap is None: set a cap or leave linear_share_cap_from at 0"
            )
        return self

    @model_validator(mode="after")
    def _limits_need_bounded_positions(self) -> "LoLAConfig":
        if self.positions == "absolute":
            given = [f for f in ("exact_distance", "state_positions") if getattr(self, f) is not None]
            given += ["state_key_positions"] if self.state_key_positions != "clamped" else []
            if given:
                raise ValueError(
                    f"{' and '.join(given)} bound the positions of reads only with positions='bounded', got positions='absolute': set positions='bounded' or leave {' and '.join(given)} unset"
                )
        window = max(self.window_per_head) if self.window_per_head else self.window
        self.state_key_spread()
        if self.exact_distance is not None and self.exact_distance < window:
            raise ValueError(
                f"exact_distance={self.exact_distance} is shorter than the window ({window}): the window's keys keep their true distances; give at least {window}"
            )
        return self

    @model_validator(mode="after")
    def _schedule_accepts_kwargs(self) -> "LoLAConfig":
        from lola.schedules import build as build_schedule

        try:
            build_schedule(self.schedule, chunk=self.chunk, **self.schedule_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"schedule {self.schedule!r} with chunk={self.chunk} and schedule_kwargs {self.schedule_kwargs}: {err}") from None
        return self

    @model_validator(mode="after")
    def _policy_accepts_kwargs(self) -> "LoLAConfig":
        from lola.policies import build as build_policy
        from lola.schedules import build as build_schedule

        try:
            policy = build_policy(self.policy, **self.policy_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"policy_kwargs {short_repr(self.policy_kwargs)} do not fit policy {self.policy!r}: {err}") from None
        # The most candidates one step scores: the sparse cache and the tokens one period moves
        # out of the window. An option that acts on no step of this size does nothing.
        sparse = max(self.sparse_size_per_head) if self.sparse_size_per_head else self.sparse_size
        candidates = sparse + build_schedule(self.schedule, chunk=self.chunk, **self.schedule_kwargs).period
        for part in _policy_parts(policy):
            check = getattr(part, "check_candidates", None)
            if check is not None:
                try:
                    check(candidates)
                except ValueError as err:
                    raise ValueError(f"policy_kwargs {short_repr(self.policy_kwargs)} of policy {self.policy!r}: {err}") from None
        return self

    def for_layer(self, index: int) -> "LoLAConfig":
        """The configuration of layer ``index``: this one with its ``layer_overrides`` applied."""
        base = self.model_dump(exclude=_MODEL_LEVEL_FIELDS)
        return LoLAConfig.model_validate({**base, **self.layer_overrides.get(index, {})}, context={"layer": index})

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        from lola.policies import available

        if name not in available():
            raise ValueError(f"unknown policy {name!r}; available: {', '.join(available())}")
        return name

    def state_key_spread(self) -> int | None:
        """The distance from which ``state_key_positions="spread"`` places the state's keys (the
        largest window), ``None`` when they are clamped; refused, naming both, when
        ``state_positions`` is set and not above it."""
        if self.state_key_positions != "spread":
            return None
        window = max(self.window_per_head) if self.window_per_head else self.window
        if self.state_positions is not None and self.state_positions <= window:
            raise ValueError(
                f"state_key_positions='spread' places the state's keys at distances from the window ({window}) to state_positions ({self.state_positions}): "
                "give state_positions above the window"
            )
        return window

    @property
    def exact_budget(self) -> int:
        """``sinks + window + sparse_size``: exact tokens held after each step (the largest head's
        sizes when per-head sizes are given)."""
        window = max(self.window_per_head) if self.window_per_head else self.window
        sparse = max(self.sparse_size_per_head) if self.sparse_size_per_head else self.sparse_size
        return self.sinks + window + sparse


def _policy_parts(policy: object) -> list[object]:
    """``policy`` and every policy it is composed of (``parts`` of the combinators)."""
    out = [policy]
    for part in getattr(policy, "parts", ()) or ():
        out += _policy_parts(part)
    return out


def validation_summary(err: ValidationError) -> str:
    """``field: message`` for each error of ``err``, joined on one line
    (:func:`lola.errors.describe_validation`)."""
    from lola.errors import describe_validation

    return describe_validation(err)
