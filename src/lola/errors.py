"""How lola reports bad input: one message that names the input at fault, on one line.

The one mechanism behind every message a user reads (docs/design.md, "Hostile input"):

- :class:`UnknownName` for a name that no registry holds: a ``KeyError`` (what ``dict``
  lookups raise, so ``except KeyError`` keeps working) that is also a ``ValueError`` (bad input)
  and whose text is its sentence, not the quoted key.
- :class:`InputError` and :func:`about`: an error raised while one input is consumed (an option,
  a model_arg, a file) is re-raised naming that input, unless it already does.
- :func:`describe`: any error as one line; a pydantic ``ValidationError`` names its fields.
- :func:`report`: the boundary of every command (``lola``, ``export-niah``, the lm-eval entry):
  a user error becomes one line ``PROG: error: MESSAGE`` and exit status 2; anything else is a
  bug and keeps its traceback.
"""

from __future__ import annotations

import re
import reprlib
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = [
    "USER_ERRORS",
    "InputError",
    "UnknownName",
    "about",
    "describe",
    "describe_validation",
    "name_options",
    "option_name",
    "report",
    "short_repr",
]

# What bad input raises. pydantic's ValidationError is a ValueError. A plain KeyError is not
# here: a lookup of user input raises UnknownName, so a bare KeyError is a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError)

# pydantic error types whose message is clearer with the value that was given.
_SHOW_INPUT = ("finite_number", "less_than_equal", "greater_than_equal", "greater_than", "less_than", "multiple_of")


def short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to about ``limit`` characters: a message quotes what was given, never
    a megabyte of it (a YAML alias bomb expands to 10**8 values)."""
    cut = reprlib.Repr()
    cut.maxstring = cut.maxother = limit
    cut.maxlist = cut.maxdict = cut.maxtuple = cut.maxset = 8
    cut.maxlevel = 3
    text = cut.repr(value)
    return text if len(text) <= limit + 20 else text[:limit] + "...'"


class UnknownName(KeyError, ValueError):
    """A name no registry holds (a model, a policy, shipped maps, a corpus); ``str()`` is the
    whole sentence (a ``KeyError``'s would be its quoted repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown name"


class InputError(ValueError):
    """An error about one named input: ``str()`` is ``"INPUT: message"``.

    Attributes:
        input: the input at fault as the user wrote it (``--budgets``, ``model_args window``,
            a file's path).
        message: what is wrong with it.
    """

    def __init__(self, input: str, message: str) -> None:
        super().__init__(f"{input}: {message}")
        self.input = input
        self.message = message


def describe_validation(err: Any, name: Callable[[str], str] | None = None) -> str:
    """A pydantic ``ValidationError`` as ``field: message; …`` on one line.

    Args:
        err: the ``ValidationError``.
        name: how a top-level field is named to the user (:func:`option_name` for a command's
            options); nested fields then follow in brackets (``--variants[a]``). Without it,
            fields are dotted paths (``layer_overrides.0.window``).
    """
    from pydantic import ValidationError

    parts = []
    for e in err.errors():
        loc = [str(x) for x in e["loc"]]
        where = ""
        if loc:
            where = name(loc[0]) + "".join(f"[{x}]" for x in loc[1:]) if name is not None else ".".join(loc)
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown option {loc[-1]!r}" if name is not None else f"unknown field {'.'.join(loc)!r}")
            continue
        inner = (e.get("ctx") or {}).get("error")
        msg = describe_validation(inner) if isinstance(inner, ValidationError) else e["msg"].removeprefix("Value error, ")
        if e["type"].endswith("_type") or e["type"] in _SHOW_INPUT:
            msg += f", got {short_repr(e['input'])} ({type(e['input']).__name__})"
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def option_name(field: str) -> str:
    """A config field as the command-line option that sets it: ``max_new_tokens`` →
    ``--max-new-tokens``."""
    return "--" + field.replace("_", "-")


def name_options(text: str, options: Mapping[str, str]) -> str:
    """``text`` (a message a command's run spec or config raised) with the fields it names
    written as the command's options: ``options`` maps a field (an argparse dest) to its option
    string (``{"exact_distance": "--exact-distance"}``).

    A field is translated where it is certainly one: a name with an underscore
    (``exact_distance``), a name followed by its value (``positions='bounded'`` →
    ``--positions bounded``), or a name that opens the message before its value or a colon
    (``methods ['full']``, ``budgets: …``). Plain words elsewhere (``the window``), parts of
    paths, file names and quoted names are left as they are.
    """
    if not options:
        return text
    names = "|".join(sorted(map(re.escape, options), key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w./'\"`-])({names})(?:=('[^']*'|\"[^\"]*\"|[^\s,;:)]+))?(?![\w/-]|\.\w)")

    def swap(match: re.Match) -> str:
        field, value = match.group(1), match.group(2)
        option = options[field]
        if value is not None:
            return f"{option} {value.strip(chr(39) + chr(34))}"
        if text.startswith(" (--", match.end()):  # named both ways already: `length (--length)`
            return field
        opens = match.start() == 0 and re.match(r"(:|\s['\"\[\d-])", text[match.end() : match.end() + 2])
        return option if "_" in field or opens else field

    return pattern.sub(swap, text)


def describe(err: BaseException, name: Callable[[str], str] | None = None) -> str:
    """``err`` as one line: a ``ValidationError`` names its fields (through ``name``, see
    :func:`describe_validation`), a ``KeyError`` shows its sentence without quotes; newlines
    and runs of spaces are folded."""
    import pydantic

    if isinstance(err, pydantic.ValidationError):
        text = describe_validation(err, name)
    elif isinstance(err, KeyError) and err.args and not isinstance(err, UnknownName):
        text = str(err.args[0])
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


@contextmanager
def about(input: str) -> Iterator[None]:
    """Re-raise a user error raised inside as an :class:`InputError` naming ``input``.

    An :class:`InputError` passes unchanged (it already names its input), and so does a message
    that starts with ``input``. ``OSError``\\ s become ``InputError`` too: a command reports them
    the same way. The original error is kept as ``__cause__`` (``--debug`` shows it).

    Example::

        with about("--budgets"):
            budgets = load(args.budgets)
    """
    try:
        yield
    except InputError:
        raise
    except (*USER_ERRORS, KeyError) as err:
        text = describe(err)
        if text.startswith(input):
            raise
        raise InputError(input, text) from err


def report(
    prog: str, err: BaseException, debug: bool = False, name: Callable[[str], str] | None = option_name, options: Mapping[str, str] | None = None
) -> int:
    """The boundary of a command: a user error printed as one line ``PROG: error: MESSAGE`` on
    stderr, returning exit status 2.

    A ``RuntimeError`` (a failed download, a damaged installation: messages that say what to
    do, but that may also be bugs) and a ``MemoryError`` (a state refused before it is
    allocated, naming its sizes) are printed the same way with a pointer to ``--debug``.
    Anything else (a bare ``KeyError``, ``AttributeError``…) is a bug: re-raised with its
    traceback, as is every error when ``debug`` is set. A ``ValidationError`` here comes from a
    command's options: its fields are named by ``name`` (default :func:`option_name`). With
    ``options`` (the command's fields → option strings), the fields a message names are written
    as the options that set them (:func:`name_options`); an :class:`InputError` already names its
    input, which is translated alone when it is a field.
    """
    if debug or not isinstance(err, (*USER_ERRORS, RuntimeError, MemoryError)):
        raise err
    more = "" if isinstance(err, USER_ERRORS) else " (run with --debug for the traceback)"
    text = describe(err, name)
    if options and isinstance(err, InputError):
        if err.input in options:
            text = options[err.input] + text[len(err.input) :]
    elif options and isinstance(err, (ValueError, TypeError)):
        text = name_options(text, options)
    print(f"{prog}: error: {text}{more}", file=sys.stderr)
    return 2
