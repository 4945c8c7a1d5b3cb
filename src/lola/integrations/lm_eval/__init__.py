"""LoLA in lm-evaluation-harness (``pip install -e ".[eval]"``).

- :mod:`lola.integrations.lm_eval.model`: the ``lola`` model of lm-eval (:class:`LoLALM`, an
  ``HFLM`` with LoLA applied), registered when the module is imported;
- :mod:`lola.integrations.lm_eval.niah`: :func:`export_niah` writes the prompts of
  ``lola niah`` as a local lm-eval task (needs no lm-eval);
- ``python -m lola.integrations.lm_eval run …`` runs lm-eval's ``run`` command with the
  ``lola`` model registered, offline; ``… export-niah …`` exports the niah prompts.

The names below are imported on first use, so that exporting needs no lm-eval.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LoLALM", "byte_tokenizer", "export_niah", "load_tokenizer", "lola_config_from_args"]

_WHERE = {
    "LoLALM": "model",
    "byte_tokenizer": "model",
    "lola_config_from_args": "model",
    "export_niah": "niah",
    "load_tokenizer": "niah",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
