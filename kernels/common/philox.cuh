// kernels/common/philox.cuh -- Philox4x32-10 (Random123's, cuRAND's) and the Gumbel noise of a 32-bit word as the
// tree-sample contract defines it (plans/contracts.md, `tree-sample`). Device-only, header-only, __forceinline__.
#pragma once

#include <stdint.h>

namespace kdt {

// Philox4x32-10 of counter c under key k: 10 rounds, the key bumped by Weyl constants before rounds 1..9.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round) {
            k.x += 0x9E3779B9u;
            k.y += 0xBB67AE85u;
        }
        const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// -ln(-ln u) for u = ((w >> 8) + 0.5) * 2^-24, in float32 without forming u: u needs 25 significant bits, and in
// float32 the largest words would round to u = 1 (noise +inf). m = w >> 8 < 2^23: ln u = ln(m + 0.5) - 24 ln 2
// (m + 0.5 exact); else ln u = log1p(-(2^24 - 1 - m + 0.5) * 2^-24) (the argument exact). At most
// -ln(-ln(1 - 2^-25)) = 17.33 (GUMBEL_MAX).
constexpr float GUMBEL_MAX = 17.33f;
// The least noise, -ln(-ln(2^-25)) = -2.8525, rounded down: any token's score is at least its z + GUMBEL_MIN.
constexpr float GUMBEL_MIN = -2.86f;
__device__ __forceinline__ float gumbel_of_word(uint32_t w) {
    const uint32_t m = w >> 8;
    const float ln_u = m < (1u << 23) ? logf(static_cast<float>(m) + 0.5f) - 16.635532333438686f
                                      : log1pf(-(static_cast<float>((1u << 24) - 1u - m) + 0.5f) * 0x1p-24f);
    return -logf(-ln_u);
}

}  // namespace kdt
