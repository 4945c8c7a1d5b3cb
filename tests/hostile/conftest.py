"""Fixtures of the hostile-input tests: a folder of its own per test, and models that refuse to load or follow a script."""

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


@pytest.fixture(scope="module")
def shared_llama():
    from lola.models import tiny_random

    return tiny_random()[0]


@pytest.fixture
def llama(shared_llama):
    """The tiny random Llama, left without LoLA after each test even when an assertion fails."""
    yield shared_llama
    if getattr(shared_llama, "_lola", None) is not None:
        from lola.integrations.transformers import remove_lola

        remove_lola(shared_llama)


@pytest.fixture
def scripted_model(monkeypatch):
    """``lola.models.load`` gives the tiny random Llama; ``script`` decides what each
    generate() call does (``None``: generate; an exception: raise it; a function: call it)."""
    from lola.models import tiny_random

    script: list = []
    calls: list = []

    def load(name, **kwargs):
        model, tok = tiny_random()
        generate = model.generate

        def scripted(*args, **kw):
            calls.append(1)
            action = script.pop(0) if script else None
            if isinstance(action, BaseException):
                raise action
            if action is not None:
                action()
            return generate(*args, **kw)

        model.generate = scripted
        return model, tok

    monkeypatch.setattr("lola.models.load", load)
    return script, calls
