/* Fused CPU kernels for one decode step (one new token per sequence) of a Qwen2/Qwen3/Llama-shaped model.
 *
 * Each call replaces several small PyTorch ops, whose per-op dispatch and threading overhead dominates a
 * decode step of a small model on CPU. The kernels are serial and float32; the matrix products stay in
 * PyTorch (BLAS). Built and loaded by thermik/inference/cpu_kernels.py.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for `rows` rows of `dim` values (RMSNorm, Zhang & Sennrich 2019). */
void thermik_rms_norm(const float *x, const float *w, float *out, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        float sum = 0.0f;
        for (int64_t i = 0; i < dim; i++) sum += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(sum / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* Rotary embedding in the HF layout (rotate_half: the second half of the head pairs with the first), after an
 * optional per-head RMSNorm (Qwen3's q_norm / k_norm; `norm_w` NULL for none). Writes `dim` values to `out`. */
static void rope_head(const float *src, const float *norm_w, float eps, const float *cos_p, const float *sin_p,
                      int64_t dim, float scale, float *out) {
    float buf[1024];
    const float *x = src;
    if (norm_w != NULL) {
        thermik_rms_norm(src, norm_w, buf, 1, dim, eps);
        x = buf;
    }
    int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        out[i] = (x[i] * cos_p[i] - x[i + half] * sin_p[i]) * scale;
        out[i + half] = (x[i + half] * cos_p[i + half] + x[i] * sin_p[i + half]) * scale;
    }
}

/* One decode step's queries, keys and values. Row b of `qkv` is [q (heads*dim), k (kv_heads*dim), v
 * (kv_heads*dim)] for the token at position pos[b] of cache slot slot[b]. Queries get RoPE and `q_scale`
 * and go to q_out [B, heads, dim]; keys get RoPE and, like values, are stored in the caches
 * [slots, kv_heads, max_len, dim] at (slot[b], :, pos[b]). cos/sin tables are [positions, dim]. */
void thermik_rope_store(const float *qkv, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                        const float *cos_tab, const float *sin_tab, const int64_t *pos, const int64_t *slot,
                        const float *q_norm_w, const float *k_norm_w, float eps, float *k_cache, float *v_cache,
                        int64_t max_len, float *q_out, float q_scale) {
    int64_t width = (heads + 2 * kv_heads) * dim;
    for (int64_t b = 0; b < batch; b++) {
        const float *row = qkv + b * width;
        const float *c = cos_tab + pos[b] * dim;
        const float *s = sin_tab + pos[b] * dim;
        for (int64_t h = 0; h < heads; h++)
            rope_head(row + h * dim, q_norm_w, eps, c, s, dim, q_scale, q_out + (b * heads + h) * dim);
        for (int64_t h = 0; h < kv_heads; h++) {
            int64_t at = ((slot[b] * kv_heads + h) * max_len + pos[b]) * dim;
            rope_head(row + (heads + h) * dim, k_norm_w, eps, c, s, dim, 1.0f, k_cache + at);
            memcpy(v_cache + at, row + (heads + kv_heads + h) * dim, (size_t)dim * sizeof(float));
        }
    }
}
