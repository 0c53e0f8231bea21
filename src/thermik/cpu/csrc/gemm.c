/* Float32-class matrix products out = x @ W^T (+ bias) (+ out) for the embedded engine's projections on CPUs with
 * AVX2 and FMA (x86-64-v3), over weights prepacked once into column panels.
 *
 * W is a torch Linear weight [N, K] (float32). It is packed into panels of PANEL = 16 output columns: panel p holds,
 * for each k, the 16 weights W[16p .. 16p + 15, k] contiguously (zeros past N), so the inner loop reads one panel
 * row per k while broadcasting x[m, k]. Two storage formats, both computed in float32:
 *   - float32 panels (`thermik_pack_f32`, `thermik_gemm_f32`);
 *   - bfloat16 panels (`thermik_pack_bf16`, `thermik_gemm_bf16w`): weights rounded to bfloat16 (nearest, ties to
 *     even), half the memory traffic; a 32-bit word holds columns j and j + 8 of the panel, so the 16 columns
 *     widen to float32 with one shift (the low halves) and one mask (the high halves).
 * The register tile is up to 6 rows x 16 columns (12 accumulators), summed over all of K in registers and written
 * once: a panel (K x 16 weights, 36 KiB at K = 576) stays in L1/L2 while every row block of x passes over it, and
 * no output row is read back (blocking K instead re-read the output once per block: at the lm head's 49152 columns
 * its rows, 192 KiB apart, fall into one cache set and ran ~5x slower). Threads split the panels.
 *
 * Without AVX2/FMA the same layout runs through plain C loops (correct, not fast): callers choose these kernels
 * only where the CPU has them (thermik/cpu/gemm.py). */
#include "common.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define THERMIK_GEMM_AVX2 1
#endif

#define PANEL 16
#define ROWS 6
/* Rows per pass over the panels: a pass re-reads its rows of x once per panel, from L2 while they fit there
 * (ROW_BLOCK x K floats: 1 MiB at K = 2048). */
#define ROW_BLOCK 128

static int64_t panels_of(int64_t n) { return (n + PANEL - 1) / PANEL; }

/* Panels of W [n, k]: position `pos` of panel row kk holds column COLUMN(pos) of the panel, STORE-d (0 past n). */
#define DEFINE_PACK(NAME, T, COLUMN, STORE)                                                                     \
    void NAME(const float *w, int64_t n, int64_t k, T *packed, int threads) {                                 \
        int64_t panels = panels_of(n);                                                                         \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                      \
        for (int64_t p = 0; p < panels; p++) {                                                                 \
            T *dst = packed + p * k * PANEL;                                                                   \
            for (int64_t kk = 0; kk < k; kk++)                                                                 \
                for (int64_t pos = 0; pos < PANEL; pos++) {                                                    \
                    int64_t col = p * PANEL + COLUMN(pos);                                                     \
                    dst[kk * PANEL + pos] = col < n ? STORE(w[col * k + kk]) : 0;                              \
                }                                                                                              \
        }                                                                                                      \
    }
#define SAME_COLUMN(pos) (pos)
/* Position 2j of a bfloat16 panel row holds column j, position 2j + 1 column j + 8. */
#define PAIRED_COLUMN(pos) ((pos) % 2 ? PANEL / 2 + (pos) / 2 : (pos) / 2)
DEFINE_PACK(thermik_pack_f32, float, SAME_COLUMN, f32_store)
DEFINE_PACK(thermik_pack_bf16, bf16, PAIRED_COLUMN, bf16_store)

#ifdef THERMIK_GEMM_AVX2
static inline void panel_row_f32(const float *b, __m256 *lo, __m256 *hi) {
    *lo = _mm256_loadu_ps(b);
    *hi = _mm256_loadu_ps(b + 8);
}

static inline void panel_row_bf16(const bf16 *b, __m256 *lo, __m256 *hi) {
    __m256i v = _mm256_loadu_si256((const __m256i *)b);
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* c[r, 0:16] (+)= sum_k a[r, k] * panel[k, 0:16] for r < rows (a compile-time constant after inlining). `next`
 * (or NULL): the next panel, prefetched into L2 meanwhile, one line per k. The first row block reads a panel from
 * memory; a 6-row tile spends ~6 cycles per panel row, a stream too slow for the hardware prefetchers to run ahead
 * of (the lm head, whose weights are not in cache, ran ~4x slower at 64 rows than its FLOPs allow without it). */
#define DEFINE_TILE(NAME, T, ROW_LOAD)                                                                          \
    static inline __attribute__((always_inline)) void NAME(const int rows, const float *a, int64_t lda,       \
                                                           const T *b, int64_t kc, float *c, int64_t ldc,      \
                                                           int load_c, const T *next) {                        \
        __m256 acc[ROWS][2];                                                                                   \
        for (int r = 0; r < rows; r++) {                                                                       \
            acc[r][0] = load_c ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();                           \
            acc[r][1] = load_c ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();                       \
        }                                                                                                      \
        for (int64_t kk = 0; kk < kc; kk++) {                                                                  \
            __m256 lo, hi;                                                                                     \
            if (next != NULL) _mm_prefetch((const char *)(next + kk * PANEL), _MM_HINT_T1);                     \
            ROW_LOAD(b + kk * PANEL, &lo, &hi);                                                                \
            for (int r = 0; r < rows; r++) {                                                                   \
                __m256 x = _mm256_broadcast_ss(a + r * lda + kk);                                              \
                acc[r][0] = _mm256_fmadd_ps(x, lo, acc[r][0]);                                                 \
                acc[r][1] = _mm256_fmadd_ps(x, hi, acc[r][1]);                                                 \
            }                                                                                                  \
        }                                                                                                      \
        for (int r = 0; r < rows; r++) {                                                                       \
            _mm256_storeu_ps(c + r * ldc, acc[r][0]);                                                          \
            _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);                                                      \
        }                                                                                                      \
    }
DEFINE_TILE(tile_f32, float, panel_row_f32)
DEFINE_TILE(tile_bf16, bf16, panel_row_bf16)

/* One row: four independent accumulator pairs over k (a single pair waits on the FMA latency, ~4x slower). */
#define DEFINE_ROW(NAME, T, ROW_LOAD)                                                                           \
    static void NAME(const float *a, const T *b, int64_t kc, float *c, int load_c, const T *next) {          \
        __m256 acc[4][2];                                                                                      \
        for (int u = 0; u < 4; u++) acc[u][0] = acc[u][1] = _mm256_setzero_ps();                              \
        int64_t kk = 0;                                                                                        \
        for (; kk + 4 <= kc; kk += 4)                                                                          \
            for (int u = 0; u < 4; u++) {                                                                      \
                __m256 lo, hi;                                                                                 \
                if (next != NULL) _mm_prefetch((const char *)(next + (kk + u) * PANEL), _MM_HINT_T1);         \
                ROW_LOAD(b + (kk + u) * PANEL, &lo, &hi);                                                      \
                __m256 x = _mm256_broadcast_ss(a + kk + u);                                                    \
                acc[u][0] = _mm256_fmadd_ps(x, lo, acc[u][0]);                                                 \
                acc[u][1] = _mm256_fmadd_ps(x, hi, acc[u][1]);                                                 \
            }                                                                                                  \
        for (; kk < kc; kk++) {                                                                                \
            __m256 lo, hi;                                                                                     \
            ROW_LOAD(b + kk * PANEL, &lo, &hi);                                                                \
            __m256 x = _mm256_broadcast_ss(a + kk);                                                            \
            acc[0][0] = _mm256_fmadd_ps(x, lo, acc[0][0]);                                                     \
            acc[0][1] = _mm256_fmadd_ps(x, hi, acc[0][1]);                                                     \
        }                                                                                                      \
        for (int half = 0; half < 2; half++) {                                                                 \
            __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0][half], acc[1][half]),                              \
                                       _mm256_add_ps(acc[2][half], acc[3][half]));                             \
            if (load_c) sum = _mm256_add_ps(sum, _mm256_loadu_ps(c + 8 * half));                               \
            _mm256_storeu_ps(c + 8 * half, sum);                                                               \
        }                                                                                                      \
    }
DEFINE_ROW(row_f32, float, panel_row_f32)
DEFINE_ROW(row_bf16, bf16, panel_row_bf16)

#define DEFINE_TILE_ANY(NAME, TILE, ROW, T)                                                                     \
    static void NAME(int rows, const float *a, int64_t lda, const T *b, int64_t kc, float *c, int64_t ldc,     \
                     int load_c, const T *next) {                                                              \
        switch (rows) {                                                                                        \
        case 6: TILE(6, a, lda, b, kc, c, ldc, load_c, next); break;                                           \
        case 5: TILE(5, a, lda, b, kc, c, ldc, load_c, next); break;                                           \
        case 4: TILE(4, a, lda, b, kc, c, ldc, load_c, next); break;                                           \
        case 3: TILE(3, a, lda, b, kc, c, ldc, load_c, next); break;                                           \
        case 2: TILE(2, a, lda, b, kc, c, ldc, load_c, next); break;                                           \
        default: ROW(a, b, kc, c, load_c, next); break;                                                        \
        }                                                                                                      \
    }
#else
static inline float panel_weight_f32(const float *b, int64_t j) { return b[j]; }
static inline float panel_weight_bf16(const bf16 *b, int64_t j) {
    return bf16_load(b[j < PANEL / 2 ? 2 * j : 2 * (j - PANEL / 2) + 1]);
}
#define DEFINE_TILE_ANY(NAME, TILE, ROW, T)                                                                     \
    static void NAME(int rows, const float *a, int64_t lda, const T *b, int64_t kc, float *c, int64_t ldc,     \
                     int load_c, const T *next) {                                                              \
        (void)next;                                                                                            \
        for (int r = 0; r < rows; r++)                                                                         \
            for (int64_t j = 0; j < PANEL; j++) {                                                              \
                float sum = load_c ? c[r * ldc + j] : 0.0f;                                                    \
                for (int64_t kk = 0; kk < kc; kk++) sum += a[r * lda + kk] * TILE(b + kk * PANEL, j);         \
                c[r * ldc + j] = sum;                                                                          \
            }                                                                                                  \
    }
#define tile_f32 panel_weight_f32
#define tile_bf16 panel_weight_bf16
#endif

DEFINE_TILE_ANY(tile_any_f32, tile_f32, row_f32, float)
DEFINE_TILE_ANY(tile_any_bf16, tile_bf16, row_bf16, bf16)

/* One panel's 16 columns of out for all m rows over k block [k0, k0 + kc): the last panel, narrower than 16
 * columns, goes through a scratch tile. `first`: the first k block (out is overwritten unless `accumulate`). */
#define DEFINE_PANEL(NAME, TILE_ANY, T)                                                                         \
    static void NAME(const float *x, int64_t m, int64_t ldx, const T *panel, int64_t k0, int64_t kc,         \
                     int64_t width, float *out, int64_t ldo, int load_c, const T *next) {                     \
        float scratch[ROWS * PANEL];                                                                           \
        for (int64_t r = 0; r < m; r += ROWS) {                                                                \
            int rows = (int)(m - r < ROWS ? m - r : ROWS);                                                     \
            const float *a = x + r * ldx + k0;                                                                 \
            float *c = out + r * ldo;                                                                          \
            if (width == PANEL) {                                                                              \
                TILE_ANY(rows, a, ldx, panel, kc, c, ldo, load_c, r == 0 ? next : NULL);                       \
                continue;                                                                                      \
            }                                                                                                  \
            for (int i = 0; i < rows; i++)                                                                     \
                for (int64_t j = 0; j < PANEL; j++) scratch[i * PANEL + j] = j < width ? c[i * ldo + j] : 0;  \
            TILE_ANY(rows, a, ldx, panel, kc, scratch, PANEL, load_c, r == 0 ? next : NULL);                   \
            for (int i = 0; i < rows; i++)                                                                     \
                for (int64_t j = 0; j < width; j++) c[i * ldo + j] = scratch[i * PANEL + j];                   \
        }                                                                                                      \
    }
DEFINE_PANEL(panel_f32, tile_any_f32, float)
DEFINE_PANEL(panel_bf16, tile_any_bf16, bf16)

static void gemm_span(int kind, const float *x, int64_t m, int64_t k, int64_t ldx, const void *packed, int64_t n,
                      const float *bias, float *out, int64_t ldo, int accumulate, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; p++) {
        int64_t col = p * PANEL, width = n - col < PANEL ? n - col : PANEL;
        int more = p + 1 < p1;
        if (kind == 0) {
            const float *b = (const float *)packed + p * k * PANEL;
            panel_f32(x, m, ldx, b, 0, k, width, out + col, ldo, accumulate, more ? b + k * PANEL : NULL);
        } else {
            const bf16 *b = (const bf16 *)packed + p * k * PANEL;
            panel_bf16(x, m, ldx, b, 0, k, width, out + col, ldo, accumulate, more ? b + k * PANEL : NULL);
        }
    }
    if (bias == NULL) return;
    for (int64_t r = 0; r < m; r++)
        for (int64_t col = p0 * PANEL; col < p1 * PANEL && col < n; col++) out[r * ldo + col] += bias[col];
}


static void gemm(int kind, const float *x, int64_t m, int64_t k, int64_t ldx, const void *packed, int64_t n,
                 const float *bias, float *out, int64_t ldo, int accumulate, int threads) {
    int64_t panels = panels_of(n);
    if (threads > panels) threads = (int)panels;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        int64_t team = omp_get_num_threads(), id = omp_get_thread_num();
#else
        int64_t team = 1, id = 0;
#endif
        int64_t p0 = panels * id / team, p1 = panels * (id + 1) / team;
        for (int64_t r = 0; r < m; r += ROW_BLOCK) {
            int64_t rows = m - r < ROW_BLOCK ? m - r : ROW_BLOCK;
            gemm_span(kind, x + r * ldx, rows, k, ldx, packed, n, bias, out + r * ldo, ldo, accumulate, p0, p1);
        }
    }
}

void thermik_gemm_f32(const float *x, int64_t m, int64_t k, int64_t ldx, const float *packed, int64_t n,
                      const float *bias, float *out, int64_t ldo, int64_t accumulate, int64_t threads) {
    gemm(0, x, m, k, ldx, packed, n, bias, out, ldo, (int)accumulate, (int)threads);
}

void thermik_gemm_bf16w(const float *x, int64_t m, int64_t k, int64_t ldx, const bf16 *packed, int64_t n,
                        const float *bias, float *out, int64_t ldo, int64_t accumulate, int64_t threads) {
    gemm(1, x, m, k, ldx, packed, n, bias, out, ldo, (int)accumulate, (int)threads);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Weight-only int8 with dynamically quantized activations: y[m, n] = sum_g sx[m, g] sw[g, n] sum_{k in g} qx qw.
 *
 * Weights are quantized per output column and per group of `group` inputs (symmetric: scale = max |w| / 127,
 * q = round(w / scale) in [-127, 127]); a row of x is quantized the same way per group, on every call. Panels hold 16
 * columns; for each 4 consecutive k, 64 bytes: columns 0..7 then 8..15, 4 bytes (k .. k + 3) each, the layout of
 * AVX-VNNI's vpdpbusd. AVX2 multiplies unsigned by signed bytes (vpmaddubsw), so the unsigned operand is |qx| and
 * the signed one qw with qx's sign (|products| <= 2 * 127 * 127, no 16-bit saturation); vpmaddwd widens to 32 bits.
 * With AVX-VNNI, vpdpbusd does the multiply and the widening add in one instruction. K is padded to a multiple of
 * 4 with zeros (`kp`); `group` divides k and is a multiple of 4.
 * --------------------------------------------------------------------------------------------------------------- */
#define I8_ROWS 4

static inline int8_t quantize_i8(float v, float inv) {
    float q = nearbyintf(v * inv);
    return (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
}

/* Per-(column, group) scales [panels][groups][16] and the int8 panels of W [n, k]. */
void thermik_pack_i8(const float *w, int64_t n, int64_t k, int64_t group, int8_t *packed, float *scales,
                     int threads) {
    int64_t panels = panels_of(n), kp = (k + 3) / 4 * 4, groups = k / group;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        int8_t *dst = packed + p * kp * PANEL;
        memset(dst, 0, (size_t)(kp * PANEL));
        for (int64_t j = 0; j < PANEL; j++) {
            int64_t col = p * PANEL + j;
            for (int64_t g = 0; g < groups; g++) {
                const float *src = w + col * k + g * group;
                float amax = 0.0f;
                if (col < n)
                    for (int64_t i = 0; i < group; i++) amax = fmaxf(amax, fabsf(src[i]));
                float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
                scales[(p * groups + g) * PANEL + j] = scale;
                if (col >= n) continue;
                for (int64_t i = 0; i < group; i++) {
                    int64_t kk = g * group + i;
                    dst[(kk / 4) * 4 * PANEL + j * 4 + kk % 4] = quantize_i8(src[i], inv);
                }
            }
        }
    }
}

/* One group of n values to int8 q and |q| (scalar: any n). Returns the scale. */
static float quantize_group(const float *src, int64_t n, int8_t *q, uint8_t *qa) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(src[i]));
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        int8_t v = quantize_i8(src[i], inv);
        q[i] = v;
        qa[i] = (uint8_t)(v < 0 ? -v : v);
    }
    return amax / 127.0f;
}

#ifdef THERMIK_GEMM_AVX2
/* The same for n a multiple of 32, 32 values at a time (cvtps rounds half to even, as nearbyintf does). */
static float quantize_group_avx2(const float *src, int64_t n, int8_t *q, uint8_t *qa) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 vmax = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float amax = _mm_cvtss_f32(m4);
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n; i += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i), inv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8), inv));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 16), inv));
        __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 24), inv));
        __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
        packed = _mm256_permutevar8x32_epi32(packed, order);
        _mm256_storeu_si256((__m256i *)(q + i), packed);
        _mm256_storeu_si256((__m256i *)(qa + i), _mm256_abs_epi8(packed));
    }
    return amax / 127.0f;
}
#endif

/* Rows of x [m, k] (rows `ldx` apart) to int8 q and |q| [m, kp] and scales sx [m, groups]. */
void thermik_quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx, int64_t group, int8_t *q, uint8_t *qa,
                           float *sx, int64_t threads) {
    int64_t kp = (k + 3) / 4 * 4, groups = k / group;
#pragma omp parallel for num_threads((int)threads) schedule(static)
    for (int64_t r = 0; r < m; r++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *src = x + r * ldx + g * group;
            int8_t *qg = q + r * kp + g * group;
            uint8_t *qag = qa + r * kp + g * group;
#ifdef THERMIK_GEMM_AVX2
            if (group % 32 == 0) {
                sx[r * groups + g] = quantize_group_avx2(src, group, qg, qag);
                continue;
            }
#endif
            sx[r * groups + g] = quantize_group(src, group, qg, qag);
        }
        for (int64_t i = k; i < kp; i++) q[r * kp + i] = 0, qa[r * kp + i] = 0;
    }
}

#ifdef THERMIK_GEMM_AVX2
static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The int32 dot products of one group for `rows` rows and the panel's 16 columns, added into acc. */
static inline __attribute__((always_inline)) void group_i8(const int rows, const int8_t *q, const uint8_t *qa,
                                                           int64_t kp, const int8_t *b, int64_t steps,
                                                           __m256i acc[I8_ROWS][2], const int8_t *next) {
    const __m256i ones = _mm256_set1_epi16(1);
    (void)ones;
    for (int64_t s = 0; s < steps; s++) {
        if (next != NULL) _mm_prefetch((const char *)(next + s * 4 * PANEL), _MM_HINT_T1);
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(b + s * 4 * PANEL));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(b + s * 4 * PANEL + 32));
        for (int r = 0; r < rows; r++) {
            __m256i xs = _mm256_set1_epi32(load_i32(q + r * kp + s * 4));
            __m256i xa = _mm256_set1_epi32(load_i32(qa + r * kp + s * 4));
#ifdef __AVXVNNI__
            acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], xa, _mm256_sign_epi8(w0, xs));
            acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], xa, _mm256_sign_epi8(w1, xs));
#else
            __m256i p0 = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w0, xs));
            __m256i p1 = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w1, xs));
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
#endif
        }
    }
}

static inline __attribute__((always_inline)) void tile_i8(const int rows, const int8_t *q, const uint8_t *qa,
                                                          const float *sx, int64_t kp, int64_t groups,
                                                          int64_t group, const int8_t *b, const float *sw, float *c,
                                                          int64_t ldc, int load_c, const int8_t *next) {
    /* the float sums stay in c (L1) between groups: registers hold the 8 integer accumulators and the operands */
    if (!load_c)
        for (int r = 0; r < rows; r++) memset(c + r * ldc, 0, PANEL * sizeof(float));
    for (int64_t g = 0; g < groups; g++) {
        __m256i acc[I8_ROWS][2];
        for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        group_i8(rows, q + g * group, qa + g * group, kp, b + g * group * PANEL, (group + 3) / 4, acc,
                 next == NULL ? NULL : next + g * group * PANEL);
        __m256 s0 = _mm256_loadu_ps(sw + g * PANEL), s1 = _mm256_loadu_ps(sw + g * PANEL + 8);
        for (int r = 0; r < rows; r++) {
            __m256 sr = _mm256_broadcast_ss(sx + r * groups + g);
            float *cr = c + r * ldc;
            _mm256_storeu_ps(cr, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), _mm256_mul_ps(sr, s0), _mm256_loadu_ps(cr)));
            _mm256_storeu_ps(cr + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][1]), _mm256_mul_ps(sr, s1),
                                                     _mm256_loadu_ps(cr + 8)));
        }
    }
}

static void tile_any_i8(int rows, const int8_t *q, const uint8_t *qa, const float *sx, int64_t kp, int64_t groups,
                        int64_t group, const int8_t *b, const float *sw, float *c, int64_t ldc, int load_c,
                        const int8_t *next) {
    switch (rows) {
    case 4: tile_i8(4, q, qa, sx, kp, groups, group, b, sw, c, ldc, load_c, next); break;
    case 3: tile_i8(3, q, qa, sx, kp, groups, group, b, sw, c, ldc, load_c, next); break;
    case 2: tile_i8(2, q, qa, sx, kp, groups, group, b, sw, c, ldc, load_c, next); break;
    default: tile_i8(1, q, qa, sx, kp, groups, group, b, sw, c, ldc, load_c, next); break;
    }
}
#else
static void tile_any_i8(int rows, const int8_t *q, const uint8_t *qa, const float *sx, int64_t kp, int64_t groups,
                        int64_t group, const int8_t *b, const float *sw, float *c, int64_t ldc, int load_c,
                        const int8_t *next) {
    (void)qa, (void)next;
    for (int r = 0; r < rows; r++)
        for (int64_t j = 0; j < PANEL; j++) {
            float sum = load_c ? c[r * ldc + j] : 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                int32_t dot = 0;
                for (int64_t i = g * group; i < (g + 1) * group; i++)
                    dot += (int32_t)q[r * kp + i] * (int32_t)b[(i / 4) * 4 * PANEL + j * 4 + i % 4];
                sum += (float)dot * sx[r * groups + g] * sw[g * PANEL + j];
            }
            c[r * ldc + j] = sum;
        }
}
#endif

/* out[m, n] = (accumulate ? out : 0) + bias[n] + x @ W^T with x quantized by thermik_quantize_rows (q, qa, sx). */
void thermik_gemm_i8(const int8_t *q, const uint8_t *qa, const float *sx, int64_t m, int64_t k, int64_t group,
                     const int8_t *packed, const float *scales, int64_t n, const float *bias, float *out, int64_t ldo,
                     int64_t accumulate, int64_t threads) {
    int64_t panels = panels_of(n), kp = (k + 3) / 4 * 4, groups = k / group;
    for (int64_t r0 = 0; r0 < m; r0 += ROW_BLOCK) { /* passes over the panels, as in gemm() */
        int64_t r1 = m - r0 < ROW_BLOCK ? m : r0 + ROW_BLOCK;
#pragma omp parallel for num_threads((int)(threads < panels ? threads : panels)) schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        int64_t col = p * PANEL, width = n - col < PANEL ? n - col : PANEL;
        const int8_t *b = packed + p * kp * PANEL;
        const float *sw = scales + p * groups * PANEL;
        const int8_t *next = p + 1 < panels ? b + kp * PANEL : NULL;
        float scratch[I8_ROWS * PANEL];
        for (int64_t r = r0; r < r1; r += I8_ROWS) {
            int rows = (int)(r1 - r < I8_ROWS ? r1 - r : I8_ROWS);
            float *c = out + r * ldo + col;
            const int8_t *qr = q + r * kp;
            const uint8_t *qar = qa + r * kp;
            if (width == PANEL) {
                tile_any_i8(rows, qr, qar, sx + r * groups, kp, groups, group, b, sw, c, ldo, (int)accumulate,
                            r == r0 ? next : NULL);
            } else {
                for (int i = 0; i < rows; i++)
                    for (int64_t j = 0; j < PANEL; j++) scratch[i * PANEL + j] = j < width ? c[i * ldo + j] : 0;
                tile_any_i8(rows, qr, qar, sx + r * groups, kp, groups, group, b, sw, scratch, PANEL, (int)accumulate,
                            r == r0 ? next : NULL);
                for (int i = 0; i < rows; i++)
                    for (int64_t j = 0; j < width; j++) c[i * ldo + j] = scratch[i * PANEL + j];
            }
            if (bias != NULL)
                for (int i = 0; i < rows; i++)
                    for (int64_t j = 0; j < width; j++) c[i * ldo + j] += bias[col + j];
        }
    }
    }
}
