// kernels/tree_sample/draw.cuh -- one draw of the contract's sample(g, i, p) by a whole block: the row read as
// float32, z = row / temperature, the top-k set (radix select of the k-th key, then of the id among its ties), the
// top-p set (a radix select that accumulates probability mass per digit bin, then the id cut among equal
// probabilities), and the Gumbel-max over the kept tokens with Philox noise keyed by (seed, p, token). Every
// filter is a prefix of the order (z descending, id ascending), so the kept set is one prefix and each filter is a
// (key, id) cut. Float32 throughout: the results differ from the float64 reference only on knife's-edge draws,
// which the contract's decision margins exclude. Used by kernels/tree_sample.cu; the plan and its faster successor:
// plans/kernels/tree-sample.md.
#pragma once

#include <stdint.h>

#include "common/bits.cuh"
#include "common/philox.cuh"

namespace ts {

constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
constexpr int BINS = 256;                     // 8-bit digits: four passes per 32-bit key

struct Smem {
    uint32_t count[BINS];
    float mass[BINS];
    unsigned long long best[WARPS];
    float partial[WARPS];
    uint32_t chosen;                          // the digit a select pass picked
    uint32_t rank;                            // the rank left inside it
    float before;                             // the mass of the tokens ahead of the picked digit
    int token;                                // the draw
    int next;                                 // the walk's next slot (-1: stop)
};

__device__ __forceinline__ float load_logit(const float* row, int t) { return row[t]; }
__device__ __forceinline__ float load_logit(const uint16_t* row, int t) {
    return kdt::bits_to_float(static_cast<uint32_t>(row[t]) << 16);
}

// The order of a draw: key(z) descending, id ascending; -0.0 and +0.0 are equal (the id decides).
__device__ __forceinline__ uint32_t order_key(float z) { return kdt::ordered_key(z == 0.f ? 0.f : z); }

// (key, id) packed so that a larger value comes first in the order: the block maximum is the first token.
__device__ __forceinline__ unsigned long long packed(uint32_t key, int t) {
    return (static_cast<unsigned long long>(key) << 32) | static_cast<uint32_t>(~t);
}

__device__ __forceinline__ unsigned long long block_max(unsigned long long v, Smem& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, d);
        v = o > v ? o : v;
    }
    if (lane == 0) s.best[warp] = v;
    __syncthreads();
    unsigned long long best = s.best[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) best = s.best[w] > best ? s.best[w] : best;
    __syncthreads();
    return best;
}

__device__ __forceinline__ float block_sum(float v, Smem& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    if (lane == 0) s.partial[warp] = v;
    __syncthreads();
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += s.partial[w];
    __syncthreads();
    return sum;
}

// The rank-th (1-based) largest value of key(t) over the tokens t < n with keep(t), by four 8-bit radix passes over
// the row; on return `rank` is the rank left among the tokens whose key equals the result.
template <class Key, class Keep>
__device__ uint32_t select_rank(int n, Key key, Keep keep, uint32_t& rank, Smem& s) {
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < BINS; b += THREADS) s.count[b] = 0;
        __syncthreads();
        for (int t = threadIdx.x; t < n; t += THREADS) {
            if (!keep(t)) continue;
            const uint32_t k = key(t);
            if ((k & mask) == prefix) atomicAdd(&s.count[(k >> shift) & (BINS - 1)], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t left = rank;
            int b = BINS - 1;
            for (; b > 0; --b) {
                if (s.count[b] >= left) break;
                left -= s.count[b];
            }
            s.chosen = b;
            s.rank = left;
        }
        __syncthreads();
        prefix |= s.chosen << shift;
        mask |= (BINS - 1u) << shift;
        rank = s.rank;
        __syncthreads();
    }
    return prefix;
}

// The key at which the cumulative mass(t), in descending key order over the tokens with keep(t), first reaches
// `target`; `above` gets the mass of the tokens with a larger key, `ties` the number with this key. Where rounding
// keeps the total under target, the last key with mass.
template <class Key, class Keep, class Mass>
__device__ uint32_t select_mass(int n, Key key, Keep keep, Mass mass_of, float target, float& above, uint32_t& ties,
                                Smem& s) {
    uint32_t prefix = 0, mask = 0;
    above = 0.f;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < BINS; b += THREADS) {
            s.count[b] = 0;
            s.mass[b] = 0.f;
        }
        __syncthreads();
        for (int t = threadIdx.x; t < n; t += THREADS) {
            if (!keep(t)) continue;
            const uint32_t k = key(t);
            if ((k & mask) == prefix) {
                const uint32_t bin = (k >> shift) & (BINS - 1);
                atomicAdd(&s.count[bin], 1u);
                atomicAdd(&s.mass[bin], mass_of(t));
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float cum = above, before = above;
            int chosen = -1;
            for (int b = BINS - 1; b >= 0; --b) {
                if (s.mass[b] <= 0.f) continue;
                chosen = b;
                before = cum;
                if (cum + s.mass[b] >= target) break;
                cum += s.mass[b];
            }
            s.chosen = chosen < 0 ? 0u : static_cast<uint32_t>(chosen);
            s.before = before;
            s.rank = chosen < 0 ? 0u : s.count[chosen];
        }
        __syncthreads();
        prefix |= s.chosen << shift;
        mask |= (BINS - 1u) << shift;
        above = s.before;
        ties = s.rank;
        __syncthreads();
    }
    return prefix;
}

// The draw: temperature 0 is the argmax (ties: smaller id); otherwise z = x / temperature, top-k, top-p, then the
// Gumbel-max. `position` is the absolute position of the token drawn (the Philox counter's upper words).
template <typename Tin>
__device__ int draw(const Tin* row, int vocab, float temperature, int top_k, float top_p, uint64_t seed,
                    uint64_t position, Smem& s) {
    if (temperature == 0.f) {
        unsigned long long best = 0;
        for (int t = threadIdx.x; t < vocab; t += THREADS) {
            const unsigned long long v = packed(order_key(load_logit(row, t)), t);
            best = v > best ? v : best;
        }
        return static_cast<int>(~static_cast<uint32_t>(block_max(best, s)));
    }
    const auto z_of = [&](int t) { return load_logit(row, t) / temperature; };
    const auto key_of = [&](int t) { return order_key(z_of(t)); };
    const auto every = [](int) { return true; };

    // top-k: the k-th token of the order, as (key, id); kept: ahead of it or it
    const bool k_on = top_k > 0 && top_k < vocab;
    uint32_t k_key = 0;
    int k_id = vocab;
    if (k_on) {
        uint32_t rank = static_cast<uint32_t>(top_k);
        k_key = select_rank(vocab, key_of, every, rank, s);
        const uint32_t key = k_key;
        k_id = static_cast<int>(~select_rank(vocab, [](int t) { return ~static_cast<uint32_t>(t); },
                                             [&](int t) { return key_of(t) == key; }, rank, s));
    }
    const auto kept_k = [&](int t) {
        if (!k_on) return true;
        const uint32_t k = key_of(t);
        return k > k_key || (k == k_key && t <= k_id);
    };

    // top-p over the top-k set: the softmax against the row max, then the mass cut and its id among equal ones
    const bool p_on = top_p < 1.f;
    uint32_t p_key = 0;
    int p_id = vocab;
    if (p_on) {
        unsigned long long first = 0;
        for (int t = threadIdx.x; t < vocab; t += THREADS) {
            const unsigned long long v = packed(key_of(t), t);
            first = v > first ? v : first;
        }
        const float z_max = kdt::ordered_float(static_cast<uint32_t>(block_max(first, s) >> 32));
        const auto mass_of = [&](int t) { return expf(z_of(t) - z_max); };
        float total = 0.f;
        for (int t = threadIdx.x; t < vocab; t += THREADS)
            if (kept_k(t)) total += mass_of(t);
        total = block_sum(total, s);
        float above;
        uint32_t ties;
        p_key = select_mass(vocab, key_of, kept_k, mass_of, top_p * total, above, ties, s);
        const float each = expf(kdt::ordered_float(p_key) - z_max);
        const float need = (top_p * total - above) / each;
        uint32_t rank = need <= 1.f ? 1u : static_cast<uint32_t>(ceilf(need));
        rank = rank > ties ? ties : rank;
        rank = rank < 1u ? 1u : rank;
        const uint32_t key = p_key;
        p_id = static_cast<int>(~select_rank(vocab, [](int t) { return ~static_cast<uint32_t>(t); },
                                             [&](int t) { return key_of(t) == key && kept_k(t); }, rank, s));
    }
    const auto kept = [&](int t) {
        if (!kept_k(t)) return false;
        if (!p_on) return true;
        const uint32_t k = key_of(t);
        return k > p_key || (k == p_key && t <= p_id);
    };

    // Gumbel-max over the kept tokens, 4 tokens per Philox call; a token whose z plus the largest noise cannot
    // beat this thread's best score gets no noise (exact: its score could not win either)
    const uint2 philox_key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    const uint32_t pos_lo = static_cast<uint32_t>(position), pos_hi = static_cast<uint32_t>(position >> 32);
    float best_score = -__builtin_huge_valf();
    unsigned long long best = 0;
    for (int quad = threadIdx.x; 4 * quad < vocab; quad += THREADS) {
        bool any = false;
        float z[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = 4 * quad + e;
            const bool live = t < vocab && kept(t);
            z[e] = live ? z_of(t) : -__builtin_huge_valf();
            any |= live && z[e] + kdt::GUMBEL_MAX >= best_score;
        }
        if (!any) continue;
        const uint4 words = kdt::philox4x32_10(make_uint4(static_cast<uint32_t>(quad), 0u, pos_lo, pos_hi), philox_key);
        const uint32_t word[4] = {words.x, words.y, words.z, words.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = 4 * quad + e;
            if (t >= vocab || z[e] == -__builtin_huge_valf()) continue;
            const float score = z[e] + kdt::gumbel_of_word(word[e]);
            const unsigned long long v = packed(order_key(score), t);
            if (v > best) {
                best = v;
                best_score = score;
            }
        }
    }
    return static_cast<int>(~static_cast<uint32_t>(block_max(best, s)));
}

}  // namespace ts
