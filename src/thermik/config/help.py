"""`thermik <cmd> --help`: the sections one line each and the common knobs; `--help SECTION` and `--help-all` the rest.

A config has a few hundred keys; the default help keeps to the top-level keys, the sections most runs set
(`COMMON_SECTIONS`) and one line per other section. A section that picks a variant (`algorithm.loss.type`) shows its
`type` with the choices and the knobs of the chosen variant: the one the files, environment and flags given before
`--help` choose, else the default one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from pydantic import BaseModel

from thermik.config.loader import ENV_PREFIX, ConfigError
from thermik.config.surface import Chooser, Knob, knobs, section_model, variants

HELP_FLAGS = ("-h", "--help")
HELP_ALL = "--help-all"
ALL = "all"
COMMON_SECTIONS = ("model", "rollout", "data", "trainer", "checkpoint")  # shown in full by the default help


def help_topic(argv: list[str]) -> tuple[str | None, list[str]]:
    """(topic, the other arguments) for `--help [SECTION]`, `--help=SECTION`, `-h` or `--help-all`: topic '' for
    the default help, 'all' for every key, a section's dotted name; (None, argv) when no help is asked for."""
    for i, arg in enumerate(argv):
        if arg == HELP_ALL:
            return ALL, argv[:i] + argv[i + 1 :]
        if arg.startswith("--help="):
            return arg.partition("=")[2], argv[:i] + argv[i + 1 :]
        if arg in HELP_FLAGS:
            topic = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith(("-", "@")) else ""
            return topic, argv[:i] + argv[i + 1 + bool(topic) :]
    return None, argv


def chooser_of(cfg: BaseModel | None) -> Chooser | None:
    """The variants a resolved config chose, by the dotted path of their union section (nested ones too)."""
    if cfg is None:
        return None

    def chosen(path: str) -> str | None:
        *parents, leaf = path.split(".")
        node: object = cfg
        for part in parents:
            node = getattr(node, part, None)
        field = type(node).model_fields.get(leaf) if isinstance(node, BaseModel) else None
        union = variants(field) if field is not None else None
        value = getattr(node, leaf, None)
        return str(getattr(value, union[0])) if union is not None and value is not None else None

    return chosen


def _line(k: Knob) -> str:
    return f"  --{k.key}  {k.type_name}  default={k.shown_default}  {k.description}".rstrip()


def _grouped(items: list[Knob]) -> list[str]:
    """`[section]` headers (the key's parent; 'general' at the top level), then their knobs."""
    out: list[str] = []
    current = None
    for k in items:
        group = k.key.rpartition(".")[0] or "general"
        if group != current:
            out += ["", f"[{group}]"]
            current = group
        out.append(_line(k))
    return out


def _sections(model_cls: type[BaseModel], all_knobs: list[Knob]) -> list[str]:
    """One line per section: its name, how many keys it has, its description."""
    out = []
    for name, field in model_cls.model_fields.items():
        if section_model(field.annotation) is None and variants(field) is None:
            continue
        count = sum(1 for k in all_knobs if k.key.startswith(f"{name}."))
        out.append(f"  {name:<13} {count:>3} keys  {field.description or ''}".rstrip())
    return out


def _in_topic(key: str, topic: str) -> bool:
    return key.startswith(f"{topic}.")


def _unknown_topic(topic: str, all_knobs: list[Knob], prog: str) -> ConfigError:
    names = sorted({k.key.rsplit(".", 1)[0] for k in all_knobs if "." in k.key})
    close = difflib.get_close_matches(topic, names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    tops = sorted({n.split(".")[0] for n in names})
    return ConfigError(f"--help {topic}: no such section.{hint} Sections: {', '.join(tops)}; `thermik {prog} --help`")


def format_help(model_cls: type[BaseModel], topic: str = ALL, chosen: Chooser | None = None, prog: str = "CMD") -> str:
    """The help of `model_cls` for `topic` ('' the default, 'all' every key, else a section's dotted name); union
    sections show the variant `chosen` picks."""
    all_knobs = list(knobs(model_cls, chosen=chosen or (lambda _path: None)))
    doc = (model_cls.__doc__ or model_cls.__name__).strip().splitlines()[0]
    parts = [
        doc,
        "",
        "Usage: [@ FILE.toml ...] [--section.key VALUE ...]   (precedence: defaults < files < "
        f"{ENV_PREFIX}SECTION__KEY env < flags)",
    ]
    keep: Callable[[Knob], bool]
    if topic == ALL:
        keep = lambda _k: True  # noqa: E731
    elif topic:
        keep = lambda k: _in_topic(k.key, topic)  # noqa: E731
        if not any(keep(k) for k in all_knobs):
            raise _unknown_topic(topic, all_knobs, prog)
    else:
        keep = lambda k: "." not in k.key or k.key.split(".")[0] in COMMON_SECTIONS  # noqa: E731
    parts += _grouped([k for k in all_knobs if keep(k)])
    if not topic:
        parts += [
            "",
            f"Sections (`thermik {prog} --help SECTION` lists one, `--help-all` every key):",
            *_sections(model_cls, all_knobs),
        ]
    return "\n".join(parts) + "\n"
