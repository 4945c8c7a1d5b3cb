"""Policy registry: built-ins, :func:`register`, and the ``lola.policies`` entry-point group.

A third-party package publishes a policy with, in its ``pyproject.toml``::

    [project.entry-points."lola.policies"]
    my_policy = "my_package.policies:MyPolicy"

after which ``LoLAConfig(policy="my_policy")`` works with no edit to lola.

A policy's options are validated by its own schema before it is built (:func:`options_schema`):
for a dataclass, a pydantic model of its init fields with their annotations (bounds written as
``Annotated[int, Field(ge=1)]`` hold), unknown options refused and every float finite.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from lola.policies.base import ScoringPolicy
from lola.registry import Registry

__all__ = ["ENTRY_POINT_GROUP", "available", "build", "get", "options_schema", "register", "unregister"]

ENTRY_POINT_GROUP = "lola.policies"

PolicyFactory = Callable[..., ScoringPolicy]


def _check_policy(name: str, factory: PolicyFactory) -> None:
    if not callable(factory) or not callable(getattr(factory, "score", None)):
        raise TypeError(f"policy {name!r} must be a class or factory with a score(candidates, ctx) method, got {factory!r}")


_POLICIES: Registry[PolicyFactory] = Registry("policy", ENTRY_POINT_GROUP, _check_policy)


def register(name: str, factory: PolicyFactory | None = None, *, overwrite: bool = False) -> Any:
    """Register a policy class (or factory) under ``name``; usable as a decorator.

    Args:
        name: the name used in ``LoLAConfig(policy=name)``.
        factory: a class or callable returning an object with ``score(candidates, ctx)``.
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


def unregister(name: str) -> None:
    """Remove a registration (mostly for tests)."""
    _POLICIES.unregister(name)


def reload_entry_points() -> None:
    """Look at the ``lola.policies`` entry points again (after installing a plug-in at run time)."""
    _POLICIES.reload_entry_points()


def available() -> list[str]:
    """Sorted names of every registered policy, entry points included."""
    return _POLICIES.available()


def get(name: str) -> PolicyFactory:
    """The factory registered under ``name``.

    Raises:
        KeyError: naming the valid policies.
        TypeError: ``name`` is not a string.
    """
    return _POLICIES.get(name)


@functools.lru_cache(maxsize=None)
def options_schema(factory: PolicyFactory) -> type[BaseModel] | None:
    """The pydantic model of a dataclass policy's options (its init fields), or ``None`` for a
    factory that is not a dataclass (its own ``__init__`` checks what it takes).

    Floats must be finite, unknown options are refused, and constraints in ``Annotated``
    field types apply; values are converted as pydantic's lax mode does (``"3"`` → ``3``)."""
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
        fields[f.name] = (hints.get(f.name, Any), default)
    config = ConfigDict(extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
    return create_model(f"{factory.__name__}Options", __config__=config, **fields)


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
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']} (got {e.get('input')!r})" for e in err.errors())
            # an option the policy does not take is a TypeError, as in any Python call
            kind = TypeError if all(e["type"] == "extra_forbidden" for e in err.errors()) else ValueError
            raise kind(f"policy {name!r} options: {problems}") from None
        kwargs = {k: getattr(valid, k) for k in kwargs}
    policy = factory(**kwargs)
    if not isinstance(policy, ScoringPolicy):
        raise TypeError(f"policy {name!r} built {policy!r}, which lacks score()/needs_attention")
    return policy
