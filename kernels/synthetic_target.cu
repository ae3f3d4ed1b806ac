// kernels/synthetic_target.cu -- the synthetic target model of `kdt pipeline` on the GPU. Its numpy twin is
// kdt/pipeline/target.py (the model) and kdt/pipeline/step.py (slot_contexts); the two agree bit for bit.
//
// What it computes
//   A deterministic next-token model over the last three tokens of a text. N-gram order o = 1, 2, 3 hashes the
//   newest o tokens (lowbias32, newest first, starting from mix(0x9E3779B9 * o)) to a bucket of table o - 1; the
//   three embedding rows are summed, clipped to [-clip, clip] and projected to the vocabulary:
//     logits[r, v] = sum_j clip(sum_o emb[o - 1, bucket_o(r), j], -clip, clip) * out_t[j, v].
//   Every weight is a small integer stored as float32 and every logit an integer far below 2**24, so every sum is
//   exact in any order, with or without FMA: the kernels need no particular summation order.
//   Speculative decoding asks for it at every slot of the draft tree: slot i's context is the committed text
//   followed by the tree's path root..i, of which the model reads the last three tokens.
//
// Entry points
//   kdt_pipeline_slot_context(parent, token, depth, committed, groups, slots, last3)
//     parent, token, depth int32 [G, N] (tree-build's outputs), committed int32 [G, 3] (the last three committed
//     tokens, oldest first) -> last3 int32 [G * N, 3]: each slot's last three tokens of committed text + path.
//     The root and unused slots (depth -1) see the committed text alone; parent pointers are clamped to [0, N).
//   kdt_pipeline_target_logits(last3, rows, emb, table_mask, out_t, vocab, logits)
//     last3 int32 [rows, 3], emb float32 [3, table, hidden], out_t float32 [hidden, vocab]
//     -> logits float32 [rows, vocab]. table_mask = table - 1 (table a power of two).
//
// Launch shape (the numbers are exported below; kdt/pipeline/gpu.py reads them from the cubin)
//   slot_context:  one thread per slot; block = kdt_synthetic_target_context_threads,
//                  grid = ceil(G * N / block). No shared memory.
//   target_logits: block = kdt_synthetic_target_logits_threads, grid = ceil(rows / kdt_synthetic_target_rows).
//                  A block first computes the hidden states of its rows into shared memory (rows x hidden floats,
//                  2 KiB static), then each thread takes vocabulary columns v strided by the block and
//                  accumulates all the block's rows at once, so each projection column is loaded once per block.
//
// Memory traffic
//   slot_context:  per slot, reads depth and up to three (parent, token) pairs along its path (gathers within the
//                  request's rows, cache resident) and the request's committed tokens; writes 12 B.
//   target_logits: per row, three gathered embedding rows (3 x hidden x 4 B); per block, out_t once (hidden x vocab
//                  x 4 B, 1 MiB at vocab 4096, served from L2 to every block after the first); writes rows x vocab
//                  x 4 B, coalesced. The writes dominate: G * N * vocab floats per pipeline step.
//
// Limits
//   hidden = kdt_synthetic_target_hidden and clip = kdt_synthetic_target_clip are compile-time (the Python model
//   checks it uses the same); three n-gram orders; table a power of two; G * N * 3 < 2^31 and rows * 3 < 2^31
//   (int indices); rows * vocab may exceed 2^31 (64-bit offsets). Token ids are hashed as they are, never
//   range-checked: any int32 is a valid input.

namespace synthetic_target {

constexpr int kHidden = 64;           // the target's hidden width
constexpr int kClip = 6;              // the non-linearity: clip the hidden state to [-kClip, kClip]
constexpr int kRows = 8;              // target_logits: rows per block (each projection column serves kRows rows)
constexpr int kLogitsThreads = 256;   // target_logits: threads per block
constexpr int kContextThreads = 256;  // slot_context: threads per block
constexpr unsigned int kOrderSalt = 0x9E3779B9u;  // order o starts from mix(kOrderSalt * o)

// lowbias32: the same uint32 arithmetic as kdt/pipeline/hashing.py.
__device__ __forceinline__ unsigned int mix(unsigned int x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

}  // namespace synthetic_target

// Read by kdt/pipeline/gpu.py (launch shape) and checked against kdt/pipeline/target.py (the model's numbers).
extern "C" {
__constant__ int kdt_synthetic_target_hidden = synthetic_target::kHidden;
__constant__ int kdt_synthetic_target_clip = synthetic_target::kClip;
__constant__ int kdt_synthetic_target_rows = synthetic_target::kRows;
__constant__ int kdt_synthetic_target_logits_threads = synthetic_target::kLogitsThreads;
__constant__ int kdt_synthetic_target_context_threads = synthetic_target::kContextThreads;
}

// last3 [G * N, 3]: the last three tokens of the committed text followed by the path root..slot.
extern "C" __global__ void __launch_bounds__(synthetic_target::kContextThreads)
kdt_pipeline_slot_context(const int* __restrict__ parent, const int* __restrict__ token,
                          const int* __restrict__ depth, const int* __restrict__ committed, int groups, int slots,
                          int* __restrict__ last3) {
    const int row = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (row >= groups * slots) return;
    const int g = row / slots;
    const int base = g * slots;
    const int path_len = depth[row] < 0 ? 0 : depth[row];
    int cur = row - base;
    for (int back = 0; back < 3; ++back) {  // newest first
        int t;
        if (back < path_len) {
            t = token[base + cur];
            const int up = parent[base + cur];
            cur = up < 0 ? 0 : (up >= slots ? slots - 1 : up);
        } else {
            t = committed[g * 3 + 2 - (back - path_len)];
        }
        last3[row * 3 + 2 - back] = t;
    }
}

// logits [rows, vocab] = clip(sum over n-gram orders of emb[order][hash]) @ out_t; kRows rows per block.
extern "C" __global__ void __launch_bounds__(synthetic_target::kLogitsThreads)
kdt_pipeline_target_logits(const int* __restrict__ last3, int rows, const float* __restrict__ emb,
                           unsigned int table_mask, const float* __restrict__ out_t, int vocab,
                           float* __restrict__ logits) {
    using namespace synthetic_target;
    __shared__ float hidden[kRows][kHidden];
    const int row0 = static_cast<int>(blockIdx.x) * kRows;
    const unsigned long long table = static_cast<unsigned long long>(table_mask) + 1ull;
    const float clip = static_cast<float>(kClip);
    for (int e = static_cast<int>(threadIdx.x); e < kRows * kHidden; e += static_cast<int>(blockDim.x)) {
        const int r = e / kHidden, j = e % kHidden;
        const int row = row0 + r;
        float value = 0.0f;
        if (row < rows) {
            float sum = 0.0f;
            for (int order = 1; order <= 3; ++order) {
                unsigned int x = mix(kOrderSalt * static_cast<unsigned int>(order));
                for (int back = 0; back < order; ++back) {
                    x = mix(x ^ static_cast<unsigned int>(last3[row * 3 + 2 - back]));
                }
                const unsigned int bucket = x & table_mask;
                sum += emb[(static_cast<unsigned long long>(order - 1) * table + bucket) * kHidden + j];
            }
            value = fminf(fmaxf(sum, -clip), clip);
        }
        hidden[r][j] = value;
    }
    __syncthreads();
    for (int v = static_cast<int>(threadIdx.x); v < vocab; v += static_cast<int>(blockDim.x)) {
        float acc[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
        for (int j = 0; j < kHidden; ++j) {
            const float w = out_t[static_cast<unsigned long long>(j) * vocab + v];
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r] += hidden[r][j] * w;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            if (row0 + r < rows) logits[static_cast<unsigned long long>(row0 + r) * vocab + v] = acc[r];
        }
    }
}
