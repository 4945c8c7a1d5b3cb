"""A name → factory registry with an entry-point group, shared by policies and schedules.

A third-party package publishes a factory in the group without any edit to lola; the group is
read the first time a name is missing (and again on :meth:`Registry.reload_entry_points`).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable, Generic, TypeVar

from lola.errors import UnknownName

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[F]):
    """Factories by name, plus those published in the entry-point group ``group``.

    Args:
        kind: what is registered, for messages (``"policy"``, ``"schedule"``).
        group: the entry-point group (``"lola.policies"``).
        check: called as ``check(name, factory)`` on registration; raises ``TypeError`` for a
            factory that cannot be one of ``kind``.
    """

    def __init__(self, kind: str, group: str, check: Callable[[str, F], None]) -> None:
        self.kind, self.group, self._check = kind, group, check
        self._factories: dict[str, F] = {}
        self._entry_points_loaded = False

    def register(self, name: str, factory: F | None = None, *, overwrite: bool = False) -> Any:
        """Register ``factory`` under ``name`` (without ``factory``: a decorator)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not isinstance(overwrite, bool):  # overwrite="no" would be truthy: a registration replaced by mistake
            raise TypeError(f"overwrite must be True or False, got {overwrite!r} ({type(overwrite).__name__})")

        def _do(f: F) -> F:
            self._check(name, f)
            if name in self._factories and self._factories[name] is not f and not overwrite:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._factories[name]!r}); pass overwrite=True to replace it")
            self._factories[name] = f
            return f

        return _do if factory is None else _do(factory)

    def unregister(self, name: str) -> None:
        """Remove a registration (mostly for tests)."""
        self._factories.pop(name, None)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.group):
            if ep.name not in self._factories:
                self.register(ep.name, ep.load())

    def reload_entry_points(self) -> None:
        """Read the entry-point group again (after installing a plug-in at run time)."""
        self._entry_points_loaded = False
        self._load_entry_points()

    def available(self) -> list[str]:
        """Sorted names of every registration, entry points included."""
        self._load_entry_points()
        return sorted(self._factories)

    def get(self, name: str) -> F:
        """The factory registered under ``name``.

        Raises:
            TypeError: ``name`` is not a string.
            KeyError: no such name (the message lists the registered ones).
        """
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} name must be a string, got {name!r} ({type(name).__name__})")
        if name not in self._factories:
            self._load_entry_points()
        if name not in self._factories:
            raise UnknownName(f"unknown {self.kind} {name!r}; available: {', '.join(self.available())}")
        return self._factories[name]
