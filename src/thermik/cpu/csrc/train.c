/* Elementwise kernels of the training forward (training/fused_ops.py), each one pass forward and one backward.
 *
 * RMSNorm: float32 rows in, the products' element type out.
 * PyTorch's CPU rms_norm is a composite of five elementwise ops forward and about ten backward, each a pass over
 * the residual stream with a fresh temporary; the cast of the output to bfloat16 is one more. Here the forward
 * reads a row once for its sum of squares and once to write the normalised, weighted, rounded output, and keeps
 * one float32 per row (the reciprocal RMS) for backward, which reads the row, its output gradient and the weight
 * twice to write the input gradient and add the weight gradient. The weight gradient is summed per thread, then
 * over threads.
 *
 * RoPE: queries or keys [B, T, heads, dim] (as their projection writes them) rotated into [B, heads, T, dim] (as
 * attention reads them), where PyTorch runs a transpose, two products, a concatenation, a sum and a cast, each a
 * pass of its own, forward and backward.
 *
 * Rows split over torch's OpenMP workers (common.h). */
#include "common.h"

/* out[r] = STORE(x[r] * rstd[r] * w) with rstd[r] = 1 / sqrt(mean(x[r]^2) + eps) (Zhang & Sennrich 2019). */
#define DEFINE_RMS_NORM_FORWARD(NAME, T, STORE)                                                                \
    void NAME(const float *x, const float *w, int64_t rows, int64_t dim, float eps, T *out, float *rstd,       \
              int64_t threads) {                                                                               \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                      \
        for (int64_t r = 0; r < rows; r++) {                                                                   \
            const float *xr = x + r * dim;                                                                     \
            T *o = out + r * dim;                                                                              \
            float sum = 0.0f;                                                                                  \
            for (int64_t i = 0; i < dim; i++) sum += xr[i] * xr[i];                                            \
            float inv = 1.0f / sqrtf(sum / (float)dim + eps);                                                  \
            rstd[r] = inv;                                                                                     \
            for (int64_t i = 0; i < dim; i++) o[i] = STORE(xr[i] * inv * w[i]);                                \
        }                                                                                                      \
    }

/* For y = x * rstd * w and g = dL/dy: dL/dx = rstd * g * w - x * rstd^3 * mean(g * w * x) (into grad_x), and
 * dL/dw = sum over rows of g * x * rstd, added into grad_w (`dim` floats) unless it is NULL. `partial` holds
 * threads * dim floats of scratch. */
#define DEFINE_RMS_NORM_BACKWARD(NAME, T, LOAD)                                                                \
    void NAME(const float *x, const float *w, const float *rstd, const T *grad, int64_t rows, int64_t dim,     \
              float *grad_x, float *grad_w, float *partial, int64_t threads) {                                 \
        if (grad_w != NULL) memset(partial, 0, sizeof(float) * threads * dim);                                 \
        _Pragma("omp parallel num_threads(threads)")                                                           \
        {                                                                                                      \
            float *acc = partial + omp_get_thread_num() * dim;                                                 \
            _Pragma("omp for schedule(static)")                                                                \
            for (int64_t r = 0; r < rows; r++) {                                                               \
                const float *xr = x + r * dim;                                                                 \
                const T *gr = grad + r * dim;                                                                  \
                float *dx = grad_x + r * dim;                                                                  \
                float inv = rstd[r], dot = 0.0f;                                                               \
                for (int64_t i = 0; i < dim; i++) dot += LOAD(gr[i]) * w[i] * xr[i];                           \
                float k = inv * inv * inv * dot / (float)dim;                                                  \
                for (int64_t i = 0; i < dim; i++) dx[i] = inv * LOAD(gr[i]) * w[i] - k * xr[i];                \
                if (grad_w != NULL)                                                                            \
                    for (int64_t i = 0; i < dim; i++) acc[i] += LOAD(gr[i]) * xr[i] * inv;                     \
            }                                                                                                  \
        }                                                                                                      \
        if (grad_w != NULL)                                                                                    \
            for (int64_t t = 0; t < threads; t++)                                                              \
                for (int64_t i = 0; i < dim; i++) grad_w[i] += partial[t * dim + i];                           \
    }

DEFINE_RMS_NORM_FORWARD(thermik_rms_norm_forward_f32, float, f32_store)
DEFINE_RMS_NORM_FORWARD(thermik_rms_norm_forward_bf16, bf16, bf16_store)
DEFINE_RMS_NORM_BACKWARD(thermik_rms_norm_backward_f32, float, f32_load)
DEFINE_RMS_NORM_BACKWARD(thermik_rms_norm_backward_bf16, bf16, bf16_load)

/* Rotary position embedding (Su et al. 2021) in the HF "rotate half" layout: for i < dim/2 the pair (lo, hi) =
 * (x[i], x[i + dim/2]) becomes (lo cos[i] - hi sin[i], hi cos[i + dim/2] + lo sin[i + dim/2]), in float32, rounded
 * once; x [B, T, heads, dim] -> out [B, heads, T, dim], cos/sin tables [B, T, dim] float32. BACKWARD (a constant)
 * applies the transpose instead, from the output's gradient [B, heads, T, dim] to x's [B, T, heads, dim]: (g_lo,
 * g_hi) becomes (g_lo cos[i] + g_hi sin[i + dim/2], g_hi cos[i + dim/2] - g_lo sin[i]). */
#define DEFINE_ROPE(NAME, T, LOAD, STORE, BACKWARD)                                                            \
    void NAME(const T *in, int64_t batch, int64_t length, int64_t heads, int64_t dim, const float *cos_tab,    \
              const float *sin_tab, T *out, int64_t threads) {                                                 \
        int64_t half = dim / 2;                                                                                \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                      \
        for (int64_t bt = 0; bt < batch * length; bt++) {                                                      \
            int64_t b = bt / length, t = bt % length;                                                          \
            const float *c = cos_tab + bt * dim, *s = sin_tab + bt * dim;                                      \
            for (int64_t h = 0; h < heads; h++) {                                                              \
                int64_t token_major = (bt * heads + h) * dim, head_major = ((b * heads + h) * length + t) * dim; \
                const T *src = in + (BACKWARD ? head_major : token_major);                                     \
                T *dst = out + (BACKWARD ? token_major : head_major);                                          \
                for (int64_t i = 0; i < half; i++) {                                                           \
                    float lo = LOAD(src[i]), hi = LOAD(src[i + half]);                                         \
                    float s_lo = BACKWARD ? -s[i + half] : s[i], s_hi = BACKWARD ? -s[i] : s[i + half];        \
                    dst[i] = STORE(lo * c[i] - hi * s_lo);                                                     \
                    dst[i + half] = STORE(hi * c[i + half] + lo * s_hi);                                       \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

DEFINE_ROPE(thermik_rope_forward_f32, float, f32_load, f32_store, 0)
DEFINE_ROPE(thermik_rope_forward_bf16, bf16, bf16_load, bf16_store, 0)
DEFINE_ROPE(thermik_rope_backward_f32, float, f32_load, f32_store, 1)
DEFINE_ROPE(thermik_rope_backward_bf16, bf16, bf16_load, bf16_store, 1)

/* The logistic sigmoid through exp_nonpositive (common.h), which vectorizes: e^-|x| never overflows. */
static inline float sigmoid(float x) {
    float e = exp_nonpositive(x >= 0.0f ? -x : x);
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* SwiGLU's gate (Shazeer 2020): out = silu(gate) * up, silu(g) = g * sigmoid(g), in float32, rounded once. */
#define DEFINE_SWIGLU_FORWARD(NAME, T, LOAD, STORE)                                                            \
    void NAME(const T *gate, const T *up, int64_t n, T *out, int64_t threads) {                               \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                      \
        for (int64_t i = 0; i < n; i++) {                                                                      \
            float g = LOAD(gate[i]);                                                                           \
            out[i] = STORE(g * sigmoid(g) * LOAD(up[i]));                                                      \
        }                                                                                                      \
    }

/* d up = grad * silu(g); d gate = grad * up * silu'(g), silu'(g) = s (1 + g (1 - s)) for s = sigmoid(g). */
#define DEFINE_SWIGLU_BACKWARD(NAME, T, LOAD, STORE)                                                           \
    void NAME(const T *gate, const T *up, const T *grad, int64_t n, T *grad_gate, T *grad_up, int64_t threads) { \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                      \
        for (int64_t i = 0; i < n; i++) {                                                                      \
            float g = LOAD(gate[i]), u = LOAD(up[i]), d = LOAD(grad[i]), s = sigmoid(g);                       \
            grad_up[i] = STORE(d * g * s);                                                                     \
            grad_gate[i] = STORE(d * u * s * (1.0f + g * (1.0f - s)));                                         \
        }                                                                                                      \
    }

DEFINE_SWIGLU_FORWARD(thermik_swiglu_forward_f32, float, f32_load, f32_store)
DEFINE_SWIGLU_FORWARD(thermik_swiglu_forward_bf16, bf16, bf16_load, bf16_store)
DEFINE_SWIGLU_BACKWARD(thermik_swiglu_backward_f32, float, f32_load, f32_store)
DEFINE_SWIGLU_BACKWARD(thermik_swiglu_backward_bf16, bf16, bf16_load, bf16_store)
