// kernels/tree_accept/config.cuh -- tree-accept's compile-time constants: the slot limit that sizes the staged
// rows, the block shapes of both entry points (exported by tree_accept.cu as kdt_tree_accept_*) and the argmax's
// loads in flight. Used by both entry points.
#pragma once

namespace {

constexpr int kMaxNodes = 1024;        // slots per request (static shared staging: 16 B per slot)
constexpr int kWalkWarps = 1;          // requests (warps) per block in tree_accept_from_predict
constexpr int kArgmaxThreads = 256;    // threads per block in tree_accept_from_logits
constexpr int kArgmaxMinBlocks = 4;    // -> <= 64 registers per thread
constexpr int kArgmaxUnroll = 8;       // 16-byte loads in flight per thread
constexpr int kSplitMinVectors = kArgmaxThreads * 4;  // a vocab split is at least this many 16-byte vectors
constexpr int kIntMax = 0x7FFFFFFF;

static_assert(kMaxNodes % 32 == 0, "path bitmap words");
static_assert(kArgmaxThreads % 32 == 0 && kArgmaxThreads <= 1024, "whole warps");

}  // namespace
