"""Policy registry: built-ins, :func:`register`, and the ``lola.policies`` entry-point group.

A third-party package publishes a policy with, in its ``pyproject.toml``::

    [project.entry-points."lola.policies"]
    my_policy = "my_package.policies:MyPolicy"

after which ``LoLAConfig(policy="my_policy")`` works with no edit to lola.
"""

from __future__ import annotations

from typing import Any, Callable

from lola.policies.base import ScoringPolicy
from lola.registry import Registry

__all__ = ["ENTRY_POINT_GROUP", "available", "build", "get", "register", "unregister"]

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


def build(name: str, **kwargs: Any) -> ScoringPolicy:
    """Instantiate the policy registered under ``name`` with ``kwargs``."""
    policy = get(name)(**kwargs)
    if not isinstance(policy, ScoringPolicy):
        raise TypeError(f"policy {name!r} built {policy!r}, which lacks score()/needs_attention")
    return policy
