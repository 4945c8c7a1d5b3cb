import pytest


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """Run every test in its own folder: a default output path (``results/…``) lands there."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a command loads a model: these errors must come before that."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr("lola.models.load", refuse)
    monkeypatch.setattr("lola.models.tiny_random", refuse)
