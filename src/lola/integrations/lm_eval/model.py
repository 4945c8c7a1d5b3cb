"""The ``lola`` model of lm-evaluation-harness: lm-eval's ``HFLM`` with LoLA applied.

Importing this module registers :class:`LoLALM` under the name ``"lola"`` in lm-eval's model
registry, so ``lm_eval.simple_evaluate(model="lola", model_args=...)`` and
``python -m lola.integrations.lm_eval run --model_args ...`` evaluate a LoLA-patched model on
any lm-eval task::

    import lm_eval
    import lola.integrations.lm_eval.model  # registers "lola"

    lm_eval.simple_evaluate(model="lola", model_args="pretrained=tiny-random-llama,window=64,sparse_size=64",
                            tasks=["lambada_openai"], device="cpu")

Scoring (``loglikelihood``, ``loglikelihood_rolling``) runs one stateless LoLA forward per
batch (``use_cache=False``: no request sees another's state); generation
(``generate_until``) calls ``model.generate``, which builds a fresh
:class:`~lola.integrations.transformers.LoLACache` for every batch of left-padded prompts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from lola.config import LoLAConfig
from lola.errors import short_repr

__all__ = ["LOLA_ARGS", "LoLALM", "byte_tokenizer", "check_model_args", "lola_config_from_args", "parse_flag", "read_lola_config"]

#: model_args that :class:`LoLALM` takes besides ``HFLM``'s and :class:`~lola.LoLAConfig`'s fields.
LOLA_ARGS = ("lola_config", "feature_maps", "budgets", "apply_lola")


def byte_tokenizer() -> Any:
    """A transformers tokenizer equal to :class:`lola.data.text.ByteTokenizer`: every UTF-8 byte is
    its own token id (vocabulary 256), id 0 is the end-of-text and padding token, and no
    special token is added. lm-eval needs a transformers tokenizer (batch padding, ``encode``);
    :class:`LoLALM` uses this one for ``tiny-random-llama``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # GPT-2's byte-to-unicode table: the byte-level pre-tokenizer maps byte b to chars[b].
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=chars[0], pad_token=chars[0])


def read_lola_config(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a YAML (``.yaml``/``.yml``) or JSON file: :class:`~lola.LoLAConfig`
    fields, plus optionally ``budgets`` and ``feature_maps``."""
    from lola.io.outputs import read_mapping

    return read_mapping(path, "model_args lola_config")


def _parse_value(value: Any) -> Any:
    # model_args arrive as strings, ints, floats or bools; lists and dicts can be given as JSON.
    # lm-eval's command line reads "-1" as -1.0: a whole float becomes the int it was written
    # as (LoLAConfig's float fields take ints, its int fields refuse floats).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _check_name_or_path(what: str, value: Any, kinds: tuple[type, ...]) -> None:
    """Refuse a value that is neither ``None``, a name nor a path (a number from lm-eval's parser
    or a file), naming where it came from; read feature maps are accepted as they are."""
    if value is not None and not isinstance(value, kinds) and not hasattr(value, "merge_into"):
        raise TypeError(f"{what} must be a name or a path, got {short_repr(value)} ({type(value).__name__})")


def lola_config_from_args(
    lola_config: str | os.PathLike | dict | LoLAConfig | None = None,
    model_name: str | None = None,
    feature_maps: Any = None,
    budgets: str | None = "auto",
    **fields: Any,
) -> tuple[LoLAConfig, Any]:
    """The :class:`~lola.LoLAConfig` (and the read feature maps, or ``None``) that model_args describe.

    Args:
        lola_config: a YAML/JSON file (see :func:`read_lola_config`), a mapping, or a config;
            ``None``: ``LoLAConfig()`` defaults.
        model_name: the registered model name, for ``budgets="auto"``.
        feature_maps: a ``lola linearize`` folder or a shipped name (e.g.
            ``"smollm2-135m-instruct"``); its trained fields fill what the config leaves unset.
        budgets: per-head sparse budgets: ``"auto"`` (when the config sets no per-head or
            per-layer sparse sizes: the budgets calibrated for ``feature_maps`` if they carry any,
            else ``model_name``'s shipped budgets if it has any, else uniform), ``"uniform"`` / ``None``, a shipped name or a ``lola calibrate`` file.
        **fields: LoLAConfig fields; they override the file's.
    """
    _check_name_or_path("model_args lola_config", lola_config, (str, os.PathLike, dict, LoLAConfig))
    if isinstance(lola_config, LoLAConfig):
        base: dict[str, Any] = lola_config.model_dump(exclude_unset=True)
    elif isinstance(lola_config, dict):
        base = dict(lola_config)
    elif lola_config is None:
        base = {}
    else:
        base = read_lola_config(lola_config)
    # a file may name its budgets and feature maps; model_args given explicitly win
    if "budgets" in base:
        file_budgets = base.pop("budgets")
        budgets = file_budgets if budgets == "auto" else budgets
    file_maps = base.pop("feature_maps", None)
    feature_maps = feature_maps if feature_maps is not None else file_maps
    # given as model_args or read from the lola_config file: either way a name or a path
    _check_name_or_path("model_args feature_maps (or its lola_config entry)", feature_maps, (str, os.PathLike))
    _check_name_or_path("model_args budgets (or its lola_config entry)", budgets, (str,))
    unknown = sorted(set(fields) - set(LoLAConfig.model_fields))
    if unknown:
        raise ValueError(f"unknown model_args {unknown}: not LoLAConfig fields ({', '.join(LoLAConfig.model_fields)}) nor {', '.join(LOLA_ARGS)}")
    from pydantic import ValidationError

    try:
        cfg = LoLAConfig(**{**base, **{k: _parse_value(v) for k, v in fields.items()}})
    except ValidationError as err:  # one line naming where the fields came from: the file, the model_args
        from lola.errors import describe_validation

        where = [f"lola_config {lola_config}"] if isinstance(lola_config, (str, os.PathLike)) else []
        where += [f"model_args {', '.join(fields)}"] if fields else []
        raise ValueError(f"{' with '.join(where) or 'lola_config'}: {describe_validation(err)}") from None
    maps = None
    if feature_maps is not None:
        from lola.pretrained.folder import FeatureMaps, read_feature_maps

        maps = feature_maps if isinstance(feature_maps, FeatureMaps) else read_feature_maps(feature_maps)
    from lola.pretrained.resolve import resolve_config

    return resolve_config(cfg, model=model_name, feature_maps=maps, budgets=budgets), maps


def _registered(name: Any) -> bool:
    from lola.models import REGISTRY, TINY_RANDOM

    return isinstance(name, str) and (name in REGISTRY or name == TINY_RANDOM)


def _device(device: str | None) -> str:
    if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def parse_flag(name: str, value: Any) -> bool:
    """A boolean model_arg: ``True``/``False``, or lm-eval's text (``true``/``false``, ``yes``/``no``,
    ``1``/``0``, ``on``/``off``, any case); anything else is an error naming it (``bool("no")`` is
    true, so text is never cast)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"model_args {name} must be true or false, got {value!r}")


def check_model_args(kwargs: dict[str, Any], registered: bool) -> None:
    """Refuse model_args that are typos of a known one (for any model), and any name neither
    LoLA nor ``HFLM`` takes for a registered model (whose loading does not use them).

    ``HFLM`` passes unknown keyword arguments to ``from_pretrained`` for Hub or folder models,
    so there an unknown name is only refused when it is one edit away from a known name.
    """
    import difflib
    import inspect

    hflm = {p for p in inspect.signature(HFLM.__init__).parameters if p not in ("self", "kwargs")}
    known = hflm | set(LoLAConfig.model_fields) | set(LOLA_ARGS)
    for key in kwargs:
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
        if close or registered:
            hint = f"; did you mean {close[0]!r}?" if close else f" (LoLA's: {', '.join(LOLA_ARGS)}, LoLAConfig fields, or HFLM's)"
            raise ValueError(f"unknown model_args {key!r}{hint}")


def _check_hflm_sizes(kwargs: dict[str, Any]) -> None:
    """Refuse sizes that ``HFLM`` passes on unchecked: ``batch_size`` (an int >= 1, or lm-eval's
    ``auto``/``auto:N``), ``max_batch_size``, ``max_length`` (ints >= 1)."""
    for name in ("batch_size", "max_batch_size", "max_length"):
        value = kwargs.get(name)
        if value is None or (name == "batch_size" and isinstance(value, str) and value.split(":")[0] == "auto"):
            continue
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            expected = "an int >= 1 or auto" if name == "batch_size" else "an int >= 1"
            raise ValueError(f"model_args {name} must be {expected}, got {kwargs[name]!r}")
        kwargs[name] = value


class LoLALM(HFLM):
    """lm-eval's ``HFLM`` with :func:`~lola.integrations.transformers.apply_lola` applied.

    model_args (``"key=value,key=value"`` on lm-eval's command line):

    - ``pretrained``: a name registered with :func:`lola.models.load`
      (``smollm2-135m-instruct``, ``tiny-random-llama``), or anything ``HFLM`` loads (a Hugging
      Face folder, or a Hub name when online).
    - ``lola_config``: a YAML or JSON file of :class:`~lola.LoLAConfig` fields (and optionally
      ``budgets``, ``feature_maps``).
    - any :class:`~lola.LoLAConfig` field (``window=64``, ``sparse_size=192``, ``sinks=4``,
      ``policy=sre``, ``mixing=softmax_only``, …), overriding the file's; lists and dicts as
      JSON, without commas (lm-eval splits model_args at commas: put them in the file).
    - ``feature_maps``: a ``lola linearize`` folder or a shipped name.
    - ``budgets``: ``auto`` (default), ``uniform``, a shipped name or a ``lola calibrate`` file
      (see :func:`lola_config_from_args`).
    - ``apply_lola=false``: evaluate the stock model (a baseline for registered names, which
      lm-eval's ``hf`` model cannot load).
    - everything else goes to ``HFLM`` (``batch_size``, ``device``, ``dtype``, ``max_length``, …).
      ``device`` defaults to CUDA when available, else the CPU.
    """

    def __init__(
        self,
        pretrained: Any,
        lola_config: str | os.PathLike | dict | LoLAConfig | None = None,
        feature_maps: Any = None,
        budgets: str | None = "auto",
        apply_lola: bool | str = True,
        **kwargs: Any,
    ) -> None:
        apply_lola = parse_flag("apply_lola", apply_lola)
        _check_hflm_sizes(kwargs)
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k in LoLAConfig.model_fields}
        name = pretrained if _registered(pretrained) else None
        check_model_args(kwargs, registered=name is not None)
        kwargs["device"] = _device(kwargs.get("device"))
        cfg = maps = None
        if apply_lola:  # a bad config fails before the model loads
            cfg, maps = lola_config_from_args(lola_config, model_name=name, feature_maps=feature_maps, budgets=budgets, **fields)
        elif fields or lola_config is not None or feature_maps is not None:
            given = [*fields, *(["lola_config"] if lola_config is not None else []), *(["feature_maps"] if feature_maps is not None else [])]
            raise ValueError(f"apply_lola=false evaluates the stock model: drop the LoLA model_args {', '.join(given)}")
        if name is not None:
            from lola import models
            from lola.data.text import ByteTokenizer

            dtype = kwargs.pop("dtype", "auto")
            if isinstance(dtype, str):  # "auto", "float32", "bfloat16", …
                dtype = None if dtype == "auto" else getattr(torch, dtype)
            model, tok = models.load(name, dtype=dtype, device=kwargs["device"])
            if isinstance(tok, ByteTokenizer):
                tok = byte_tokenizer()
            given = kwargs.pop("tokenizer", None)
            super().__init__(pretrained=model, tokenizer=given or tok, **kwargs)
            self._lola_model_name = name
        else:
            super().__init__(pretrained=pretrained, **kwargs)
            self._lola_model_name = str(pretrained) if isinstance(pretrained, (str, os.PathLike)) else None
        self.lola_config = cfg
        self.lola_feature_maps = None if maps is None else str(maps.path)
        if cfg is not None and budgets not in (None, "uniform", "auto"):  # budgets for another model
            from lola import budgets as head_budgets
            from lola.errors import about
            from lola.pretrained.folder import model_geometry

            geometry = model_geometry(self.model)
            with about(f"model_args budgets={budgets}"):
                head_budgets.load(budgets).check_geometry(geometry["num_layers"], geometry["num_kv_heads"])
        if cfg is not None:
            from lola.integrations.transformers import apply_lola as _apply

            _apply(self.model, cfg, feature_maps=maps)

    def _model_call(self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        if attn_mask is not None or labels is not None or self.backend != "causal":
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        # One stateless forward per batch: no cache (a DynamicCache would keep every key).
        with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype, enabled=self.mixed_precision_dtype is not None):
            return self.model(inps, use_cache=False).logits

    def get_model_info(self) -> dict:
        """Model facts for lm-eval's results, with the LoLA configuration applied (no Hub calls
        for registered names and local folders)."""
        model = self._model
        info: dict[str, Any] = {
            "model_num_parameters": sum(p.numel() for p in model.parameters()),
            "model_dtype": str(getattr(model, "dtype", "")),
            "model_revision": self.revision,
            "model_sha": "",
            "lola_config": None if self.lola_config is None else self.lola_config.model_dump(mode="json"),
            "lola_feature_maps": self.lola_feature_maps,
        }
        local = self._lola_model_name is None or _registered(self._lola_model_name) or Path(self._lola_model_name).exists()
        if not local and not os.environ.get("HF_HUB_OFFLINE"):
            info["model_sha"] = super().get_model_info().get("model_sha", "")
        return info


register_model("lola")(LoLALM)  # not as a decorator: the docs build may mock lm-eval
