// kernels/topk/elements.cuh -- the element types: Elem<float> and Elem<uint16_t> (bf16 bits) say how a 16-byte
// vector of logits loads, unpacks to floats, yields its maximum and one element at a runtime index; Elem1 is one
// scalar float (the small path's unaligned head and tail); pick reads an unpacked element at a runtime index. Used
// by every entry point (the general path only through Elem<T>::load1).
#pragma once

#include <stdint.h>

#include "common/ptx.cuh"
#include "topk/keys.cuh"

namespace topk {

using kdt::bf16x2_max;

// Vec: one 16-byte load; unpack: its W elements as floats. The hot loop takes a step's maximum before it unpacks
// anything: VMax is a vector's maximum in the form that is cheapest to combine (bf16: a packed pair, one HMNMX2
// per pair of pairs), vmax/vmax2 combine, vmax_float turns the result into the float maximum. A maximum is always
// one of the elements (max never rounds), so its key is an element's key.
// a[e] for a runtime e without local memory (a select chain over the registers).
template <int N>
__device__ __forceinline__ float pick(const float (&a)[N], int e) {
    float r = a[0];
#pragma unroll
    for (int i = 1; i < N; ++i) r = e == i ? a[i] : r;
    return r;
}

// w[i] for a runtime i < N (N a power of two) by a tree of selects on i's bits: N - 1 selects, no local memory.
template <int N>
__device__ __forceinline__ uint32_t select_word(const uint32_t (&w)[N], int i) {
    static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
    uint32_t t[N];
#pragma unroll
    for (int k = 0; k < N; ++k) t[k] = w[k];
#pragma unroll
    for (int s = 1; s < N; s *= 2) {
#pragma unroll
        for (int k = 0; k < N; k += 2 * s) t[k] = (i & s) ? t[k + s] : t[k];
    }
    return t[0];
}

template <typename Tin> struct Elem;
template <> struct Elem<float> {
    using Vec = float4;
    using VMax = float;
    static constexpr int W = 4;
    __device__ static __forceinline__ Vec ninf_vec() {
        const float n = neg_inf();
        return make_float4(n, n, n, n);
    }
    __device__ static __forceinline__ void unpack(const Vec& v, float (&x)[W]) {
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    }
    __device__ static __forceinline__ float load1(const float* p) { return __ldg(p); }
    __device__ static __forceinline__ Vec from_bits(const uint4& b) {
        return make_float4(__uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w));
    }
    __device__ static __forceinline__ VMax vmax(const Vec& v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }
    // element e of vector `vector` of 16-byte vectors at `data` (shared memory)
    __device__ static __forceinline__ float element(const uint4* data, int vector, int e) {
        return reinterpret_cast<const float*>(data)[vector * W + e];
    }
    __device__ static __forceinline__ VMax vmax2(VMax a, VMax b) { return fmaxf(a, b); }
    __device__ static __forceinline__ float vmax_float(VMax a) { return a; }
    // element b of H vectors in a row (vector b / W, element b % W) for a runtime b (selects, no local memory)
    template <int H>
    __device__ static __forceinline__ float at(const Vec (&v)[H], int b) {
        if constexpr (H == 1) {
            const float x[W] = {v[0].x, v[0].y, v[0].z, v[0].w};
            return pick(x, b);
        } else {
            uint32_t w[4 * H];
#pragma unroll
            for (int u = 0; u < H; ++u) {
                w[4 * u] = __float_as_uint(v[u].x); w[4 * u + 1] = __float_as_uint(v[u].y);
                w[4 * u + 2] = __float_as_uint(v[u].z); w[4 * u + 3] = __float_as_uint(v[u].w);
            }
            return __uint_as_float(select_word(w, b));
        }
    }
};

// bf16: of -0.0 / +0.0 bf16x2_max may return either, which no user of a maximum can tell apart (f2key maps -0.0
// to +0.0; compares treat them as equal; x - m and the exponentials are the same for both).
template <> struct Elem<uint16_t> {
    using Vec = uint4;
    using VMax = uint32_t;              // a bf16 pair: the maxima of the vector's even and odd elements
    static constexpr int W = 8;
    __device__ static __forceinline__ Vec ninf_vec() { return make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u); }
    // bf16 -> float is exact: the bf16 bits are the high half of the float's (one IMAD.U32 or LOP3 each)
    __device__ static __forceinline__ void unpack(const Vec& v, float (&x)[W]) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {      // little endian: element 2i in the low half
            x[2 * i] = __uint_as_float(w[i] << 16);
            x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    __device__ static __forceinline__ float load1(const uint16_t* p) {
        return __uint_as_float((uint32_t)__ldg(reinterpret_cast<const unsigned short*>(p)) << 16);
    }
    __device__ static __forceinline__ Vec from_bits(const uint4& b) { return b; }
    __device__ static __forceinline__ float element(const uint4* data, int vector, int e) {
        return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t*>(data)[vector * W + e] << 16);
    }
    __device__ static __forceinline__ VMax vmax(const Vec& v) {
        return bf16x2_max(bf16x2_max(v.x, v.y), bf16x2_max(v.z, v.w));
    }
    __device__ static __forceinline__ VMax vmax2(VMax a, VMax b) { return bf16x2_max(a, b); }
    // the larger half as a float: the max of the pair and its swap holds it in both halves
    __device__ static __forceinline__ float vmax_float(VMax p) {
        return __uint_as_float(bf16x2_max(p, __byte_perm(p, 0u, 0x1032)) & 0xffff0000u);
    }
    // element b of H vectors in a row (vector b / W, element b % W) for a runtime b: its pair by selects, then its
    // half
    template <int H>
    __device__ static __forceinline__ float at(const Vec (&v)[H], int b) {
        uint32_t w[4 * H];
#pragma unroll
        for (int u = 0; u < H; ++u) {
            w[4 * u] = v[u].x; w[4 * u + 1] = v[u].y; w[4 * u + 2] = v[u].z; w[4 * u + 3] = v[u].w;
        }
        const uint32_t pair = select_word(w, b >> 1);
        return __uint_as_float((b & 1) ? (pair & 0xffff0000u) : (pair << 16));
    }
};

// The scalar head and tail elements of the small path (already floats, one per lane).
struct Elem1 {
    using Vec = float;
    using VMax = float;
    static constexpr int W = 1;
    __device__ static __forceinline__ void unpack(const Vec& v, float (&x)[W]) { x[0] = v; }
    __device__ static __forceinline__ VMax vmax(const Vec& v) { return v; }
    __device__ static __forceinline__ VMax vmax2(VMax a, VMax b) { return fmaxf(a, b); }
    __device__ static __forceinline__ float vmax_float(VMax a) { return a; }
};

}  // namespace topk
