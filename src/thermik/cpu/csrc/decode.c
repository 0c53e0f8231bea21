/* Fused CPU kernels for one decode step (one new token per sequence) of a Qwen2/Qwen3/Llama-shaped model.
 *
 * Each call replaces several small PyTorch ops, whose per-op dispatch and threading overhead dominates a
 * decode step of a small model on CPU. The kernels are serial; the matrix products stay in PyTorch (BLAS,
 * oneDNN). Two element types: float32 (`thermik_*`) and bfloat16 (`thermik_*_bf16`, raw uint16 bit patterns,
 * every sum and product in float32, one rounding to bfloat16 where the value is stored). Built and loaded by
 * thermik/cpu/kernels.py.
 */
#include "common.h"

/* RMSNorm (Zhang & Sennrich 2019) of `rows` rows of `dim` values, as HF computes it: the sum of squares in
 * float32, x * rsqrt(mean + eps) rounded to the element type, then times the weight (rounded again). */
#define DEFINE_RMS_NORM(NAME, T, LOAD, STORE)                                                                  \
    void NAME(const T *x, const T *w, T *out, int64_t rows, int64_t dim, float eps) {                       \
        for (int64_t r = 0; r < rows; r++) {                                                                \
            const T *xr = x + r * dim;                                                                      \
            T *o = out + r * dim;                                                                           \
            float sum = 0.0f;                                                                               \
            for (int64_t i = 0; i < dim; i++) sum += LOAD(xr[i]) * LOAD(xr[i]);                             \
            float inv = 1.0f / sqrtf(sum / (float)dim + eps);                                               \
            for (int64_t i = 0; i < dim; i++) o[i] = STORE(LOAD(w[i]) * LOAD(STORE(LOAD(xr[i]) * inv)));    \
        }                                                                                                   \
    }

/* Rotary embedding in the HF layout (rotate_half: the second half of the head pairs with the first), after an
 * optional per-head RMSNorm (Qwen3's q_norm / k_norm; `norm_w` NULL for none). Writes `dim` values to `out`.
 * cos/sin tables are float32 for both element types. */
#define DEFINE_ROPE_HEAD(NAME, RMS, T, LOAD, STORE)                                                            \
    static void NAME(const T *src, const T *norm_w, float eps, const float *cos_p, const float *sin_p,      \
                     int64_t dim, float scale, T *out) {                                                    \
        T buf[1024];                                                                                        \
        const T *x = src;                                                                                   \
        if (norm_w != NULL) {                                                                               \
            RMS(src, norm_w, buf, 1, dim, eps);                                                             \
            x = buf;                                                                                        \
        }                                                                                                   \
        int64_t half = dim / 2;                                                                             \
        for (int64_t i = 0; i < half; i++) {                                                                \
            float lo = LOAD(x[i]), hi = LOAD(x[i + half]);                                                  \
            out[i] = STORE((lo * cos_p[i] - hi * sin_p[i]) * scale);                                        \
            out[i + half] = STORE((hi * cos_p[i + half] + lo * sin_p[i + half]) * scale);                   \
        }                                                                                                   \
    }

/* One decode step's queries, keys and values. Row b of `qkv` is [q (heads*dim), k (kv_heads*dim), v
 * (kv_heads*dim)] for the token at position pos[b] of cache slot slot[b]. Queries get RoPE and `q_scale`
 * and go to q_out [B, heads, dim]; keys get RoPE and, like values, are stored in the caches
 * [slots, kv_heads, max_len, dim] at (slot[b], :, pos[b]). cos/sin tables are [positions, dim]. */
#define DEFINE_ROPE_STORE(NAME, HEAD, T)                                                                       \
    void NAME(const T *qkv, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim, const float *cos_tab, \
              const float *sin_tab, const int64_t *pos, const int64_t *slot, const T *q_norm_w,              \
              const T *k_norm_w, float eps, T *k_cache, T *v_cache, int64_t max_len, T *q_out, float q_scale) { \
        int64_t width = (heads + 2 * kv_heads) * dim;                                                       \
        for (int64_t b = 0; b < batch; b++) {                                                               \
            const T *row = qkv + b * width;                                                                 \
            const float *c = cos_tab + pos[b] * dim;                                                        \
            const float *s = sin_tab + pos[b] * dim;                                                        \
            for (int64_t h = 0; h < heads; h++)                                                             \
                HEAD(row + h * dim, q_norm_w, eps, c, s, dim, q_scale, q_out + (b * heads + h) * dim);      \
            for (int64_t h = 0; h < kv_heads; h++) {                                                        \
                int64_t at = ((slot[b] * kv_heads + h) * max_len + pos[b]) * dim;                           \
                HEAD(row + (heads + h) * dim, k_norm_w, eps, c, s, dim, 1.0f, k_cache + at);                \
                memcpy(v_cache + at, row + (heads + kv_heads + h) * dim, (size_t)dim * sizeof(T));          \
            }                                                                                               \
        }                                                                                                   \
    }

DEFINE_RMS_NORM(thermik_rms_norm, float, f32_load, f32_store)
DEFINE_ROPE_HEAD(rope_head, thermik_rms_norm, float, f32_load, f32_store)
DEFINE_ROPE_STORE(thermik_rope_store, rope_head, float)

DEFINE_RMS_NORM(thermik_rms_norm_bf16, bf16, bf16_load, bf16_store)
DEFINE_ROPE_HEAD(rope_head_bf16, thermik_rms_norm_bf16, bf16, bf16_load, bf16_store)
DEFINE_ROPE_STORE(thermik_rope_store_bf16, rope_head_bf16, bf16)

#ifdef __AVX512BF16__
#include <immintrin.h>

/* The lane sums of 16 vectors: lane j of the result is the sum of v[j]'s 16 lanes (a transpose-and-add tree: 45
 * shuffles and adds for 16 sums, against 4 steps of a horizontal sum each). */
static inline __m512 sum_lanes_16(const __m512 *v) {
    __m512 w[8], x[4];
    for (int j = 0; j < 8; j++)  /* per 128-bit chunk: [a0+a2, b0+b2, a1+a3, b1+b3] */
        w[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
    for (int j = 0; j < 4; j++)  /* per 128-bit chunk: the chunk's sums of v[4j .. 4j + 3] */
        x[j] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* scores[t] = q . keys[t] for the first multiple of 16 of the n keys (dim a multiple of 32), with AVX512-BF16's
 * bfloat16 pair products summed in float32 (the inputs are bfloat16 already: no rounding is added); returns how
 * many were done. */
static inline int64_t dot_keys_bf16(const bf16 *q, const bf16 *keys, int64_t n, int64_t dim, float *scores) {
    int64_t t0 = 0;
    for (; t0 + 16 <= n; t0 += 16) {
        __m512 v[16];
        for (int j = 0; j < 16; j++) {
            const bf16 *k = keys + (t0 + j) * dim;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < dim; i += 32)
                acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + i), (__m512bh)_mm512_loadu_si512(k + i));
            v[j] = acc;
        }
        _mm512_storeu_ps(scores + t0, sum_lanes_16(v));
    }
    return t0;
}

#endif

#if defined(__AVX2__) && defined(__FMA__)
#ifndef __AVX512BF16__
#include <immintrin.h>
#endif
#define THERMIK_DECODE_AVX2 1

/* Lane j of the result: the sum of v[j]'s 8 lanes. */
static inline __m256 sum_lanes_8(const __m256 *v) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* scores[t] = q . keys[t] for the first multiple of 8 of the n float32 keys (dim a multiple of 8), eight keys at a
 * time in eight independent accumulators; returns how many were done. */
static inline int64_t dot_keys_f32(const float *q, const float *keys, int64_t n, int64_t dim, float *scores) {
    int64_t t0 = 0;
    for (; t0 + 8 <= n; t0 += 8) {
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t i = 0; i < dim; i += 8) {
            __m256 qi = _mm256_loadu_ps(q + i);
            for (int j = 0; j < 8; j++)
                acc[j] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(keys + (t0 + j) * dim + i), acc[j]);
        }
        _mm256_storeu_ps(scores + t0, sum_lanes_8(acc));
    }
    return t0;
}

/* acc[g, :] = sum_t scores[g, t] values[t, :] for a float32 KV head (dim a multiple of 8, group <= 8), `chunks`
 * vectors of 8 columns per pass over the values: the group's sums stay in registers across the value rows. The first
 * pass prefetches each whole row a few rows ahead: the rows come from memory at batch 64 (a decode step reads every
 * row's cache once), and without it each pass waited for its half rows (SmolLM2, batch 64, 30 layers from memory:
 * 22.3 -> 18.8 ms). Returns the columns done (0: not these sizes). */
static inline __attribute__((always_inline)) int64_t weigh_values_f32(const int64_t group, const float *scores,
                                                                      int64_t stride, const float *values,
                                                                      int64_t n, int64_t dim, float *acc) {
    const int chunks = group <= 3 && dim % 32 == 0 ? 4 : group <= 7 && dim % 16 == 0 ? 2 : 1;
    if (dim % 8 != 0 || group > 8) return 0;
    for (int64_t c0 = 0; c0 < dim; c0 += 8 * chunks) {
        __m256 sums[8][4];
        for (int64_t g = 0; g < group; g++)
            for (int c = 0; c < chunks; c++) sums[g][c] = _mm256_setzero_ps();
        for (int64_t t = 0; t < n; t++) {
            if (c0 == 0 && t + 6 < n)
                for (int64_t i = 0; i < dim; i += 16)
                    _mm_prefetch((const char *)(values + (t + 6) * dim + i), _MM_HINT_T0);
            __m256 row[4];
            for (int c = 0; c < chunks; c++) row[c] = _mm256_loadu_ps(values + t * dim + c0 + 8 * c);
            for (int64_t g = 0; g < group; g++) {
                __m256 s = _mm256_broadcast_ss(scores + g * stride + t);
                for (int c = 0; c < chunks; c++) sums[g][c] = _mm256_fmadd_ps(s, row[c], sums[g][c]);
            }
        }
        for (int64_t g = 0; g < group; g++)
            for (int c = 0; c < chunks; c++) _mm256_storeu_ps(acc + g * dim + c0 + 8 * c, sums[g][c]);
    }
    return dim;
}
#define FAST_DOT_F32(q, qf, keys, n, dim, scores) ((dim) % 8 == 0 ? dot_keys_f32(qf, keys, n, dim, scores) : 0)
#define FAST_VALUES_F32(group, scores, stride, values, n, dim, acc) \
    weigh_values_f32(group, scores, stride, values, n, dim, acc)
#else
#define FAST_DOT_F32(q, qf, keys, n, dim, scores) 0
#define FAST_VALUES_F32(group, scores, stride, values, n, dim, acc) 0
#endif

/* The fast paths of attend_head: dot products of the first keys (FAST_DOT: how many it did) and the whole value
 * sum (FAST_VALUES: the columns it did, dim or 0). */
#ifdef __AVX512BF16__
#define FAST_DOT_BF16(q, qf, keys, n, dim, scores) ((dim) % 32 == 0 ? dot_keys_bf16(q, keys, n, dim, scores) : 0)
#else
#define FAST_DOT_BF16(q, qf, keys, n, dim, scores) 0
#endif
#define FAST_VALUES_NONE(group, scores, stride, values, n, dim, acc) 0

/* Softmax-weighted sum over the n cached rows of one KV head for its `group` queries q [group, dim] (element type
 * T, and qf: the same in float32) into acc [group, dim] (float32). Inlined with a constant `dim` and `group` for
 * the common sizes, so the loops unroll into full vectors. */
#define DEFINE_ATTEND_HEAD(NAME, T, LOAD, FAST_DOT, FAST_VALUES)                                                  \
    static inline __attribute__((always_inline)) void NAME(const T *q, const float *qf, const T *keys,        \
                                                           const T *values, int64_t n, int64_t group,           \
                                                           int64_t dim, int64_t stride, float *scores,          \
                                                           float *acc) {                                        \
        float row[1024];                                                                                        \
        (void)q;                                                                                                \
        for (int64_t g = 0; g < group; g++) {                                                                   \
            int64_t t = FAST_DOT(q + g * dim, qf + g * dim, keys, n, dim, scores + g * stride);                 \
            for (; t < n; t++) {                                                                                \
                float dot = 0.0f;                                                                               \
                for (int64_t i = 0; i < dim; i++) dot += qf[g * dim + i] * LOAD(keys[t * dim + i]);             \
                scores[g * stride + t] = dot;                                                                   \
            }                                                                                                   \
        }                                                                                                       \
        for (int64_t g = 0; g < group; g++) {                                                                   \
            float *s = scores + g * stride, top = -INFINITY, sum = 0.0f;                                        \
            for (int64_t t = 0; t < n; t++) top = s[t] > top ? s[t] : top;                                      \
            for (int64_t t = 0; t < n; t++) {                                                                   \
                s[t] = exp_nonpositive(s[t] - top);                                                             \
                sum += s[t];                                                                                    \
            }                                                                                                   \
            float inv = 1.0f / sum;                                                                             \
            for (int64_t t = 0; t < n; t++) s[t] *= inv;                                                        \
        }                                                                                                       \
        if (FAST_VALUES(group, scores, stride, values, n, dim, acc) == dim) return;                             \
        for (int64_t i = 0; i < group * dim; i++) acc[i] = 0.0f;                                                \
        for (int64_t t = 0; t < n; t++) {                                                                       \
            for (int64_t i = 0; i < dim; i++) row[i] = LOAD(values[t * dim + i]);                               \
            for (int64_t g = 0; g < group; g++)                                                                 \
                for (int64_t i = 0; i < dim; i++) acc[g * dim + i] += scores[g * stride + t] * row[i];          \
        }                                                                                                       \
    }
DEFINE_ATTEND_HEAD(attend_head_bf16, bf16, bf16_load, FAST_DOT_BF16, FAST_VALUES_NONE)
DEFINE_ATTEND_HEAD(attend_head_f32, float, f32_load, FAST_DOT_F32, FAST_VALUES_F32)

/* attend_head with a constant head size and, for the common GQA group sizes, a constant group: the group's
 * accumulators then stay in vector registers across the value rows (SmolLM2's 3 x 64, batch 64 at ~330 positions: 20.7
 * -> 19.3 ms per step in bfloat16, benchmarks/engine_step_sections.py). */
#define ATTEND(HEAD, G, D) HEAD(qb, qf, keys, values, len[b], G, D, max_len, scores, acc)
#define ATTEND_GROUPS(HEAD, D)             \
    switch (group) {                       \
        case 1: ATTEND(HEAD, 1, D); break; \
        case 2: ATTEND(HEAD, 2, D); break; \
        case 3: ATTEND(HEAD, 3, D); break; \
        case 4: ATTEND(HEAD, 4, D); break; \
        case 6: ATTEND(HEAD, 6, D); break; \
        case 8: ATTEND(HEAD, 8, D); break; \
        default: ATTEND(HEAD, group, D);   \
    }

/* Attention of one decode step, softmax and sums in float32, over `threads` OpenMP threads. Queries
 * q [B, kv_heads * group, dim] (RoPE'd and scaled; the heads of KV head h are h * group .. h * group + group - 1)
 * attend to the first len[b] positions of cache slot slot[b] (caches [slots, kv_heads, max_len, dim]); each key
 * and value row is read once for the whole query group. Writes out [B, kv_heads * group, dim]. `scratch` holds
 * group * (max_len + dim) floats per thread. Rows are independent: the result does not depend on `threads`.
 * Element types: bfloat16 (`thermik_decode_attention_bf16`) and float32 (`thermik_decode_attention`). */
#define DEFINE_DECODE_ATTENTION(NAME, T, HEAD, LOAD, STORE)                                                         \
    void NAME(const T *q, const T *k_cache, const T *v_cache, const int64_t *slot, const int64_t *len, int64_t rows, \
              int64_t kv_heads, int64_t group, int64_t dim, int64_t max_len, float *scratch, T *out,               \
              int64_t threads) {                                                                                  \
        _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 2)")                                     \
        for (int64_t b = 0; b < rows; b++) {                                                                      \
            float qf[4096];                                                                                       \
            float *scores = scratch + (int64_t)omp_get_thread_num() * group * (max_len + dim);                    \
            float *acc = scores + group * max_len;                                                                \
            for (int64_t h = 0; h < kv_heads; h++) {                                                              \
                const int64_t head0 = (b * kv_heads + h) * group, at = (slot[b] * kv_heads + h) * max_len * dim;  \
                for (int64_t i = 0; i < group * dim; i++) qf[i] = LOAD(q[head0 * dim + i]);                      \
                const T *qb = q + head0 * dim, *keys = k_cache + at, *values = v_cache + at;                      \
                if (dim == 64) {                                                                                  \
                    ATTEND_GROUPS(HEAD, 64)                                                                       \
                } else if (dim == 128) {                                                                          \
                    ATTEND_GROUPS(HEAD, 128)                                                                      \
                } else                                                                                            \
                    HEAD(qb, qf, keys, values, len[b], group, dim, max_len, scores, acc);                         \
                for (int64_t i = 0; i < group * dim; i++) out[head0 * dim + i] = STORE(acc[i]);                  \
            }                                                                                                     \
        }                                                                                                         \
    }
DEFINE_DECODE_ATTENTION(thermik_decode_attention_bf16, bf16, attend_head_bf16, bf16_load, bf16_store)
DEFINE_DECODE_ATTENTION(thermik_decode_attention, float, attend_head_f32, f32_load, f32_store)
