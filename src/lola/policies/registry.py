"""Policy registry: built-ins, :func:`register`, and the ``lola.policies`` entry-point group.

A third-party package publishes a policy with, in its ``pyproject.toml``::

    [project.entry-points."lola.policies"]
    my_policy = "my_package.policies:MyPolicy"

after which ``LoLAConfig(policy="my_policy")`` works with no edit to lola.

A policy's options are validated by its own schema before it is built (:func:`options_schema`):
for a dataclass, a pydantic model of its init fields with their annotations (bounds written as
``Annotated[int, Field(ge=1)]`` hold), unknown options refused, every float finite and numbers
strict as in :class:`lola.LoLAConfig` (``seed=True`` is no int, ``radius=2.0`` neither).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
import weakref
from typing import Annotated, Any, Callable

from pydantic import BaseModel, ConfigDict, Strict, ValidationError, create_model

from lola.errors import short_repr
from lola.policies.base import ScoringPolicy
from lola.registry import Registry

__all__ = ["ENTRY_POINT_GROUP", "available", "build", "describe", "get", "options_schema", "register", "unregister"]

ENTRY_POINT_GROUP = "lola.policies"

PolicyFactory = Callable[..., ScoringPolicy]


def _check_policy(name: str, factory: PolicyFactory) -> None:
    # A class must define score(); a factory function is checked by what it builds (build()).
    if not callable(factory) or (isinstance(factory, type) and not callable(getattr(factory, "score", None))):
        raise TypeError(f"policy {name!r} must be a class with a score(candidates, ctx) method or a callable returning one, got {factory!r}")


_POLICIES: Registry[PolicyFactory] = Registry("policy", ENTRY_POINT_GROUP, _check_policy)


def register(name: str, factory: PolicyFactory | None = None, *, overwrite: bool = False) -> Any:
    """Register a policy class (or factory) under ``name``; usable as a decorator.

    Args:
        name: the name used in ``LoLAConfig(policy=name)``.
        factory: a class with ``score(candidates, ctx)``, or any callable returning such an
            object (checked when it is built).
        overwrite: replace an existing registration instead of raising.

    Example::

        @lola.policies.register("value_norm")
        @dataclass(frozen=True)
        class ValueNorm:
            needs_attention = False
            def score(self, candidates, ctx):
                return candidates.v.float().norm(dim=-1)
    """
    return _POLICIES.register(name, factory, overwrite=overwrite)


# The shared Registry's own methods (documented there): one definition for policies and schedules.
unregister = _POLICIES.unregister
reload_entry_points = _POLICIES.reload_entry_points
available = _POLICIES.available
get = _POLICIES.get


@functools.lru_cache(maxsize=None)
def options_schema(factory: PolicyFactory) -> type[BaseModel] | None:
    """The pydantic model of a dataclass policy's options (its init fields), or ``None`` for a
    factory that is not a dataclass (its own ``__init__`` checks what it takes).

    Floats must be finite, unknown options are refused, and constraints in ``Annotated``
    field types apply. Numbers are strict, as in :class:`lola.LoLAConfig`: an int option
    refuses a bool, a float or a string (``True`` or ``2.0`` is not read as ``1`` or ``2``), a
    float option a bool or a string (an int is a float); other values convert as pydantic's
    lax mode does (a list for a tuple)."""
    if not (isinstance(factory, type) and dataclasses.is_dataclass(factory)):
        return None
    hints = typing.get_type_hints(factory, include_extras=True)
    fields = {}
    for f in dataclasses.fields(factory):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = ...
        fields[f.name] = (_strict_numbers(hints.get(f.name, Any)), default)
    config = ConfigDict(extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
    return create_model(f"{factory.__name__}Options", __config__=config, **fields)


def _strict_numbers(annotation: Any) -> Any:
    """``annotation`` with every ``int``, ``float`` and ``bool`` in it made strict, inside
    ``Annotated``, unions (``| None``) and containers (``list[float]``)."""
    if annotation in (int, float, bool):
        return Annotated[annotation, Strict()]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return Annotated[(_strict_numbers(args[0]), *annotation.__metadata__)]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_strict_numbers(a) for a in args)]
    if origin in (list, tuple, set, frozenset, dict) and args:
        return origin[tuple(a if a is Ellipsis else _strict_numbers(a) for a in args)]
    return annotation


# The registered name of each policy build() made (by id, dropped when the policy is): a
# plug-in's repr rarely says which name it was registered under, and messages must name it.
_NAMES: dict[int, str] = {}


def _remember(policy: object, name: str) -> None:
    try:
        weakref.finalize(policy, _NAMES.pop, id(policy), None)
    except TypeError:  # no weak references to it (__slots__): described by its repr alone
        return
    _NAMES[id(policy)] = name


def describe(policy: object) -> str:
    """How messages name a policy: ``'name' (repr)`` for one :func:`build` made, else its repr."""
    name = _NAMES.get(id(policy))
    return f"{name!r} ({policy!r})" if name is not None else repr(policy)


def build(name: str, **kwargs: Any) -> ScoringPolicy:
    """Instantiate the policy registered under ``name`` with ``kwargs``, validated first by the
    policy's own schema (:func:`options_schema`).

    Raises:
        TypeError: an option the policy does not take (named).
        ValueError: an option of the wrong type, out of its bounds or not finite (naming the
            policy and the option).
    """
    factory = get(name)
    schema = options_schema(factory)
    if schema is not None:
        try:
            valid = schema.model_validate(kwargs)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']} (got {short_repr(e.get('input'))})" for e in err.errors())
            # an option the policy does not take is a TypeError, as in any Python call
            kind = TypeError if all(e["type"] == "extra_forbidden" for e in err.errors()) else ValueError
            raise kind(f"policy {name!r} options: {problems}") from None
        kwargs = {k: getattr(valid, k) for k in kwargs}
    policy = factory(**kwargs)
    if not isinstance(policy, ScoringPolicy):
        raise TypeError(f"policy {name!r} built {policy!r}, which lacks score()/needs_attention")
    _remember(policy, name)
    return policy
