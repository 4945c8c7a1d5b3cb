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

__all__ = ["add_shared_options", "add_spec_options", "given_fields"]


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


def _form(spec: type[BaseModel], name: str) -> dict[str, Any]:
    """The argparse keywords of field ``name`` of ``spec``: its type or choices, ``nargs``."""
    info = spec.model_fields[name]
    if not info.description:
        raise ValueError(f"{spec.__name__}.{name} has no description: the option would have no help")
    kind, many = _unwrap(info.annotation)
    kwargs: dict[str, Any] = {}
    if typing.get_origin(kind) is typing.Literal:
        kwargs["choices"] = list(typing.get_args(kind))
    elif kind in (int, float):
        kwargs["type"] = kind
    elif kind is not str:
        raise TypeError(f"{spec.__name__}.{name}: no command-line form for {info.annotation!r}")
    if many:
        kwargs["nargs"] = "+"
    return kwargs


def _shown_default(spec: type[BaseModel], name: str) -> str:
    default = _default(spec.model_fields[name])
    return "none" if default is None else _show(default)


def add_spec_options(
    parser: argparse.ArgumentParser | Any,
    spec: type[BaseModel],
    fields: Iterable[str],
    aliases: dict[str, list[str]] | None = None,
    dests: dict[str, str] | None = None,
) -> None:
    """Add ``--field`` options for ``fields`` of ``spec`` to ``parser`` (an argparse parser or
    argument group), each defaulting to ``None`` (unset); the help is the field's description
    and its default (``"(default: none)"`` for ``None``, whose meaning the description gives).
    ``aliases`` gives a field other option strings as well (``{"lengths": ["--length"]}``);
    ``dests`` names a field's option otherwise (``{"lr": "lora_lr"}``: ``--lora-lr``), for a
    command that runs several specs with fields of one name.

    Raises:
        ValueError: a field without a description (the help would say nothing).
        TypeError: a field whose type has no command-line form (a mapping).
    """
    for name in fields:
        dest = (dests or {}).get(name, name)
        kwargs = _form(spec, name)
        help_ = f"{spec.model_fields[name].description} (default: {_shown_default(spec, name)})"
        parser.add_argument(*(aliases or {}).get(name, []), option_name(dest), dest=dest, default=None, help=help_, **kwargs)


def add_shared_options(parser: argparse.ArgumentParser | Any, specs: dict[str, tuple[type[BaseModel], dict[str, str]]]) -> None:
    """One option for fields that several specs share (the stages of one command): ``specs`` maps
    a label (``"stage 1"``) to its spec and ``{option dest: field}``. The help is the field's
    description and default, each spec's with its label where they differ (``"(default: 25 in
    stage 1, 10 in stage 2)"``); the specs must give the field one command-line form.

    Raises:
        ValueError: the specs give a shared field different command-line forms, or no description.
    """
    dests = dict.fromkeys(d for _, fields in specs.values() for d in fields)
    for dest in dests:
        holders = [(label, spec, fields[dest]) for label, (spec, fields) in specs.items() if dest in fields]
        forms = [_form(spec, field) for _, spec, field in holders]
        if any(f != forms[0] for f in forms):
            raise ValueError(f"option {option_name(dest)} sets fields of different forms: " + ", ".join(f"{s.__name__}.{f}" for _, s, f in holders))
        shown = [(label, _shown_default(spec, field)) for label, spec, field in holders]
        default = shown[0][1] if len({d for _, d in shown}) == 1 else ", ".join(f"{d} in {label}" for label, d in shown)
        described = [(label, spec.model_fields[field].description) for label, spec, field in holders]
        about = described[0][1] if len({d for _, d in described}) == 1 else "; ".join(f"{label}: {d}" for label, d in described)
        parser.add_argument(option_name(dest), dest=dest, default=None, help=f"{about} (default: {default})", **forms[0])


def given_fields(args: argparse.Namespace, fields: Iterable[str], dests: dict[str, str] | None = None) -> dict[str, Any]:
    """The options of ``fields`` the user gave (``None``: not given, the spec's default applies);
    ``dests`` as in :func:`add_spec_options`."""
    named = {name: (dests or {}).get(name, name) for name in fields}
    return {name: getattr(args, dest) for name, dest in named.items() if getattr(args, dest, None) is not None}
