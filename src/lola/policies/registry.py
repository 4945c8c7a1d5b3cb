"""Policy registry: built-ins, :func:`register`, and the ``lola.policies`` entry-point group.

A third-party package publishes a policy with, in its ``pyproject.toml``::

    [project.entry-points."lola.policies"]
    my_policy = "my_package.policies:MyPolicy"

after which ``LoLAConfig(policy="my_policy")`` works with no edit to lola.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable

from lola.policies.base import ScoringPolicy

__all__ = ["ENTRY_POINT_GROUP", "available", "build", "get", "register", "unregister"]

ENTRY_POINT_GROUP = "lola.policies"

PolicyFactory = Callable[..., ScoringPolicy]
_REGISTRY: dict[str, PolicyFactory] = {}
_ENTRY_POINTS_LOADED = False


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
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")

    def _do(f: PolicyFactory) -> PolicyFactory:
        if not callable(f) or not callable(getattr(f, "score", None)):
            raise TypeError(f"policy {name!r} must be a class or factory with a score(candidates, ctx) method, got {f!r}")
        if name in _REGISTRY and _REGISTRY[name] is not f and not overwrite:
            raise ValueError(f"policy {name!r} is already registered ({_REGISTRY[name]!r}); pass overwrite=True to replace it")
        _REGISTRY[name] = f
        return f

    return _do if factory is None else _do(factory)


def unregister(name: str) -> None:
    """Remove a registration (mostly for tests)."""
    _REGISTRY.pop(name, None)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY:
            register(ep.name, ep.load())


def reload_entry_points() -> None:
    """Look at the ``lola.policies`` entry points again (after installing a plug-in at run time)."""
    global _ENTRY_POINTS_LOADED
    _ENTRY_POINTS_LOADED = False
    _load_entry_points()


def available() -> list[str]:
    """Sorted names of every registered policy, entry points included."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get(name: str) -> PolicyFactory:
    """The factory registered under ``name``.

    Raises:
        KeyError: naming the valid policies.
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"policy name must be a string, got {name!r} ({type(name).__name__})")
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        raise KeyError(f"unknown policy {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name]


def build(name: str, **kwargs: Any) -> ScoringPolicy:
    """Instantiate the policy registered under ``name`` with ``kwargs``."""
    policy = get(name)(**kwargs)
    if not isinstance(policy, ScoringPolicy):
        raise TypeError(f"policy {name!r} built {policy!r}, which lacks score()/needs_attention")
    return policy
