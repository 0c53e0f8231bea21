"""`thermik <cmd> --help` by sections: the default help keeps to the common keys and one line per section;
`--help SECTION` and `--help-all` list the rest; a variant section shows `type` and the chosen variant's knobs. And
the loader's keys and messages for variant sections (config/loader.py)."""

from __future__ import annotations

import pytest
from config_variants import Toy

from thermik.cli import main
from thermik.config import ConfigError, format_help, help_topic, load_config
from thermik.config.help import COMMON_SECTIONS, chooser_of
from thermik.config.schema import EvalRunConfig, RunConfig, SFTConfig
from thermik.config.surface import knobs

MAX_DEFAULT_SETTINGS = 120


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[set[str], str]:
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    return {line.split()[0][2:] for line in out.splitlines() if line.startswith("  --")}, out


@pytest.mark.parametrize(("cmd", "model_cls"), [("rl", RunConfig), ("sft", SFTConfig), ("eval", EvalRunConfig)])
def test_default_help_shows_sections_and_common_keys(
    capsys: pytest.CaptureFixture[str], cmd: str, model_cls: type
) -> None:
    shown, out = _help(capsys, cmd, "--help")
    every = {k.key for k in knobs(model_cls, chosen=lambda _p: None)}
    assert 0 < len(shown) <= MAX_DEFAULT_SETTINGS and len(shown) < len(every)
    assert {k for k in every if "." not in k} <= shown  # the top-level keys
    assert all("." not in k or k.split(".")[0] in COMMON_SECTIONS for k in shown)
    sections = [name for name, f in model_cls.model_fields.items() if f.description and "." in _first_key(every, name)]
    listed = out.split("Sections (", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in listed if line.strip()] == sections
    assert f"thermik {cmd} --help SECTION" in out


def _first_key(keys: set[str], section: str) -> str:
    return next((k for k in keys if k.startswith(f"{section}.")), section)


def test_help_section_and_help_all_list_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    every = {k.key for k in knobs(RunConfig, chosen=lambda _p: None)}
    default, _ = _help(capsys, "rl", "--help")
    algorithm, out = _help(capsys, "rl", "--help", "algorithm")
    assert algorithm == {k for k in every if k.startswith("algorithm.")} and "[general]" not in out
    optimizer, _ = _help(capsys, "rl", "--help=trainer.optimizer")
    assert optimizer == {k for k in every if k.startswith("trainer.optimizer.")} and "trainer.optimizer.lr" in optimizer
    assert _help(capsys, "rl", "--help-all")[0] == every
    sections = {k.split(".")[0] for k in every if "." in k}
    union: set[str] = set(default)
    for section in sections:
        union |= _help(capsys, "rl", "--help", section)[0]
    assert union == every  # every key is reachable from the default help's list


def test_help_of_an_unknown_section_suggests_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rl", "--help", "algoritm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("thermik rl: --help algoritm: no such section. Did you mean 'algorithm'")
    assert err.count("\n") == 1


def test_help_topic_parses_every_form() -> None:
    assert help_topic(["--help"]) == ("", [])
    assert help_topic(["-h", "@", "a.toml"]) == ("", ["@", "a.toml"])
    assert help_topic(["--x.type", "gspo", "--help", "algorithm"]) == ("algorithm", ["--x.type", "gspo"])
    assert help_topic(["--help=model", "--seed", "1"]) == ("model", ["--seed", "1"])
    assert help_topic(["--help-all"]) == ("all", [])
    assert help_topic(["--seed", "1"]) == (None, ["--seed", "1"])


def test_a_variant_section_shows_type_and_the_chosen_variants_knobs() -> None:
    default = format_help(Toy, "algorithm", chooser_of(None), "toy")
    assert '--algorithm.loss.type  {ppo,gspo}  default="ppo"' in default
    assert "--algorithm.loss.clip  float  default=0.2" in default and "clip_low" not in default
    cfg = load_config(Toy, ["--algorithm.loss.type", "gspo"], {})
    gspo = format_help(Toy, "algorithm", chooser_of(cfg), "toy")
    assert "--algorithm.loss.clip_low  float  default=0.0003" in gspo and "--algorithm.loss.clip " not in gspo
    assert '--algorithm.loss.type  {ppo,gspo}  default="ppo"' in gspo
    every = format_help(Toy, "all", chooser_of(cfg), "toy")  # --help-all: every section, the chosen variants
    assert "--algorithm.loss.clip_low" in every and "--name" in every and "[type=" not in every


def test_variant_keys_load_and_fail_naming_the_variant(tmp_path) -> None:
    cfg = load_config(Toy, ["--algorithm.loss.type", "gspo", "--algorithm.loss.clip_low", "1e-3"], {})
    assert (cfg.algorithm.loss.type, cfg.algorithm.loss.clip_low) == ("gspo", 1e-3)
    assert load_config(Toy, ["--algorithm.loss.clip", "0.3"], {}).algorithm.loss.clip == 0.3  # the default variant
    toml = tmp_path / "a.toml"
    toml.write_text('[algorithm.loss]\ntype = "gspo"\nclip_high = 1e-2\n')
    assert load_config(Toy, ["@", str(toml)], {}).algorithm.loss.clip_high == 1e-2
    with pytest.raises(ConfigError) as err:
        load_config(Toy, ["--algorithm.loss.clip_low", "1e-3"], {})
    assert str(err.value) == (
        "'algorithm.loss.clip_low' is a key of algorithm.loss.type = 'gspo', not of algorithm.loss.type = 'ppo' (from "
        "flag --algorithm.loss.clip_low): set algorithm.loss.type = 'gspo' or drop the key; the keys of 'ppo': clip."
    )
    with pytest.raises(ConfigError, match=r"Did you mean 'algorithm.loss.clip_low'.*Valid keys in section "):
        load_config(Toy, ["--algorithm.loss.clip_lo", "1"], {})
    with pytest.raises(ConfigError, match=r"algorithm.loss.clip_low: Input should be a valid number.*from file"):
        toml.write_text('[algorithm.loss]\ntype = "gspo"\nclip_low = "x"\n')
        load_config(Toy, ["@", str(toml)], {})
    with pytest.raises(ConfigError, match=r"expected tags: 'ppo', 'gspo'.*from environment variable"):
        load_config(Toy, [], {"THERMIK_ALGORITHM__LOSS__TYPE": "gsp"})


def test_the_command_line_chooses_the_variant_help_shows(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's help path (cli._run_configured) resolves the flags given with --help, so the variant they choose is
    the one shown; flags that do not resolve show the default variant."""
    from thermik.cli import _run_configured

    def never(_cfg: object) -> None:
        raise AssertionError("--help runs nothing")

    assert _run_configured(Toy, ["--algorithm.loss.type", "gspo", "--help", "algorithm"], never, "toy") == 0
    out = capsys.readouterr().out
    assert "--algorithm.loss.clip_low" in out and "--algorithm.loss.clip " not in out
    assert _run_configured(Toy, ["--algorithm.loss.type", "nope", "--help", "algorithm"], never, "toy") == 0
    assert "--algorithm.loss.clip  float" in capsys.readouterr().out
