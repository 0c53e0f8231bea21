"""Fused float32 / bfloat16 CPU kernels, compiled on first use: the embedded engine's decode step (csrc/decode.c),
the vocabulary-sized logprob work shared by the trainer and the engine (csrc/vocab.c, `VocabKernels`), the training
forward's RMSNorm, RoPE and SwiGLU gate (csrc/train.c, `TrainKernels`) and the weight-checksum guard's hash
(csrc/checksum.c, `ChecksumKernels`).

A decode step of a small model on CPU spends more time dispatching ~20 small PyTorch ops per layer than in
its matrix products. `csrc/decode.c` does the elementwise work of a layer (RMSNorm, RoPE + KV-cache
store) in three serial C calls, the way vLLM's CPU backend ships its own kernels. It is built with the system C
compiler (`cc -O3 -march=native`, or the simulated level's target: cpu/isa.py; about a second) into
~/.cache/thermik/kernels, keyed by the source, the flags and this machine's CPU, and loaded with ctypes (no PyTorch
headers: nothing slow to build).

`load()` / `load_vocab()` return None, after one warning, when no compiler is found or the build fails; the
callers then use their pure-PyTorch paths. THERMIK_CPU_KERNELS=0 turns the kernels off. The kernels split rows
over torch's thread count with OpenMP, on torch's own OpenMP runtime (csrc/common.h says why).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import warnings
from functools import cache
from pathlib import Path
from typing import ClassVar, TypeVar

import torch
from torch import Tensor

from thermik.cpu.isa import capabilities

KERNELS = Path(__file__).with_name("csrc")  # the C sources
MAX_HEAD_DIM = 1024  # rope_head's stack buffer in decode.c
MAX_GROUP_DIM = 4096  # query heads per KV head * head_dim: the bfloat16 attention's stack buffer
MAX_SAMPLE_VOCAB = 4096 * 256  # vocab.c's sampler keeps a row's 256-token block masses on the stack
# Not -ffast-math: a library linked with it turns on flush-to-zero for the whole process (denormals read as 0).
# Reassociation alone lets the sums vectorize.
# The target (-march) comes from cpu/isa.py: native, or the simulated level's (x86-64-v3 for avx2).
FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros", "-fPIC", "-shared")
OPENMP = "-fopenmp"  # dropped when the compiler lacks it: the kernels then run on the calling thread
_F, _I, _P = ctypes.c_float, ctypes.c_int64, ctypes.c_void_p
_Binding = TypeVar("_Binding")


def _cpu_signature() -> str:
    """The CPU model and flags: a library built with -march=native must not be loaded on another CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keep = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(keep)))


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "thermik" / "kernels"


def build(source: Path, library: Path, march: tuple[str, ...], compiler: str | None = None) -> None:
    """Compile `source` into the shared library `library` for the target `march` (with OpenMP where the compiler
    has it). `compiler` defaults to $CC, cc or gcc; a cross compiler builds for another architecture."""
    compiler = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    library.parent.mkdir(parents=True, exist_ok=True)
    partial = library.with_name(f"{library.name}.{os.getpid()}.tmp")
    for flags in ((*FLAGS, *march, OPENMP), (*FLAGS, *march)):
        result = subprocess.run(
            [compiler, *flags, str(source), "-o", str(partial), "-lm"], capture_output=True, text=True
        )
        if result.returncode == 0:
            partial.replace(library)  # atomic: a concurrent process sees the whole library or none
            return
    partial.unlink(missing_ok=True)
    raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:500]}")


DTYPES = (torch.float32, torch.bfloat16)  # the element types decode.c has kernels for
MIN_PARALLEL_ROWS = 8  # a decode attention over fewer rows runs on the calling thread


def _threads(rows: int) -> int:
    """torch's thread count for a kernel over `rows` rows (one thread for a handful of rows)."""
    return max(1, torch.get_num_threads()) if rows >= MIN_PARALLEL_ROWS else 1


class DecodeKernels:
    """ctypes bindings of kernels/decode.c. Tensor arguments are contiguous CPU tensors of one element type from
    DTYPES (positions and slots int64; the cos/sin tables float32 for both types)."""

    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))
        self._rms_norm: dict[torch.dtype, ctypes._CFuncPtr] = {}
        self._rope_store: dict[torch.dtype, ctypes._CFuncPtr] = {}
        for dtype, suffix in zip(DTYPES, ("", "_bf16"), strict=True):
            rms, rope = getattr(lib, f"thermik_rms_norm{suffix}"), getattr(lib, f"thermik_rope_store{suffix}")
            rms.argtypes = [_P, _P, _P, _I, _I, _F]
            rope.argtypes = [_P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _F, _P, _P, _I, _P, _F]
            rms.restype = rope.restype = None
            self._rms_norm[dtype], self._rope_store[dtype] = rms, rope
        self._attention: dict[torch.dtype, ctypes._CFuncPtr] = {}
        for dtype, suffix in zip(DTYPES, ("", "_bf16"), strict=True):
            attention = getattr(lib, f"thermik_decode_attention{suffix}")
            attention.argtypes = [_P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _P, _I]
            attention.restype = None
            self._attention[dtype] = attention
        self._lib = lib

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm over the last dim of a contiguous [rows, dim] tensor."""
        out = torch.empty_like(x)
        self._rms_norm[x.dtype](x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out

    def rope_store(
        self,
        qkv: Tensor,
        shape: tuple[int, int, int],
        tables: tuple[Tensor, Tensor],
        positions: Tensor,
        slots: Tensor,
        norms: tuple[Tensor | None, Tensor | None, float],
        cache: tuple[Tensor, Tensor],
        q_scale: float,
    ) -> Tensor:
        """RoPE (after Qwen3's optional q/k norms) on qkv [B, (H + 2 KV) * D]; keys and values go to the layer's
        caches at (slots[b], :, positions[b]); returns the queries [B, H, D], scaled by q_scale."""
        heads, kv_heads, dim = shape
        (cos, sin), (q_norm, k_norm, eps), (keys, values) = tables, norms, cache
        q = torch.empty(qkv.shape[0], heads, dim, dtype=qkv.dtype)
        self._rope_store[qkv.dtype](
            qkv.data_ptr(),
            qkv.shape[0],
            heads,
            kv_heads,
            dim,
            cos.data_ptr(),
            sin.data_ptr(),
            positions.data_ptr(),
            slots.data_ptr(),
            None if q_norm is None else q_norm.data_ptr(),
            None if k_norm is None else k_norm.data_ptr(),
            eps,
            keys.data_ptr(),
            values.data_ptr(),
            keys.shape[2],
            q.data_ptr(),
            q_scale,
        )
        return q

    def decode_attention(self, q: Tensor, cache: tuple[Tensor, Tensor], slots: Tensor, lengths: Tensor) -> Tensor:
        """Attention of one decode step: queries q [B, H, D] over the first lengths[b] positions of cache slot
        slots[b] (caches [slots, KV, max_len, D], q's dtype), scores, softmax and sums in float32; returns [B, H, D]."""
        keys, values = cache
        batch, heads, dim = q.shape
        kv_heads, max_len = keys.shape[1], keys.shape[2]
        group = heads // kv_heads
        threads = _threads(batch)
        scratch = torch.empty(threads, group * (max_len + dim), dtype=torch.float32)
        out = torch.empty_like(q)
        self._attention[q.dtype](
            q.data_ptr(), keys.data_ptr(), values.data_ptr(), slots.data_ptr(), lengths.data_ptr(), batch, kv_heads,
            group, dim, max_len, scratch.data_ptr(), out.data_ptr(), threads,
        )  # fmt: skip
        return out


class VocabKernels:
    """ctypes bindings of kernels/vocab.c (token logprobs and entropy over a vocabulary row, forward and backward;
    training/vocab_logprobs.py, the engine's `sampling.token_logprobs`). Rows are [B, T, V] tensors with contiguous
    vocabulary entries; each call splits them over torch's thread count."""

    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))
        self.forward_fns, self.backward_fns, self.sample_fns = {}, {}, {}
        for dtype, suffix in zip(DTYPES, ("f32", "bf16"), strict=True):
            fwd, bwd = getattr(lib, f"thermik_vocab_forward_{suffix}"), getattr(lib, f"thermik_vocab_backward_{suffix}")
            fwd.argtypes = [_P, _I, _I, _I, _I, _I, _P, _F, _P, _P, _P, _I]
            bwd.argtypes = [_P, _I, _I, _I, _I, _I, _P, _F, _P, _P, _P, _P, _P, _I, _I, _I]
            fwd.restype = bwd.restype = None
            self.forward_fns[dtype], self.backward_fns[dtype] = fwd, bwd
            self.sample_fns[dtype] = sample = getattr(lib, f"thermik_sample_{suffix}")
            sample.argtypes, sample.restype = [_P, _I, _I, _I, _F, _P, _P, _P, _I], None

    def forward(self, logits: Tensor, targets: Tensor, inv_temp: float, out: tuple[Tensor, Tensor, Tensor]) -> None:
        """(logp, entropy, log-normaliser) [B, T] float32 into `out` for logits [B, L >= T, V] * inv_temp (targets and
        `out` contiguous)."""
        batch, length = targets.shape
        self.forward_fns[logits.dtype](
            logits.data_ptr(), batch, length, logits.stride(0), logits.stride(1), logits.shape[-1], targets.data_ptr(),
            inv_temp, *(x.data_ptr() for x in out), _threads(batch * length),
        )  # fmt: skip

    def backward(
        self, saved: tuple[Tensor, ...], inv_temp: float, grads: tuple[Tensor, Tensor | None], out: Tensor
    ) -> None:
        """The gradient for logits [B, T] rows into `out`, from (logits, targets, lse, entropy) and the output
        gradients (d logp, d entropy or None; contiguous)."""
        logits, targets, lse, entropy = saved
        batch, length = targets.shape
        self.backward_fns[logits.dtype](
            logits.data_ptr(), batch, length, logits.stride(0), logits.stride(1), logits.shape[-1], targets.data_ptr(),
            inv_temp, *(None if x is None else x.data_ptr() for x in (lse, entropy, *grads)), out.data_ptr(),
            out.stride(0), out.stride(1), _threads(batch * length),
        )  # fmt: skip

    def sample(self, logits: Tensor, inv_temp: float, uniforms: Tensor) -> tuple[Tensor, Tensor]:
        """(token ids [B] int64, their logprobs [B] float32) from softmax(logits [B, V] * inv_temp), one float64
        uniform [B] per row (sampling.py's two-level inverse CDF)."""
        rows, vocab = logits.shape
        ids, logp = torch.empty(rows, dtype=torch.long), torch.empty(rows, dtype=torch.float32)
        self.sample_fns[logits.dtype](
            logits.data_ptr(), rows, logits.stride(0), vocab, inv_temp, uniforms.data_ptr(), ids.data_ptr(),
            logp.data_ptr(), _threads(rows),
        )  # fmt: skip
        return ids, logp


class ChecksumKernels:
    """ctypes bindings of kernels/checksum.c: assembly/guards.py's weight checksum in one pass, no copies."""

    READS: ClassVar[dict[tuple[torch.dtype, torch.dtype], str]] = {  # (tensor dtype, checksummed as) -> kernel
        (torch.float32, torch.float32): "i32",
        (torch.int32, torch.int32): "i32",
        (torch.bfloat16, torch.bfloat16): "i16",
        (torch.float16, torch.float16): "i16",
        (torch.int16, torch.int16): "i16",
        (torch.float32, torch.bfloat16): "f32_as_bf16",
    }

    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))
        self._fns = {}
        for name in set(self.READS.values()):
            self._fns[name] = fn = getattr(lib, f"thermik_checksum_{name}")
            fn.argtypes, fn.restype = [_P, _I, _I, _I, _I], ctypes.c_int64

    def __call__(self, tensor: Tensor, dtype: torch.dtype) -> int | None:
        """The wrapping 32-bit sum (as a signed int) for a CPU `tensor` read as `dtype`, or None where the caller
        must run its PyTorch path (another pair of types, a layout other than contiguous or rows of contiguous
        elements, a NaN rounded to bfloat16). The sum is order-independent, so a transposed matrix is read as its
        transpose: the engine's projections are column slices of fused weights."""
        kernel = self.READS.get((tensor.dtype, dtype))
        if kernel is None or tensor.device.type != "cpu":
            return None
        if tensor.dim() == 2 and tensor.stride(0) == 1 and tensor.shape[0] > 1:
            tensor = tensor.t()
        if tensor.is_contiguous():
            rows, cols, stride = 1, tensor.numel(), tensor.numel()
        elif tensor.dim() == 2 and tensor.stride(1) == 1:
            (rows, cols), stride = tensor.shape, tensor.stride(0)
        else:
            return None
        threads = max(1, torch.get_num_threads()) if rows * cols >= 1 << 16 else 1
        total = self._fns[kernel](tensor.data_ptr(), rows, cols, stride, threads)
        return None if total < 0 else total - (1 << 32) if total >= 1 << 31 else total


class TrainKernels:
    """ctypes bindings of kernels/train.c, the training forward's fused elementwise ops (training/fused_ops.py):
    RMSNorm (float32 rows in, float32 or bfloat16 out), RoPE and SwiGLU's gate, each with its backward. Tensors are
    contiguous CPU tensors; rows split over torch's threads."""

    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))
        self.fns: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}
        argtypes = {
            "rms_norm_forward": [_P, _P, _I, _I, _F, _P, _P, _I],
            "rms_norm_backward": [_P, _P, _P, _P, _I, _I, _P, _P, _P, _I],
            "rope_forward": [_P, _I, _I, _I, _I, _P, _P, _P, _I],
            "rope_backward": [_P, _I, _I, _I, _I, _P, _P, _P, _I],
            "swiglu_forward": [_P, _P, _I, _P, _I],
            "swiglu_backward": [_P, _P, _P, _I, _P, _P, _I],
        }
        for dtype, suffix in zip(DTYPES, ("f32", "bf16"), strict=True):
            for name, args in argtypes.items():
                self.fns[name, dtype] = fn = getattr(lib, f"thermik_{name}_{suffix}")
                fn.argtypes, fn.restype = args, None

    def rms_norm_forward(self, x: Tensor, weight: Tensor, eps: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(x * rstd * weight in `dtype`, rstd [rows] float32) for float32 x [..., dim]."""
        dim = x.shape[-1]
        rows = x.numel() // dim
        out = torch.empty(x.shape, dtype=dtype)
        rstd = torch.empty(rows, dtype=torch.float32)
        self.fns["rms_norm_forward", dtype](
            x.data_ptr(), weight.data_ptr(), rows, dim, eps, out.data_ptr(), rstd.data_ptr(), _threads(rows)
        )
        return out, rstd

    def rms_norm_backward(
        self, x: Tensor, weight: Tensor, rstd: Tensor, grad: Tensor, grad_weight: Tensor | None
    ) -> Tensor:
        """dL/dx (float32, x's shape) for output gradient `grad`; dL/dweight is added into `grad_weight` (float32
        [dim]) unless it is None."""
        dim = x.shape[-1]
        rows = x.numel() // dim
        threads = _threads(rows)
        grad_x = torch.empty(x.shape, dtype=torch.float32)
        partial = torch.empty(threads * dim, dtype=torch.float32)
        self.fns["rms_norm_backward", grad.dtype](
            x.data_ptr(), weight.data_ptr(), rstd.data_ptr(), grad.data_ptr(), rows, dim, grad_x.data_ptr(),
            None if grad_weight is None else grad_weight.data_ptr(), partial.data_ptr(), threads,
        )  # fmt: skip
        return grad_x

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor, backward: bool = False) -> Tensor:
        """Forward: x [B, T, heads, dim] rotated by the float32 tables [B, T, dim] into [B, heads, T, dim].
        Backward: the gradient [B, heads, T, dim] of that output into the gradient [B, T, heads, dim] of x."""
        if backward:
            batch, heads, length, dim = x.shape
            out = torch.empty(batch, length, heads, dim, dtype=x.dtype)
        else:
            batch, length, heads, dim = x.shape
            out = torch.empty(batch, heads, length, dim, dtype=x.dtype)
        self.fns["rope_backward" if backward else "rope_forward", x.dtype](
            x.data_ptr(), batch, length, heads, dim, cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
            _threads(batch * length),
        )  # fmt: skip
        return out

    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        """silu(gate) * up, elementwise (same shapes and dtype; threads split by rows of the last dimension)."""
        out = torch.empty_like(gate)
        n = gate.numel()
        threads = _threads(n // gate.shape[-1])
        self.fns["swiglu_forward", gate.dtype](gate.data_ptr(), up.data_ptr(), n, out.data_ptr(), threads)
        return out

    def swiglu_backward(self, gate: Tensor, up: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """(dL/dgate, dL/dup) of silu(gate) * up for its gradient `grad`."""
        grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        self.fns["swiglu_backward", gate.dtype](
            gate.data_ptr(), up.data_ptr(), grad.data_ptr(), n, grad_gate.data_ptr(), grad_up.data_ptr(),
            _threads(n // gate.shape[-1]),
        )  # fmt: skip
        return grad_gate, grad_up


def compiled(name: str) -> Path:
    """The shared library of kernels/`name`.c (with common.h), built on first use for this CPU and cached."""
    source = KERNELS / f"{name}.c"
    code = source.read_bytes() + (KERNELS / "common.h").read_bytes()
    march = capabilities().march
    signature = " ".join((*FLAGS, *march, OPENMP, _cpu_signature(), platform.machine())).encode()
    library = _cache_dir() / f"{name}-{hashlib.sha256(code + signature).hexdigest()[:16]}.so"
    if not library.is_file():
        build(source, library, march)
    return library


def kernels_enabled() -> bool:
    return os.environ.get("THERMIK_CPU_KERNELS", "1") != "0"


@cache
def load() -> DecodeKernels | None:
    """The compiled kernels, or None (warned once) where they cannot be built or are turned off."""
    if not kernels_enabled():
        return None
    try:
        return DecodeKernels(compiled("decode"))
    except (OSError, RuntimeError) as exc:
        warnings.warn(
            f"thermik CPU decode kernels unavailable ({exc}); the embedded engine uses its PyTorch path "
            "(slower decode). Install a C compiler (gcc) to enable them.",
            stacklevel=2,
        )
        return None


def vocab_kernels_for(logits: Tensor) -> VocabKernels | None:
    """The vocabulary kernels where they can read `logits` in place (CPU, float32 or bfloat16, contiguous vocabulary
    entries, kernels on), else None: the caller runs its PyTorch path."""
    usable = logits.device.type == "cpu" and logits.dtype in DTYPES and logits.stride(-1) == 1
    return load_vocab() if usable and kernels_enabled() else None


def _bind(name: str, binding: type[_Binding]) -> _Binding | None:
    """kernels/`name`.c built and bound, or None after a warning where it cannot be built."""
    try:
        return binding(compiled(name))
    except (OSError, RuntimeError) as exc:
        warnings.warn(f"thermik {name} kernels unavailable ({exc}); the PyTorch path runs", stacklevel=3)
        return None


@cache
def load_vocab() -> VocabKernels | None:
    """The vocabulary kernels, or None (warned once) where they cannot be built. Callers check `kernels_enabled()`
    per call (THERMIK_CPU_KERNELS=0 selects their PyTorch path)."""
    return _bind("vocab", VocabKernels)


@cache
def load_train() -> TrainKernels | None:
    """The training forward's kernels, or None (warned once) where they cannot be built; callers check
    `kernels_enabled()`."""
    return _bind("train", TrainKernels)


@cache
def load_checksum() -> ChecksumKernels | None:
    """The checksum kernels, or None (warned once) where they cannot be built; callers check `kernels_enabled()`."""
    return _bind("checksum", ChecksumKernels)
