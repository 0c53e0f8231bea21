/* The weight-checksum guard's hash in one pass (assembly/guards.py, `checksum`): each element's raw bits, as a
 * signed 32-bit integer, through multiply / xor-shift / multiply, summed with wrap-around. The same integers as the
 * PyTorch path, without its five passes and temporaries over every weight after every sync.
 *
 * Each function returns the wrapping sum as the low 32 bits of a non-negative int64, or -1 where the element type
 * asks the caller to use its PyTorch path instead (a NaN met while rounding float32 to bfloat16: torch's own
 * conversions disagree there, 0x7FC0 in scalar code and 0xFFFF in vector code). */
#include "common.h"

#define MIX_FIRST 0x9E3779B1u
#define MIX_SECOND 0x85EBCA6Bu

static inline uint32_t mix(int32_t value) {
    uint32_t h = (uint32_t)value * MIX_FIRST;
    h ^= (uint32_t)(((int32_t)h) >> 16); /* arithmetic shift, as torch's >> on int32 */
    return h * MIX_SECOND;
}

/* Each function reads `rows` rows of `cols` contiguous elements, row r starting at x + r * stride (a contiguous
 * tensor is one row; a column slice of a fused weight, as the engine holds them, is strided). A single row splits
 * over the threads by element, several rows by row. HASH(v) turns one raw element into the mixed integer; NAN(v)
 * is 1 for an element the kernel must not hash. */
#define DEFINE_CHECKSUM(NAME, T, HASH, NAN)                                                                    \
    int64_t NAME(const T *x, int64_t rows, int64_t cols, int64_t stride, int64_t threads) {                   \
        uint32_t sum = 0, nans = 0;                                                                         \
        if (rows == 1) {                                                                                    \
            _Pragma("omp parallel for num_threads(threads) reduction(+ : sum, nans) schedule(static)")     \
            for (int64_t i = 0; i < cols; i++) {                                                            \
                nans += NAN(x[i]);                                                                          \
                sum += HASH(x[i]);                                                                          \
            }                                                                                               \
        } else {                                                                                            \
            _Pragma("omp parallel for num_threads(threads) reduction(+ : sum, nans) schedule(static)")     \
            for (int64_t r = 0; r < rows; r++)                                                              \
                for (int64_t i = 0; i < cols; i++) {                                                        \
                    nans += NAN(x[r * stride + i]);                                                         \
                    sum += HASH(x[r * stride + i]);                                                         \
                }                                                                                           \
        }                                                                                                   \
        return nans ? -1 : (int64_t)sum;                                                                    \
    }

#define HASH_I32(v) mix(v)
#define HASH_I16(v) mix((int32_t)(v)) /* sign-extended, as int16.to(int32) */
/* x.to(torch.bfloat16) for float32 bits, without the copy: round to nearest, ties to even. */
#define HASH_F32_AS_BF16(v) mix((int32_t)(int16_t)(uint16_t)(((v) + 0x7fffu + (((v) >> 16) & 1u)) >> 16))
#define NEVER(v) 0
#define IS_NAN_F32(v) (((v) & 0x7fffffffu) > 0x7f800000u)

DEFINE_CHECKSUM(thermik_checksum_i32, int32_t, HASH_I32, NEVER)
DEFINE_CHECKSUM(thermik_checksum_i16, int16_t, HASH_I16, NEVER)
DEFINE_CHECKSUM(thermik_checksum_f32_as_bf16, uint32_t, HASH_F32_AS_BF16, IS_NAN_F32)
