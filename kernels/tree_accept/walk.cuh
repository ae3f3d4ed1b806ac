// kernels/tree_accept/walk.cuh -- the greedy walk both entry points end in: the staged rows (WalkSmem, one 16-byte
// record per slot plus a sentinel), the sequential walk of lane 0 and the warp's output writes. Both entry points
// stage into WalkSmem (tree_accept_from_predict in its body, tree_accept_from_logits in argmax.cuh) and end in
// walk_and_write. See plans/kernels/tree-accept.md, "The walk".
#pragma once

#include <stdint.h>

#include "tree_accept/config.cuh"

namespace {

// One 16-byte record per slot. A link is the byte offset of a record in rec[] (slot * 16), so a scan step is one
// shared load whose result is the next load's address: nothing but the load and one compare on the dependent
// chain. "None" (and any pointer outside [0, N)) links to the sentinel record rec[n], whose token is set to the
// scanned-for prediction before each scan, so the scan loop has a single exit test.
struct WalkSmem {
    uint4 rec[kMaxNodes + 1];        // {token, next_sibling link, predict, first_child link}; rec[n]: sentinel
    uint32_t path[kMaxNodes / 32];   // bit j: slot j is on the accepted path
};

// Plain C++ indexing rather than a cvta'd shared address in inline PTX: the compiler still emits LDS.128 (it
// infers the shared window from `s`), and tools that relocate shared memory (compute-sanitizer racecheck) see an
// ordinary access.
__device__ __forceinline__ uint4 load_rec(const WalkSmem& s, uint32_t link) {
    return *reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(s.rec) + link);
}

// The link of slot p: p's record, or the sentinel rec[n] for -1 and any p outside [0, n).
__device__ __forceinline__ uint32_t link_of(int p, int n) {
    return (static_cast<uint32_t>(p) < static_cast<uint32_t>(n) ? static_cast<uint32_t>(p)
                                                                : static_cast<uint32_t>(n)) * 16u;
}

__device__ __forceinline__ uint4 make_rec(int tok, int fc, int ns, int pred, int n) {
    return make_uint4(static_cast<uint32_t>(tok), link_of(ns, n), static_cast<uint32_t>(pred), link_of(fc, n));
}

// The sequential walk over staged rows (rec[0..n) filled, path[] zeroed). Stores accept_index[1..len] and
// accept_tokens[0..len-1] of the request's output rows as it goes; returns len, the bonus in `bonus`. Every loop
// is bounded even on a malformed tree (see the note, "Robustness").
__device__ __forceinline__ int walk_core(WalkSmem& s, int n, int k, int* __restrict__ index_row,
                                         int* __restrict__ tokens_row, int& bonus) {
    const uint32_t sentinel = static_cast<uint32_t>(n) * 16u;
    int len = 0;
    uint4 cur = s.rec[0];
    s.path[0] = 1u;
    s.rec[n] = make_uint4(0u, sentinel, 0u, sentinel);
    while (len < k) {                               // <= min(K, N-1) rounds (path slots are distinct)
        const uint32_t want = cur.z;
        s.rec[n].x = want;                          // the sentinel ends the scan as a "match"
        uint32_t link = cur.w;
        uint4 r;
        int step = 0;
        for (;;) {                                  // <= N + 1 loads: N distinct slots, then a repeat
            r = load_rec(s, link);
            ++step;
            if ((r.x == want) | (step > n)) break;  // one exit test on the dependent chain
            link = r.y;
        }
        if (r.x != want) break;                     // a sibling scan longer than N steps: a cycle, stop
        if (link == sentinel) break;                // no match (or a pointer outside [0, N)): stop
        const uint32_t found = link >> 4;
        const uint32_t bit = 1u << (found & 31u);
        if (s.path[found >> 5] & bit) break;        // already on the path (a cycle through first_child)
        s.path[found >> 5] |= bit;
        ++len;
        index_row[len] = static_cast<int>(found);
        tokens_row[len - 1] = static_cast<int>(r.x);
        cur = r;
    }
    bonus = static_cast<int>(cur.z);
    return len;
}

// The walk of request g, called by one whole warp once `s` is staged and visible to it.
// Lane 0 walks and stores accepted entries as it goes; then the warp writes slot 0, the bonus and the padding.
__device__ __forceinline__ void walk_and_write(WalkSmem& s, int g, int n, int k, int lane,
                                               int* __restrict__ accept_len, int* __restrict__ accept_index,
                                               int* __restrict__ accept_tokens) {
    int* index_row = accept_index + static_cast<size_t>(g) * static_cast<size_t>(k + 1);
    int* tokens_row = accept_tokens + static_cast<size_t>(g) * static_cast<size_t>(k + 1);
    int len = 0;
    int bonus = 0;
    if (lane == 0) len = walk_core(s, n, k, index_row, tokens_row, bonus);
    len = __shfl_sync(0xFFFFFFFFu, len, 0);
    bonus = __shfl_sync(0xFFFFFFFFu, bonus, 0);
    for (int j = lane; j <= k; j += 32) {
        if (j == 0) index_row[0] = 0;
        else if (j > len) index_row[j] = -1;
        if (j == len) tokens_row[j] = bonus;
        else if (j > len) tokens_row[j] = -1;
    }
    if (lane == 0) accept_len[g] = len;
}

}  // namespace
