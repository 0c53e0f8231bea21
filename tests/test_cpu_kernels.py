"""The fused CPU decode kernels (cpu/kernels.py) and the OpenMP pool hand-off (cpu/openmp.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading

import pytest
import torch
import torch.nn.functional as F
from test_embedded_engine import tiny_model

from thermik.cpu import kernels as cpu_kernels
from thermik.cpu.openmp import release_thread_pool, to_thread_releasing
from thermik.inference.native_model import NativeCausalLM
from thermik.inference.sampling import process_logits

kernels = cpu_kernels.load()
needs_kernels = pytest.mark.skipif(kernels is None, reason="no C compiler: the decode kernels could not be built")


@needs_kernels
def test_rms_norm_kernel_matches_torch() -> None:
    x, w = torch.randn(5, 48), torch.randn(48)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6), F.rms_norm(x, (48,), w, 1e-6), atol=1e-6, rtol=1e-5)


@needs_kernels
def test_rope_store_matches_hf_rotate_half_and_writes_the_cache_rows() -> None:
    batch, heads, kv_heads, dim = 3, 4, 2, 8
    qkv = torch.randn(batch, (heads + 2 * kv_heads) * dim)
    angles = torch.randn(20, dim)
    cos, sin = angles.cos(), angles.sin()
    positions, slots = torch.tensor([5, 2, 7]), torch.tensor([2, 0, 3])
    keys, values = torch.zeros(4, kv_heads, 16, dim), torch.zeros(4, kv_heads, 16, dim)
    q = kernels.rope_store(
        qkv, (heads, kv_heads, dim), (cos, sin), positions, slots, (None, None, 0.0), (keys, values), 0.5
    )

    def rotate(x: torch.Tensor) -> torch.Tensor:  # HF's x * cos + rotate_half(x) * sin
        half = dim // 2
        c, s = cos[positions][:, None], sin[positions][:, None]
        return x * c + torch.cat((-x[..., half:], x[..., :half]), -1) * s

    q_ref, k_ref, v_ref = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    torch.testing.assert_close(q, rotate(q_ref.view(batch, heads, dim)) * 0.5)
    torch.testing.assert_close(keys[slots, :, positions], rotate(k_ref.view(batch, kv_heads, dim)))
    torch.testing.assert_close(values[slots, :, positions], v_ref.view(batch, kv_heads, dim))
    assert keys[1].abs().sum() == 0 and keys[2, :, :5].abs().sum() == 0  # nothing else written


@needs_kernels
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("dense", [True, False])
def test_fused_decode_step_equals_the_pytorch_path(arch: str, dense: bool) -> None:
    """Prefill, then two decode steps at ragged positions, with and without the kernels: same logits and cache."""
    native = NativeCausalLM(tiny_model(arch))
    assert native.kernels is not None
    batch = 4
    prompt = torch.randint(2, 300, (batch, 9), generator=torch.Generator().manual_seed(0))
    step = torch.randint(2, 300, (batch, 1), generator=torch.Generator().manual_seed(1))
    slots = slice(0, batch) if dense else torch.tensor([5, 1, 0, 3])
    starts = torch.tensor([9, 8, 6, 9])  # rows whose prompt was shorter continue earlier
    results = []
    for fused in (True, False):
        native.kernels = kernels if fused else None
        cache = native.new_cache(8, 32)
        zeros = torch.zeros(batch, dtype=torch.long)
        native.forward(prompt, slots, zeros, torch.full((batch,), 8), cache)
        first = native.forward(step, slots, starts, zeros, cache)
        second = native.forward(step + 1, slots, starts + 1, zeros, cache)
        results.append((first, second, torch.stack(cache.keys), torch.stack(cache.values)))
    for ours, reference in zip(*results, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


def test_kernels_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")
    assert cpu_kernels.load.__wrapped__() is None


def test_a_missing_compiler_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="decode kernels unavailable.*PyTorch path"):
        assert cpu_kernels.load.__wrapped__() is None


@needs_kernels
@pytest.mark.parametrize(("dim", "group"), [(12, 3), (64, 3), (64, 5), (64, 8), (128, 1), (128, 4), (40, 2)])
def test_float32_decode_attention_matches_pytorch_on_ragged_lengths(dim: int, group: int) -> None:
    """float32 queries over float32 caches: the AVX2 paths (head sizes that are multiples of 8, groups up to 8,
    keys in blocks of 8 plus a remainder) and the plain loops agree with PyTorch's softmax attention."""
    batch, kv_heads, max_len = 6, 2, 45
    gen = torch.Generator().manual_seed(dim * 10 + group)
    keys, values = (torch.randn(9, kv_heads, max_len, dim, generator=gen) for _ in range(2))
    q = torch.randn(batch, kv_heads * group, dim, generator=gen) * dim**-0.5
    slots, lengths = torch.tensor([3, 0, 7, 1, 5, 8]), torch.tensor([45, 1, 17, 8, 9, 31])
    out = kernels.decode_attention(q, (keys, values), slots, lengths)
    for b in range(batch):
        k, v = keys[slots[b], :, : lengths[b]], values[slots[b], :, : lengths[b]]
        ref = ((q[b].view(kv_heads, group, dim) @ k.transpose(1, 2)).softmax(-1) @ v).reshape(kv_heads * group, dim)
        torch.testing.assert_close(out[b], ref, atol=1e-5, rtol=1e-5)


def _attention_inputs(batch: int = 16) -> tuple:
    g = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(batch + 2, 2, 40, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(batch, 6, 64, generator=g).to(torch.bfloat16)
    return (
        q,
        (keys, values),
        torch.randperm(batch + 2, generator=g)[:batch],
        torch.randint(1, 41, (batch,), generator=g),
    )


@needs_kernels
@pytest.mark.skipif(not os.path.isfile("/proc/self/maps"), reason="needs /proc to list the loaded libraries")
def test_kernels_run_on_torchs_own_openmp_runtime() -> None:
    """Built with OpenMP, the kernels bind to the runtime torch loaded: one libgomp in the process, so their
    threads are torch's workers (a second runtime would fight them for the cores)."""
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line or "libomp" in line}
    library = {line.split()[-1] for line in maps if "decode-" in line and line.endswith(".so")}
    assert library, "the decode kernels library is not mapped"
    assert len(runtimes) <= 1, runtimes


@needs_kernels
def test_kernels_build_and_agree_without_openmp(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike) -> None:
    """A compiler without OpenMP still builds the kernels (serial); they compute the same attention."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "OPENMP", "-fno-such-openmp-flag")
    serial = cpu_kernels.DecodeKernels(cpu_kernels.compiled("decode"))
    inputs = _attention_inputs()
    assert torch.equal(serial.decode_attention(*inputs), kernels.decode_attention(*inputs))


@needs_kernels
def test_decode_attention_is_the_same_on_any_thread_count() -> None:
    inputs, threads = _attention_inputs(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.decode_attention(*inputs)
        torch.set_num_threads(2)
        assert torch.equal(kernels.decode_attention(*inputs), one)
    finally:
        torch.set_num_threads(threads)


def test_the_pytorch_path_runs_without_kernels() -> None:
    native = NativeCausalLM(tiny_model("qwen2"))
    native.kernels = None
    cache = native.new_cache(2, 16)
    tokens = torch.tensor([[3], [4]])
    logits = native.forward(tokens, slice(0, 2), torch.tensor([0, 0]), torch.zeros(2, dtype=torch.long), cache)
    assert logits.shape == (2, 300) and torch.isfinite(logits).all()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc to count threads")
def test_release_thread_pool_ends_the_callers_openmp_workers() -> None:
    """A thread that ran a parallel op owns OpenMP workers; releasing ends them, and torch still works after."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: torch runs no OpenMP workers to release")
    a, big = torch.randn(512, 512), torch.randn(1 << 22)
    counts: dict[str, int] = {}
    threads = torch.get_num_threads()  # other tests may have left torch at one thread
    torch.set_num_threads(2)

    def worker() -> None:  # a fresh thread, so no other test's pool is involved
        # at::parallel_for runs on OpenMP on every CPU; a BLAS product alone may not (it depends on the CPU's BLAS path)
        a @ a, big.exp()
        counts["with pool"] = _threads()
        assert release_thread_pool()
        counts["released"] = _threads()
        torch.testing.assert_close(a @ torch.eye(512), a)  # a new pool serves the next op

    thread = threading.Thread(target=worker)
    try:
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(threads)
    assert counts["released"] < counts["with pool"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc to count threads")
def test_to_thread_releasing_leaves_no_openmp_workers_behind() -> None:
    """Work run through `to_thread_releasing` (the policy update, weight updates) leaves its worker thread without
    an OpenMP pool; the same work through plain `asyncio.to_thread` leaves one (what slowed the engine's decode
    steps after the first update)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: torch runs no OpenMP workers to release")
    a, big = torch.randn(512, 512), torch.randn(1 << 22)
    threads = torch.get_num_threads()

    def product() -> torch.Tensor:
        torch.set_num_threads(2)  # per thread: this worker's ops run on a pool of two
        big.exp()  # at::parallel_for: an OpenMP pool on every CPU, whatever the BLAS does
        return a @ a

    async def counts() -> tuple[torch.Tensor, int, int, int]:
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
        await asyncio.to_thread(_threads)  # the executor's one worker exists from here on
        release_thread_pool()  # this thread's own pool (earlier tests' ops) is not what is counted
        idle = _threads()
        out = await to_thread_releasing(product)
        released = _threads()
        await asyncio.to_thread(product)
        return out, idle, released, _threads()

    expected = a @ a
    try:
        out, idle, released, kept = asyncio.run(counts())
    finally:
        torch.set_num_threads(threads)
    assert released == idle < kept
    torch.testing.assert_close(out, expected)


def test_plain_sampling_settings_skip_the_filters_and_still_validate() -> None:
    logits = torch.randn(3, 7)
    per_row = process_logits(logits, torch.full((3,), 0.7), torch.zeros(3), torch.ones(3), torch.zeros(3))
    torch.testing.assert_close(process_logits(logits, 0.7), per_row)
    assert process_logits(logits, 1.0) is not logits  # a new tensor, as documented
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        process_logits(logits, -1.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        process_logits(logits, 1.0, 0, 0.0)


@needs_kernels
def test_fused_decode_refuses_positions_or_slots_outside_the_cache() -> None:
    native = NativeCausalLM(tiny_model("qwen2"))
    cache = native.new_cache(2, 16)
    token, zero = torch.tensor([[3]]), torch.zeros(1, dtype=torch.long)
    with pytest.raises(IndexError, match="outside the KV cache"):
        native.forward(token, torch.tensor([0]), torch.tensor([16]), zero, cache)
    with pytest.raises(IndexError, match="outside the KV cache"):
        native.forward(token, torch.tensor([2]), torch.tensor([0]), zero, cache)
