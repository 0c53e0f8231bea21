/* Shared by thermik's CPU kernels (decode.c, vocab.c): bfloat16 loads and stores, a vectorizable e^x, and OpenMP.
 *
 * The kernels split their rows over threads with OpenMP, built with -fopenmp and linked by soname against
 * libgomp.so.1: in a process that imported torch first, that is torch's own runtime (one OpenMP runtime, one
 * thread team), so the kernels run on the same workers that just ran torch's matmuls. A Python thread pool there
 * fought those workers, still spinning after the matmul, for the cores (2x slower decode attention on 2 cores).
 * Built without OpenMP, the pragmas are ignored and every kernel runs on the calling thread. */
#ifndef THERMIK_KERNELS_COMMON_H
#define THERMIK_KERNELS_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
#endif

typedef uint16_t bf16;

static inline float bf16_load(bf16 v) {
    uint32_t bits = (uint32_t)v << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* Round to nearest, ties to even (what torch's .to(torch.bfloat16) does); NaN stays a quiet NaN. */
static inline bf16 bf16_store(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (bf16)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (bf16)(bits >> 16);
}

static inline float f32_load(float v) { return v; }
static inline float f32_store(float v) { return v; }

/* e^x for x <= 0 (Cephes' expf: Cody-Waite range reduction and a degree-6 polynomial, within 2 ulp): unlike libm's
 * expf it vectorizes. x below -87 (e^x < 1.7e-38, below float32's normal range; -inf included) gives 0, so a token
 * masked to -inf has no mass at all. */
static inline float exp_nonpositive(float in) {
    float x = in < -87.0f ? -87.0f : in;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return in < -87.0f ? 0.0f : p * scale;
}

#endif
