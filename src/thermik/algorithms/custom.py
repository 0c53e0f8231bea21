"""A user's policy loss, loaded from an import path "package.module:function" named in the config."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

LOSS_ARGS = ("logp", "old_logp", "adv", "mask", "params", "reduce")


@dataclass(frozen=True)
class CustomParams:
    """What a user's loss receives as `params`: the numbers of `algorithm.loss.options`, by name."""

    options: Mapping[str, float] = field(default_factory=dict)


def load_custom_loss(path: str) -> Callable[..., Any]:
    """Import `path` ("pkg.mod:fn") and check it takes the six policy-loss arguments.

    The function must accept (logp, old_logp, adv, mask, params, reduce) positionally and return
    (scalar loss, metrics dict); see `thermik.algorithms.losses`.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"custom loss {path!r}: expected 'package.module:function' (set algorithm.loss.path)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"custom loss {path!r}: cannot import module {module_name!r}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ValueError(f"custom loss {path!r}: module {module_name!r} has no callable {attr!r}")
    try:
        inspect.signature(fn).bind(*LOSS_ARGS)
    except TypeError as e:
        raise ValueError(
            f"custom loss {path!r}: must accept ({', '.join(LOSS_ARGS)}) and return (loss, metrics); {e}"
        ) from e
    except ValueError:  # builtins without a signature: trust them
        pass
    return fn
