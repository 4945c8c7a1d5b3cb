"""Command-line options generated from a run's pydantic spec: one source of defaults and help.

A command whose run is a pydantic model (``lola niah``'s :class:`~lola.eval.runner.NiahRun`,
``lola fit-scorer``'s :class:`~lola.scorers.fit.FitSpec`) gets one option per field:
``--field-name``, typed from the field's annotation (``list[int]`` takes several values, a
``Literal`` its choices), helped by the field's description and its default. Options the user
does not give stay ``None`` and are left out of the spec (:func:`given_fields`), so the spec's
own default applies and is validated in one place.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Iterable

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from lola.errors import option_name

__all__ = ["add_spec_options", "given_fields"]


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The annotation without ``Annotated`` and ``None`` (``X | None``), and whether it is a list."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                raise TypeError(f"no command-line form for {annotation!r}")
            annotation = rest[0]
        elif origin is list:
            inner, _ = _unwrap(typing.get_args(annotation)[0])
            return inner, True
        else:
            return annotation, False


def _default(info: Any) -> Any:
    if info.default_factory is not None:
        return info.default_factory()
    return None if info.default is PydanticUndefined else info.default


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def add_spec_options(parser: argparse.ArgumentParser | Any, spec: type[BaseModel], fields: Iterable[str], aliases: dict[str, list[str]] | None = None) -> None:
    """Add ``--field`` options for ``fields`` of ``spec`` to ``parser`` (an argparse parser or
    argument group), each defaulting to ``None`` (unset); the help is the field's description
    and its default (``"(default: none)"`` for ``None``, whose meaning the description gives).
    ``aliases`` gives a field other option strings as well (``{"lengths": ["--length"]}``).

    Raises:
        ValueError: a field without a description (the help would say nothing).
        TypeError: a field whose type has no command-line form (a mapping).
    """
    for name in fields:
        info = spec.model_fields[name]
        if not info.description:
            raise ValueError(f"{spec.__name__}.{name} has no description: the option would have no help")
        kind, many = _unwrap(info.annotation)
        kwargs: dict[str, Any] = {"dest": name, "default": None}
        if typing.get_origin(kind) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(kind))
        elif kind in (int, float):
            kwargs["type"] = kind
        elif kind is not str:
            raise TypeError(f"{spec.__name__}.{name}: no command-line form for {info.annotation!r}")
        if many:
            kwargs["nargs"] = "+"
        default = _default(info)
        kwargs["help"] = f"{info.description} (default: {'none' if default is None else _show(default)})"
        parser.add_argument(*(aliases or {}).get(name, []), option_name(name), **kwargs)


def given_fields(args: argparse.Namespace, fields: Iterable[str]) -> dict[str, Any]:
    """The options of ``fields`` the user gave (``None``: not given, the spec's default applies)."""
    return {name: getattr(args, name) for name in fields if getattr(args, name, None) is not None}
