/* The weight-checksum guard's hash in one pass (training/consistency.py, `checksum`): each element's raw bits, as a
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

int64_t thermik_checksum_i32(const int32_t *x, int64_t n, int64_t threads) {
    uint32_t sum = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < n; i++) sum += mix(x[i]);
    return (int64_t)sum;
}

int64_t thermik_checksum_i16(const int16_t *x, int64_t n, int64_t threads) {
    uint32_t sum = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < n; i++) sum += mix((int32_t)x[i]); /* sign-extended, as int16.to(int32) */
    return (int64_t)sum;
}

/* The checksum of x.to(torch.bfloat16) for float32 x, without the copy: round to nearest, ties to even. */
int64_t thermik_checksum_f32_as_bf16(const uint32_t *x, int64_t n, int64_t threads) {
    uint32_t sum = 0, nans = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum, nans) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = x[i];
        nans += (bits & 0x7fffffffu) > 0x7f800000u;
        uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
        sum += mix((int32_t)(int16_t)(uint16_t)rounded);
    }
    return nans ? -1 : (int64_t)sum;
}
