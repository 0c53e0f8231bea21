/* Token logprobs and entropy over a vocabulary row, forward and backward, for the trainer (training/vocab_logprobs.py),
 * and the engine's sampler (one token and its logprob per row, sampling.py's `fused_sample`).
 *
 * A real model's training step spends a third of its time in vocabulary-sized float32 passes when they run as
 * separate PyTorch ops (cast, log-softmax, gather, entropy, log-softmax backward, cast back), each over a
 * [tokens, vocabulary] tensor far bigger than any cache. Here each row is read twice in the forward (max; then
 * e^(z - max) summed, and summed times z) and once in the backward (e^(z - lse), written as the gradient), while the
 * row sits in L2. Rows are z = logits * inv_temp; every sum and product in float32. Two element types: float32
 * (`thermik_vocab_*_f32`) and bfloat16 (`thermik_vocab_*_bf16`, the gradient rounded once to bfloat16).
 * The rows are [batch, length] positions of a [batch, >= length, vocab] tensor: row (b, t) starts at
 * logits + b * stride0 + t * stride1 and its `vocab` entries are contiguous. The per-row outputs and targets are
 * contiguous [batch, length]. Rows are split over `threads` OpenMP threads; each row's arithmetic is the same
 * whatever the split.
 */
#include "common.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* The largest of n values. gcc vectorizes neither fmaxf nor a max reduction without -ffinite-math-only, which would
 * also apply to every other kernel; with AVX-512 it is written out. */
static inline float row_max_f32(const float *x, int64_t n) {
    int64_t j = 0;
    float top = -INFINITY;
#ifdef __AVX512F__
    __m512 acc = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) acc = _mm512_max_ps(acc, _mm512_loadu_ps(x + j));
    top = _mm512_reduce_max_ps(acc);
#endif
    for (; j < n; j++) top = x[j] > top ? x[j] : top;
    return top;
}

static inline float row_max_bf16(const bf16 *x, int64_t n) {
    int64_t j = 0;
    float top = -INFINITY;
#ifdef __AVX512F__
    __m512 acc = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= n; j += 16) {
        __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + j)));
        acc = _mm512_max_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
    }
    top = _mm512_reduce_max_ps(acc);
#endif
    for (; j < n; j++) top = bf16_load(x[j]) > top ? bf16_load(x[j]) : top;
    return top;
}

/* Per row: lse = log sum_j e^z_j; logp = z[target] - lse; entropy = -sum_j p_j log p_j = log s - sum_j e_j d_j / s,
 * with d_j = z_j - max and e_j = e^d_j, s = sum_j e_j. */
#define DEFINE_VOCAB_FORWARD(NAME, T, LOAD, MAX)                                                               \
    void NAME(const T *logits, int64_t batch, int64_t length, int64_t stride0, int64_t stride1, int64_t vocab, \
              const int64_t *targets, float inv_temp, float *logp, float *entropy, float *lse, int64_t threads) { \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                    \
        for (int64_t r = 0; r < batch * length; r++) {                                                      \
            const T *x = logits + r / length * stride0 + r % length * stride1;                              \
            float top = MAX(x, vocab) * inv_temp;                                                           \
            float s = 0.0f, t = 0.0f;                                                                       \
            for (int64_t j = 0; j < vocab; j++) {                                                           \
                float d = LOAD(x[j]) * inv_temp - top;                                                      \
                float e = exp_nonpositive(d);                                                               \
                s += e;                                                                                     \
                t += e * d;                                                                                 \
            }                                                                                               \
            float log_s = logf(s);                                                                          \
            lse[r] = top + log_s;                                                                           \
            logp[r] = LOAD(x[targets[r]]) * inv_temp - lse[r];                                              \
            entropy[r] = log_s - t / s;                                                                     \
        }                                                                                                   \
    }

/* d(g logp + h H)/dz_j = g (onehot_j - p_j) - h p_j (log p_j + H), times inv_temp for d/dlogits; h_ent may be
 * NULL (no entropy gradient). Row (b, t) of the gradient starts at grad + b * grad0 + t * grad1. `grad` may be
 * `logits` itself (the gradient overwrites the logits): each entry is read before it is written, the target's
 * first. */
#define DEFINE_VOCAB_BACKWARD(NAME, T, LOAD, STORE)                                                            \
    void NAME(const T *logits, int64_t batch, int64_t length, int64_t stride0, int64_t stride1, int64_t vocab, \
              const int64_t *targets, float inv_temp, const float *lse, const float *entropy, const float *g_logp, \
              const float *h_ent, T *grad, int64_t grad0, int64_t grad1, int64_t threads) {                  \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                    \
        for (int64_t r = 0; r < batch * length; r++) {                                                      \
            const T *x = logits + r / length * stride0 + r % length * stride1;                              \
            T *out = grad + r / length * grad0 + r % length * grad1;                                        \
            float g = g_logp[r], h = h_ent ? h_ent[r] : 0.0f, ent = entropy[r], norm = lse[r];              \
            const int64_t k = targets[r];                                                                   \
            const float lp_k = LOAD(x[k]) * inv_temp - norm;                                                \
            const float p_k = exp_nonpositive(lp_k < 0.0f ? lp_k : 0.0f);                                   \
            for (int64_t j = 0; j < vocab; j++) {                                                           \
                float lp = LOAD(x[j]) * inv_temp - norm;                                                    \
                float p = exp_nonpositive(lp < 0.0f ? lp : 0.0f);                                           \
                out[j] = STORE(-p * (g + h * (lp + ent)) * inv_temp);                                       \
            }                                                                                               \
            out[k] = STORE((g - p_k * (g + h * (lp_k + ent))) * inv_temp);                                  \
        }                                                                                                   \
    }

DEFINE_VOCAB_FORWARD(thermik_vocab_forward_f32, float, f32_load, row_max_f32)
DEFINE_VOCAB_FORWARD(thermik_vocab_forward_bf16, bf16, bf16_load, row_max_bf16)
DEFINE_VOCAB_BACKWARD(thermik_vocab_backward_f32, float, f32_load, f32_store)
DEFINE_VOCAB_BACKWARD(thermik_vocab_backward_bf16, bf16, bf16_load, bf16_store)

/* Sampling for the engine: one token per row from softmax(z), z = logits * inv_temp, by the two-level inverse CDF
 * of sampling.py's `sample` (float32 block masses of SAMPLE_BLOCK tokens, float64 prefix sums over the blocks pick
 * a block, float64 prefix sums inside it pick the token), given one uniform u[r] in [0, 1) per row; also the
 * token's logprob, as the forward above computes it. Per row: one pass for the max, one for the block masses,
 * then SAMPLE_BLOCK entries again: the [B, V] float32 copies, softmax and gathers of the PyTorch path are not
 * made. Rows are [rows, vocab] with stride row_stride. */
#define SAMPLE_BLOCK 256
#define MAX_SAMPLE_BLOCKS 4096 /* vocabularies up to 1M tokens (cpu_kernels.MAX_SAMPLE_VOCAB) */

/* The largest double below v (v > 0): keeps u * total below total when the product rounds up. */
static inline double below(double v) { return nextafter(v, 0.0); }

#define DEFINE_SAMPLE(NAME, T, LOAD, MAX)                                                                      \
    void NAME(const T *logits, int64_t rows, int64_t row_stride, int64_t vocab, float inv_temp, const double *u, \
              int64_t *ids, float *logp, int64_t threads) {                                                 \
        const int64_t blocks = (vocab + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;                                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                    \
        for (int64_t r = 0; r < rows; r++) {                                                                \
            const T *x = logits + r * row_stride;                                                           \
            float mass[MAX_SAMPLE_BLOCKS];                                                                  \
            const float top = MAX(x, vocab) * inv_temp;                                                     \
            float s = 0.0f;                                                                                 \
            for (int64_t k = 0; k < blocks; k++) {                                                          \
                const int64_t end = k * SAMPLE_BLOCK + SAMPLE_BLOCK < vocab ? k * SAMPLE_BLOCK + SAMPLE_BLOCK : vocab; \
                float m = 0.0f;                                                                             \
                for (int64_t j = k * SAMPLE_BLOCK; j < end; j++) m += exp_nonpositive(LOAD(x[j]) * inv_temp - top); \
                mass[k] = m;                                                                                \
                s += m;                                                                                     \
            }                                                                                               \
            double total = 0.0;                                                                             \
            for (int64_t k = 0; k < blocks; k++) total += (double)mass[k];                                  \
            double want = u[r] * total, lo = 0.0, hi = 0.0;                                                 \
            want = want < total ? want : below(total);                                                      \
            int64_t k = 0;                                                                                  \
            for (; k < blocks; k++) {                                                                       \
                hi = lo + (double)mass[k];                                                                  \
                if (hi > want || k == blocks - 1) break;                                                    \
                lo = hi;                                                                                    \
            }                                                                                               \
            const int64_t start = k * SAMPLE_BLOCK, end = start + SAMPLE_BLOCK < vocab ? start + SAMPLE_BLOCK : vocab; \
            double inner = 0.0;                                                                             \
            for (int64_t j = start; j < end; j++) inner += (double)exp_nonpositive(LOAD(x[j]) * inv_temp - top); \
            double rest = (want - lo) / (hi - lo) * inner, run = 0.0;                                       \
            rest = rest < inner ? rest : below(inner);                                                      \
            int64_t pick = end - 1;                                                                         \
            for (int64_t j = start; j < end; j++) {                                                         \
                run += (double)exp_nonpositive(LOAD(x[j]) * inv_temp - top);                                \
                if (run > rest) {                                                                           \
                    pick = j;                                                                               \
                    break;                                                                                  \
                }                                                                                           \
            }                                                                                               \
            ids[r] = pick;                                                                                  \
            logp[r] = LOAD(x[pick]) * inv_temp - top - logf(s);                                             \
        }                                                                                                   \
    }

DEFINE_SAMPLE(thermik_sample_f32, float, f32_load, row_max_f32)
DEFINE_SAMPLE(thermik_sample_bf16, bf16, bf16_load, row_max_bf16)
