"""Command-line options generated from a run's spec: every field an option, its help the
field's description and default, nothing given → the spec's own default."""

import argparse
import typing

import pytest
from pydantic import BaseModel, Field

from lola.cli.spec_options import add_spec_options, given_fields


class Spec(BaseModel):
    name: str = Field("a", description="a name")
    sizes: list[int] = Field(default_factory=lambda: [1, 2], description="sizes")
    rule: typing.Literal["x", "y"] | None = Field(None, description="a rule")
    rate: float = Field(0.5, description="a rate")


def test_options_take_their_type_choices_help_and_stay_unset_when_not_given():
    parser = argparse.ArgumentParser()
    add_spec_options(parser, Spec, Spec.model_fields)
    args = parser.parse_args(["--sizes", "3", "4", "--rule", "y"])
    assert given_fields(args, Spec.model_fields) == {"sizes": [3, 4], "rule": "y"}
    assert Spec(**given_fields(args, Spec.model_fields)) == Spec(sizes=[3, 4], rule="y")
    with pytest.raises(SystemExit):
        parser.parse_args(["--rule", "z"])
    text = parser.format_help()
    for expected in ("a name (default: a)", "sizes (default: 1 2)", "a rule (default: none)", "a rate (default: 0.5)", "{x,y}"):
        assert expected in " ".join(text.split()), expected


def test_a_field_without_description_or_command_line_form_is_refused():
    class Bare(BaseModel):
        x: int = 1

    class Mapping(BaseModel):
        m: dict[str, int] = Field(default_factory=dict, description="a mapping")

    with pytest.raises(ValueError, match="Bare.x has no description"):
        add_spec_options(argparse.ArgumentParser(), Bare, ["x"])
    with pytest.raises(TypeError, match="Mapping.m"):
        add_spec_options(argparse.ArgumentParser(), Mapping, ["m"])


def test_lola_niah_offers_every_field_of_its_run_with_the_run_s_defaults(capsys):
    from lola.cli import NIAH_FIELDS, main
    from lola.eval.runner import NiahRun

    assert set(NiahRun.model_fields) - set(NIAH_FIELDS) == {"gqa_storage", "variants"}  # set in --config files
    with pytest.raises(SystemExit):
        main(["niah", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in NIAH_FIELDS:
        option = "--" + name.replace("_", "-")
        info = NiahRun.model_fields[name]
        assert option in text and " ".join(info.description.split()) in text, name
    assert "(default: 60)" in text and "(default: 2048 4096)" in text and "(default: auto)" in text


@pytest.mark.parametrize("command", ["perplexity", "calibrate", "fit-scorer"])
def test_other_commands_offer_their_spec_s_fields_with_its_defaults(command, capsys):
    from lola.cli import PERPLEXITY_FIELDS, main
    from lola.eval.calibrate import CalibrateSpec
    from lola.eval.perplexity import PerplexityRun
    from lola.scorers.fit import FitSpec

    spec, fields = {
        "perplexity": (PerplexityRun, PERPLEXITY_FIELDS),
        "calibrate": (CalibrateSpec, tuple(CalibrateSpec.model_fields)),
        "fit-scorer": (FitSpec, tuple(FitSpec.model_fields)),
    }[command]
    if command == "perplexity":
        assert set(spec.model_fields) - set(fields) == {"heldout_fraction"}
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in fields:
        info = spec.model_fields[name]
        default = info.default_factory() if info.default_factory else info.default
        shown = "none" if default is None else " ".join(map(str, default)) if isinstance(default, list) else str(default)
        assert "--" + name.replace("_", "-") in text and f"{' '.join(info.description.split())} (default: {shown})" in text, name


def test_perplexity_keeps_its_length_option_as_an_alias():
    from lola.cli import PERPLEXITY_FIELDS, build_parser
    from lola.cli.spec_options import given_fields

    args = build_parser().parse_args(["perplexity", "--length", "96", "128"])
    assert given_fields(args, PERPLEXITY_FIELDS) == {"lengths": [96, 128]}


def test_shared_options_set_every_spec_and_show_each_default():
    from lola.cli.spec_options import add_shared_options

    class First(BaseModel):
        every: int = Field(25, description="steps between saves")
        size: int = Field(8, description="tokens per chunk")

    class Second(BaseModel):
        every: int = Field(10, description="steps between saves")
        length: int = Field(8, description="tokens per sequence")

    parser = argparse.ArgumentParser()
    add_shared_options(parser, {"stage 1": (First, {"every": "every", "size": "size"}), "stage 2": (Second, {"every": "every", "size": "length"})})
    args = parser.parse_args(["--size", "16"])
    assert given_fields(args, ["every", "size"]) == {"size": 16}
    assert Second(**given_fields(args, ["length"], {"length": "size"})) == Second(length=16)
    text = " ".join(parser.format_help().split())
    assert "steps between saves (default: 25 in stage 1, 10 in stage 2)" in text
    assert "stage 1: tokens per chunk; stage 2: tokens per sequence (default: 8)" in text

    class Other(BaseModel):
        every: str = Field("x", description="steps between saves")

    with pytest.raises(ValueError, match="--every sets fields of different forms"):
        add_shared_options(argparse.ArgumentParser(), {"a": (First, {"every": "every"}), "b": (Other, {"every": "every"})})


def test_lola_linearize_offers_both_stages_fields_with_their_defaults(capsys):
    from lola.cli import LINEARIZE_SHARED, LINEARIZE_STAGE1, LINEARIZE_STAGE2, build_parser, linearize_fields, main
    from lola.linearize import FinetuneConfig, LinearizeConfig

    # Fields with no option are set otherwise (--stage2-attention, --from-lora, ...) or kept internal.
    assert set(LinearizeConfig.model_fields) - {*LINEARIZE_STAGE1, *LINEARIZE_SHARED} == {"affine", "cache_activations", "heldout_fraction"}
    assert set(FinetuneConfig.model_fields) - {*LINEARIZE_STAGE2, *LINEARIZE_SHARED.values()} == {
        "heldout_fraction",
        "lora_targets",
        "lola",
        "from_lora",
        "gradient_checkpointing",
    }
    with pytest.raises(SystemExit):
        main(["linearize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for spec, field, option in [
        *((LinearizeConfig, f, f) for f in LINEARIZE_STAGE1),
        *((FinetuneConfig, f, o) for f, o in LINEARIZE_STAGE2.items()),
    ]:
        info = spec.model_fields[field]
        default = "none" if info.default is None else info.default
        assert f"--{option.replace('_', '-')}" in text and f"{' '.join(info.description.split())} (default: {default})" in text, option
    assert "steps between checkpoints (default: 25 in stage 1, 10 in stage 2)" in text
    # one option, both stages: --chunk-tokens is stage 2's seq_len, --lora-lr its lr
    args = build_parser().parse_args(["linearize", "--out", "x", "--chunk-tokens", "256", "--lora-lr", "0.5", "--lr", "0.1"])
    assert linearize_fields(args) == ({"chunk_tokens": 256, "lr": 0.1}, {"seq_len": 256, "lr": 0.5})
