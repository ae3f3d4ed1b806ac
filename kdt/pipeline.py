"""`kdt pipeline`: DDTree speculative decoding end to end, on a synthetic but honest pair of models.

Every step does what an engine does: the drafter's logits for the next K positions, `topk`, `tree-build`, the
target at every slot of the tree (slot i's context is the committed text plus the path root..i), `tree-accept`,
then the accepted tokens and the bonus are appended. At the end each request's tokens are compared, token for
token, with the target's plain greedy decoding: speculative decoding must be lossless.

The models
- target: a deterministic next-token model. The last 1, 2 and 3 tokens are hashed (uint32) into three
  embedding tables, the sum is clipped (the non-linearity) and projected to the vocabulary. Every weight is a
  small integer stored as float32, so every logit is an integer far below 2**24: the sums are exact in any
  order, with or without FMA or TF32, and the numpy and CUDA versions agree bit for bit. Greedy = argmax,
  equal logits to the smaller id (the contract's rule).
- drafter: for each of the K positions, the target's greedy token given the committed text and the
  drafter's own earlier guesses (the truth). With probability `draft_quality` the drafter's top choice is the
  truth; otherwise it is a wrong token, and then, with probability `draft_quality` again, the truth is its
  second choice (a near miss the tree can still accept), else the truth gets no mass at all (-inf), so a
  quality-0 drafter is never accepted and a quality-1 drafter is accepted to the full depth K. Three more
  candidates and a quantised noise floor give the tree alternatives. All randomness is a counter-based hash of
  (seed, step, request, position, token), so the numpy and CuPy drafters produce the same logits.

Backends
- cpu: the numpy references (`refs/`) for the three kdt stages, numpy for the models, time.perf_counter per stage.
- gpu: `kdt.ops` on CuPy arrays. topk, tree-build, the target at every slot (two small kernels below) and
  tree-accept run captured in one CUDA graph, replayed each step on fixed buffers (eager launches hide where
  the time goes). Each stage is also captured alone, to time it; and the references are run on the same step's
  inputs on the CPU, which times what engines do today and checks every kernel output against them.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import refs.topk as ref_topk
import refs.tree_accept as ref_tree_accept
import refs.tree_build as ref_tree_build
from kdt.stages.topk import LOGP_ATOL as TOPK_LOGP_ATOL
from refs.errors import BadInput

BACKENDS = ("gpu", "cpu")
PROMPT_LEN = 8            # random prompt tokens per request (>= 3: the target reads the last three)
HIDDEN = 64               # the target's hidden width (the CUDA kernel below assumes 64)
TABLE = 4096              # hash buckets per n-gram order (a power of two)
EMB_RANGE = 3             # embedding entries are integers in [-3, 3]
OUT_RANGE = 7             # projection entries are integers in [-7, 7]
CLIP = 6.0                # the non-linearity: clip the hidden state to [-6, 6]
MIN_VOCAB, MAX_VOCAB = 16, 262144
MAX_TARGET_LOGITS = 2**31  # elements of the [G, N, vocab] target logits buffer (8 GiB of float32)

# Drafter logits: a noise floor in [0, 2) quantised to 2**-12 (so every sum below is exact in float32), three
# spread candidates, the near-miss truth and the top guess. The top guess leads the next candidate by at least
# 4 nats, so a full-depth chain of top guesses (K <= 64) outscores every alternative: with B >= K the tree
# holds the drafter's whole top-1 chain.
NOISE_SHIFT = 19          # 32 - 13 bits of noise
NOISE_SCALE = 2.0**-12
GUESS_BOOST = 16.0
NEAR_BOOST = 12.0
SPREAD_BOOSTS = (10.0, 9.0, 8.0)
SALT_RIGHT, SALT_NEAR, SALT_WRONG, SALT_NOISE, SALT_SPREAD = 0x1001, 0x1002, 0x1003, 0x1004, 0x1010

STAGES = ("drafter", "topk", "tree-build", "target", "tree-accept", "append")
KDT_STAGES = ("topk", "tree-build", "tree-accept")
GRAPH_STAGES = ("topk", "tree-build", "target", "tree-accept")  # what one CUDA graph replay runs
STAGE_KIND = {"drafter": "model", "topk": "kdt stage", "tree-build": "kdt stage", "target": "model",
              "tree-accept": "kdt stage", "append": "bookkeeping"}


# --------------------------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class PipelineConfig:
    batch: int = 8
    budget: int = 63
    depth: int = 8
    topk: int = 8
    tokens: int = 128
    seed: int = 0
    backend: str = "gpu"
    draft_quality: float = 0.8
    vocab: int = 4096

    @property
    def slots(self) -> int:
        return self.budget + 1

    @property
    def max_len(self) -> int:
        # room for the prompt, the tokens, and one step's K + 1 writes past the end (see `append_accepted`)
        return PROMPT_LEN + self.tokens + self.depth + 1


def validate(config: PipelineConfig) -> None:
    """Bad options -> BadInput naming the option (exit code 3)."""

    def need(ok: bool, option: str, expected: str, actual) -> None:
        if not ok:
            raise BadInput(option, expected, actual)

    need(config.backend in BACKENDS, "--backend", "gpu or cpu", config.backend)
    need(config.batch >= 1, "--batch", "an integer >= 1", config.batch)
    need(1 <= config.budget <= ref_tree_build.MAX_BUDGET, "--budget", f"an integer in [1, {ref_tree_build.MAX_BUDGET}]",
         config.budget)
    need(1 <= config.depth <= ref_tree_build.MAX_DEPTH, "--depth", f"an integer in [1, {ref_tree_build.MAX_DEPTH}]",
         config.depth)
    need(MIN_VOCAB <= config.vocab <= MAX_VOCAB, "--vocab", f"an integer in [{MIN_VOCAB}, {MAX_VOCAB}]", config.vocab)
    need(1 <= config.topk <= min(ref_topk.MAX_K, config.vocab), "--topk",
         f"an integer in [1, min(1024, --vocab={config.vocab})]", config.topk)
    need(config.tokens >= 1, "--tokens", "an integer >= 1", config.tokens)
    need(config.seed >= 0, "--seed", "an integer >= 0", config.seed)
    quality = config.draft_quality
    need(isinstance(quality, (int, float)) and 0.0 <= quality <= 1.0, "--draft-quality", "a number in [0, 1]", quality)
    elements = config.batch * config.slots * config.vocab
    need(elements <= MAX_TARGET_LOGITS, "--batch/--budget/--vocab",
         f"target logits of at most {MAX_TARGET_LOGITS} elements (batch * (budget + 1) * vocab)", elements)


# --------------------------------------------------------------------------------------------------------------
# counter-based hashing: the same uint32 arithmetic in numpy, CuPy and the CUDA kernel

_MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B


def _mix_int(x: int) -> int:
    """lowbias32 on a Python int (scalars stay in Python: numpy scalars warn on the intended overflow)."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * _M1) & _MASK32
    x ^= x >> 15
    x = (x * _M2) & _MASK32
    return x ^ (x >> 16)


def _mix(x):
    """lowbias32 on a uint32 array (numpy or CuPy): multiplication wraps modulo 2**32."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(_M1)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(_M2)
    return x ^ (x >> np.uint32(16))


def _key(*parts: int) -> int:
    x = 0
    for part in parts:
        x = _mix_int(x ^ (part & _MASK32))
    return x


def _hash(xp, key: int, *arrays):
    """Hash of (key, arrays...) elementwise, broadcast; at least one array (1-d or more). The array is always
    the left operand, so a numpy scalar never has to dispatch to a CuPy array."""
    x = None
    for array in arrays:
        part = array.astype(xp.uint32)
        x = _mix(part ^ np.uint32(key) if x is None else x ^ part)
    return x


def _uniform(xp, key: int, *arrays):
    """Uniform in [0, 1) with 24 bits, float64: `u < 1.0` always holds and `u < 0.0` never does."""
    return (_hash(xp, key, *arrays) >> np.uint32(8)).astype(xp.float64) * 2.0**-24


def greedy(xp, logits):
    """argmax over the last axis, equal logits to the smaller id (stated, not left to the library)."""
    vocab = logits.shape[-1]
    best = logits.max(axis=-1, keepdims=True)
    ids = xp.arange(vocab, dtype=xp.int32)
    return xp.where(logits == best, ids, np.int32(vocab)).min(axis=-1).astype(xp.int32)


# --------------------------------------------------------------------------------------------------------------
# the target model

_ORDER_SALTS = tuple((0x9E3779B9 * order) & _MASK32 for order in (1, 2, 3))


@dataclass(frozen=True)
class TargetModel:
    emb: np.ndarray    # float32 [3, TABLE, HIDDEN]: one table per n-gram order, integer entries
    out_t: np.ndarray  # float32 [HIDDEN, vocab]: the projection, integer entries

    @classmethod
    def create(cls, seed: int, vocab: int) -> "TargetModel":
        rng = np.random.default_rng([seed, 1])
        emb = rng.integers(-EMB_RANGE, EMB_RANGE + 1, (3, TABLE, HIDDEN)).astype(np.float32)
        out_t = rng.integers(-OUT_RANGE, OUT_RANGE + 1, (HIDDEN, vocab)).astype(np.float32)
        return cls(emb, out_t)

    @property
    def vocab(self) -> int:
        return self.out_t.shape[1]

    def hidden(self, last3: np.ndarray) -> np.ndarray:
        """last3 int32 [R, 3] (oldest .. newest) -> float32 [R, HIDDEN]."""
        tokens = last3.astype(np.uint32)
        total = np.zeros((last3.shape[0], HIDDEN), np.float32)
        for order in (1, 2, 3):
            x = _mix(np.full(last3.shape[0], _ORDER_SALTS[order - 1], np.uint32))
            for back in range(order):  # newest first
                x = _mix(x ^ tokens[:, 2 - back])
            total += self.emb[order - 1][(x & np.uint32(TABLE - 1)).astype(np.int64)]
        return np.clip(total, -CLIP, CLIP)

    def logits(self, last3: np.ndarray) -> np.ndarray:
        """last3 int32 [R, 3] -> float32 [R, vocab], every value an exact integer."""
        return self.hidden(last3) @ self.out_t


def greedy_decode(model: TargetModel, prompts: np.ndarray, tokens: int) -> np.ndarray:
    """The target alone, one token at a time: what speculative decoding must reproduce. -> int32 [G, tokens]."""
    sequence = prompts.astype(np.int32)
    out = np.empty((prompts.shape[0], tokens), np.int32)
    for position in range(tokens):
        nxt = greedy(np, model.logits(sequence[:, -3:]))
        out[:, position] = nxt
        sequence = np.concatenate([sequence[:, -2:], nxt[:, None]], axis=1)
    return out


def make_prompts(seed: int, batch: int, vocab: int) -> np.ndarray:
    return np.random.default_rng([seed, 2]).integers(0, vocab, (batch, PROMPT_LEN)).astype(np.int32)


# --------------------------------------------------------------------------------------------------------------
# the drafter


def _noise(xp, row_key, tokens):
    """The noise floor at `tokens` of rows hashed to `row_key`: k * 2**-12, k in [0, 8192)."""
    bits = _mix(row_key ^ tokens.astype(xp.uint32)) >> np.uint32(NOISE_SHIFT)
    return bits.astype(xp.float32) * np.float32(NOISE_SCALE)


def draft_logits(xp, target_greedy: Callable, committed_last3, *, step: int, seed: int, depth: int, vocab: int,
                 quality: float):
    """float32 [G, K, vocab]: the drafter's logits for the next K positions (see the module docstring).

    `target_greedy(last3 [G, 3] int32) -> [G] int32` is the target's greedy token; numpy or CuPy (xp).
    """
    groups = committed_last3.shape[0]
    request = xp.arange(groups, dtype=xp.uint32)
    rows = xp.arange(groups, dtype=xp.int64)
    every_token = xp.arange(vocab, dtype=xp.uint32)[None, :]
    logits = xp.empty((groups, depth, vocab), xp.float32)
    context = committed_last3
    for position in range(depth):
        def key(salt: int) -> int:
            return _key(seed, salt, step, position)

        truth = target_greedy(context)
        right = _uniform(xp, key(SALT_RIGHT), request) < quality
        near = _uniform(xp, key(SALT_NEAR), request) < quality
        offset = (_hash(xp, key(SALT_WRONG), request) % np.uint32(vocab - 1)).astype(xp.int32)
        wrong = (truth + np.int32(1) + offset) % np.int32(vocab)  # never the truth
        guess = xp.where(right, truth, wrong).astype(xp.int32)

        row_key = _hash(xp, key(SALT_NOISE), request)
        row = _noise(xp, row_key[:, None], every_token)
        # later assignments win: spread candidates, then the truth on a miss, then the top guess
        for rank, boost in enumerate(SPREAD_BOOSTS):
            spread = (_hash(xp, key(SALT_SPREAD + rank), request) % np.uint32(vocab)).astype(xp.int64)
            row[rows, spread] = _noise(xp, row_key, spread) + np.float32(boost)
        missed = xp.where(near, _noise(xp, row_key, truth) + np.float32(NEAR_BOOST), np.float32(-np.inf))
        row[rows, truth] = xp.where(right, row[rows, truth], missed.astype(xp.float32))
        row[rows, guess] = _noise(xp, row_key, guess) + np.float32(GUESS_BOOST)
        logits[:, position, :] = row
        context = xp.concatenate([context[:, 1:], guess[:, None]], axis=1)
    return logits


# --------------------------------------------------------------------------------------------------------------
# pieces of a step shared by both backends


def committed_last3(xp, seq, seq_len):
    """The last three committed tokens of each request, [G, 3] int32 (the last one is the tree's root)."""
    groups = seq.shape[0]
    columns = seq_len[:, None] - 3 + xp.arange(3)[None, :]
    return seq[xp.arange(groups)[:, None], columns].astype(xp.int32)


def slot_contexts(parent: np.ndarray, token: np.ndarray, depth: np.ndarray, last3: np.ndarray) -> np.ndarray:
    """The target's context at every tree slot: the last three tokens of committed text + path root..slot.

    [G, N, 3] int32. The root (and an unused slot) sees the committed text alone. Mirrors the CUDA kernel
    `kdt_pipeline_slot_context`.
    """
    groups, slots = parent.shape
    rows = np.arange(groups)[:, None]
    path_len = np.maximum(depth, 0)
    cur = np.broadcast_to(np.arange(slots), (groups, slots)).copy()
    out = np.empty((groups, slots, 3), np.int32)
    for back in range(3):  # newest first
        on_path = back < path_len
        committed = last3[rows, np.clip(2 - (back - path_len), 0, 2)]
        out[:, :, 2 - back] = np.where(on_path, token[rows, cur], committed)
        cur = np.where(on_path, np.clip(parent[rows, cur], 0, slots - 1), cur)
    return out


def append_accepted(xp, seq, seq_len, accept_len, accept_tokens, tokens: int) -> None:
    """Append each request's accepted tokens and its bonus, never past `tokens` generated; in place.

    All K + 1 entries are written at seq_len.. (no data-dependent shapes, no host sync); those past the new
    length are overwritten by the next step before anything reads them (max_len leaves room for them).
    """
    groups, width = accept_tokens.shape
    remaining = (PROMPT_LEN + tokens) - seq_len
    count = xp.minimum(accept_len + 1, remaining).astype(seq_len.dtype)
    flat = (xp.arange(groups) * seq.shape[1])[:, None] + seq_len[:, None] + xp.arange(width)[None, :]
    seq.reshape(-1)[flat] = accept_tokens
    seq_len += count


# --------------------------------------------------------------------------------------------------------------
# results


@dataclass
class StageTiming:
    name: str
    kind: str
    ms: list[float] = field(default_factory=list)            # per step, the backend's time
    reference_ms: list[float] = field(default_factory=list)  # gpu backend: the CPU references on the same inputs

    @staticmethod
    def _median(values: list[float]) -> float | None:
        return float(np.median(values)) if values else None

    @property
    def median_ms(self) -> float | None:
        return self._median(self.ms)

    @property
    def reference_median_ms(self) -> float | None:
        return self._median(self.reference_ms)


@dataclass(frozen=True)
class Mismatch:
    request: int
    position: int
    expected: int
    got: int
    requests_affected: int


@dataclass
class PipelineResult:
    config: PipelineConfig
    device: str
    generated: np.ndarray         # int32 [G, tokens], speculative
    greedy: np.ndarray            # int32 [G, tokens], the target alone
    accept_lens: list[np.ndarray]  # per step: accept_len of the requests still generating at that step
    request_steps: np.ndarray     # int [G]: steps in which each request was generating
    timings: dict[str, StageTiming]
    graph_ms: list[float] = field(default_factory=list)  # gpu: one replay of the step graph, per step
    disagreements: dict[str, str] = field(default_factory=dict)  # gpu: stage -> first output unlike the reference

    @property
    def steps(self) -> int:
        return len(self.accept_lens)

    @property
    def mismatch(self) -> Mismatch | None:
        wrong = self.generated != self.greedy
        if not wrong.any():
            return None
        request = int(np.flatnonzero(wrong.any(axis=1))[0])
        position = int(np.flatnonzero(wrong[request])[0])
        return Mismatch(request, position, int(self.greedy[request, position]), int(self.generated[request, position]),
                        int(wrong.any(axis=1).sum()))

    @property
    def lossless(self) -> bool:
        return self.mismatch is None

    @property
    def passed(self) -> bool:
        return self.lossless and not self.disagreements

    @property
    def all_accept_lens(self) -> np.ndarray:
        return np.concatenate(self.accept_lens) if self.accept_lens else np.zeros(0, np.int32)

    @property
    def mean_accept_len(self) -> float:
        lens = self.all_accept_lens
        return float(lens.mean()) if lens.size else 0.0

    @property
    def tokens_generated(self) -> int:
        return int(self.generated.size)

    @property
    def tokens_per_target_call(self) -> float:
        """Tokens per request per target call; plain greedy decoding makes 1."""
        calls = int(self.request_steps.sum())
        return self.tokens_generated / calls if calls else 0.0


# --------------------------------------------------------------------------------------------------------------
# the cpu backend: the references


def _run_cpu(config: PipelineConfig, model: TargetModel, prompts: np.ndarray) -> PipelineResult:
    G, K, N, vocab = config.batch, config.depth, config.slots, config.vocab
    seq = np.zeros((G, config.max_len), np.int32)
    seq[:, :PROMPT_LEN] = prompts
    seq_len = np.full(G, PROMPT_LEN, np.int32)
    end = PROMPT_LEN + config.tokens
    timings = {name: StageTiming(name, STAGE_KIND[name]) for name in STAGES}
    accept_lens, request_steps = [], np.zeros(G, np.int64)

    def target_greedy(last3):
        return greedy(np, model.logits(last3))

    step = 0
    while (seq_len < end).any():
        _guard(step, config)
        active = seq_len < end
        clock = _Clock(timings)
        last3 = committed_last3(np, seq, seq_len)
        logits = draft_logits(np, target_greedy, last3, step=step, seed=config.seed, depth=K, vocab=vocab,
                              quality=config.draft_quality)
        clock.lap("drafter")
        top = ref_topk.topk(logits, config.topk)
        clock.lap("topk")
        tree = ref_tree_build.tree_build(top["top_logp"], top["top_ids"], config.budget)
        clock.lap("tree-build")
        contexts = slot_contexts(tree["parent"], tree["token"], tree["depth"], last3)
        target_logits = model.logits(contexts.reshape(-1, 3)).reshape(G, N, vocab)
        clock.lap("target")
        accepted = ref_tree_accept.tree_accept(tree["token"], tree["first_child"], tree["next_sibling"],
                                               tree["n_nodes"], K, target_logits=target_logits)
        clock.lap("tree-accept")
        append_accepted(np, seq, seq_len, accepted["accept_len"], accepted["accept_tokens"], config.tokens)
        clock.lap("append")
        accept_lens.append(np.asarray(accepted["accept_len"])[active].astype(np.int32))
        request_steps += active
        step += 1
    device = f"CPU ({platform.processor() or platform.machine()}), numpy references"
    return PipelineResult(config, device, seq[:, PROMPT_LEN:end].copy(), np.empty(0), accept_lens, request_steps,
                          timings)


class _Clock:
    """perf_counter laps into StageTiming.ms (or .reference_ms)."""

    def __init__(self, timings: dict[str, StageTiming], reference: bool = False):
        self.timings, self.reference = timings, reference
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        timing = self.timings[name]
        (timing.reference_ms if self.reference else timing.ms).append((now - self.last) * 1e3)
        self.last = now


def _guard(step: int, config: PipelineConfig) -> None:
    # every step appends at least the bonus token to each request still generating
    if step > config.tokens:
        raise RuntimeError(f"kdt pipeline: {step} steps for {config.tokens} tokens: a step appended nothing")


# --------------------------------------------------------------------------------------------------------------
# the gpu backend: kdt.ops, one CUDA graph per step

_TARGET_ROWS = 8       # rows of the target per block: each projection column loaded once serves 8 rows
_TARGET_THREADS = 256
_CONTEXT_THREADS = 256

_CUDA_SOURCE = r"""
// The pipeline's synthetic target on the GPU (kdt/pipeline.py mirrors both kernels in numpy).
// Integer-valued float32 weights: every logit is an exact integer, whatever the order of the sums.

#define KDT_HIDDEN 64
#define KDT_ROWS 8
#define KDT_CLIP 6.0f

__device__ __forceinline__ unsigned int kdt_mix(unsigned int x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// last3 [G * N, 3]: the last three tokens of the committed text followed by the path root..slot.
extern "C" __global__ void kdt_pipeline_slot_context(const int* __restrict__ parent, const int* __restrict__ token,
                                                     const int* __restrict__ depth, const int* __restrict__ committed,
                                                     int groups, int slots, int* __restrict__ last3) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= groups * slots) return;
    int g = row / slots;
    int base = g * slots;
    int path_len = depth[row] < 0 ? 0 : depth[row];
    int cur = row - base;
    for (int back = 0; back < 3; ++back) {
        int t;
        if (back < path_len) {
            t = token[base + cur];
            int up = parent[base + cur];
            cur = up < 0 ? 0 : (up >= slots ? slots - 1 : up);
        } else {
            int index = 2 - (back - path_len);
            t = committed[g * 3 + index];
        }
        last3[row * 3 + 2 - back] = t;
    }
}

// logits [rows, vocab] = clip(sum over n-gram orders of emb[order][hash]) @ out_t; KDT_ROWS rows per block.
extern "C" __global__ void kdt_pipeline_target_logits(const int* __restrict__ last3, int rows,
                                                      const float* __restrict__ emb, unsigned int table_mask,
                                                      const float* __restrict__ out_t, int vocab,
                                                      float* __restrict__ logits) {
    __shared__ float hidden[KDT_ROWS][KDT_HIDDEN];
    int row0 = blockIdx.x * KDT_ROWS;
    unsigned int table = table_mask + 1u;
    for (int e = threadIdx.x; e < KDT_ROWS * KDT_HIDDEN; e += blockDim.x) {
        int r = e / KDT_HIDDEN, j = e % KDT_HIDDEN;
        int row = row0 + r;
        float value = 0.0f;
        if (row < rows) {
            float sum = 0.0f;
            for (int order = 1; order <= 3; ++order) {
                unsigned int x = kdt_mix(0x9E3779B9u * (unsigned int)order);
                for (int back = 0; back < order; ++back) x = kdt_mix(x ^ (unsigned int)last3[row * 3 + 2 - back]);
                unsigned int bucket = x & table_mask;
                sum += emb[((unsigned long long)(order - 1) * table + bucket) * KDT_HIDDEN + j];
            }
            value = fminf(fmaxf(sum, -KDT_CLIP), KDT_CLIP);
        }
        hidden[r][j] = value;
    }
    __syncthreads();
    for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
        float acc[KDT_ROWS];
#pragma unroll
        for (int r = 0; r < KDT_ROWS; ++r) acc[r] = 0.0f;
        for (int j = 0; j < KDT_HIDDEN; ++j) {
            float w = out_t[(unsigned long long)j * vocab + v];
#pragma unroll
            for (int r = 0; r < KDT_ROWS; ++r) acc[r] += hidden[r][j] * w;
        }
#pragma unroll
        for (int r = 0; r < KDT_ROWS; ++r) {
            if (row0 + r < rows) logits[(unsigned long long)(row0 + r) * vocab + v] = acc[r];
        }
    }
}
"""


class _GpuSteps:
    """Fixed device buffers, the stages as closures over them, and their CUDA graphs."""

    def __init__(self, config: PipelineConfig, model: TargetModel):
        from kdt import ops, runtime, stages

        cp = runtime.cupy()
        self.cp, self.ops, self.config = cp, ops, config
        G, K, N, V, vocab = config.batch, config.depth, config.slots, config.topk, config.vocab
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            module = cp.RawModule(code=_CUDA_SOURCE)
            self.context_kernel = module.get_function("kdt_pipeline_slot_context")
            self.target_kernel = module.get_function("kdt_pipeline_target_logits")
            self.emb = cp.asarray(model.emb)
            self.out_t = cp.asarray(model.out_t)
            # every buffer a graph touches lives as long as this object: the graphs hold raw pointers
            self.committed = cp.zeros((G, 3), cp.int32)
            self.logits = cp.zeros((G, K, vocab), cp.float32)
            self.top = {"top_ids": cp.zeros((G, K, V), cp.int32), "top_logp": cp.zeros((G, K, V), cp.float32)}
            build_spec = stages.get("tree-build")
            layout = build_spec.output_layout({"top_logp": (G, K, V), "top_ids": (G, K, V)}, {"budget": config.budget})
            self.tree = {name: cp.zeros(want.shape, np.dtype(want.dtype)) for name, want in layout.items()}
            self.slot_last3 = cp.zeros((G * N, 3), cp.int32)
            self.target_logits = cp.zeros((G, N, vocab), cp.float32)
            self.accepted = {"accept_len": cp.zeros(G, cp.int32), "accept_index": cp.zeros((G, K + 1), cp.int32),
                             "accept_tokens": cp.zeros((G, K + 1), cp.int32)}
            self.draft_target = cp.zeros((G, vocab), cp.float32)
            # workspaces sized as ops.run would size them, so nothing is allocated inside a capture
            self.topk_workspace = ops.workspace_for(stages.get("topk"), {"logits": (G, K, vocab)},
                                                    {"k": V, "logits_dtype": "float32"})
            self.build_workspace = ops.workspace_for(build_spec, {"top_logp": (G, K, V), "top_ids": (G, K, V)},
                                                     {"budget": config.budget, "top_logp_dtype": "float32",
                                                      "top_ids_dtype": "int32"})
            accept_shapes = {name: (G, N) for name in ("token", "first_child", "next_sibling")}
            accept_shapes.update(n_nodes=(G,), target_logits=(G, N, vocab))
            self.accept_workspace = ops.workspace_for(
                stages.get("tree-accept"), accept_shapes,
                {"max_depth": K, "target_logits_dtype": "float32",
                 **{f"{name}_dtype": "int32" for name in ("token", "first_child", "next_sibling", "n_nodes")}})
        self.functions = {"topk": self.topk, "tree-build": self.tree_build, "target": self.target,
                          "tree-accept": self.tree_accept}
        self.step_graph = None
        self.stage_graphs: dict[str, object] = {}

    # the stages, on the fixed buffers ---------------------------------------------------------------------

    def topk(self) -> None:
        self.ops.topk(self.logits, self.config.topk, out=self.top, workspace=self.topk_workspace)

    def tree_build(self) -> None:
        self.ops.tree_build(self.top["top_logp"], self.top["top_ids"], self.config.budget, out=self.tree,
                            workspace=self.build_workspace)

    def target(self) -> None:
        G, N = self.config.batch, self.config.slots
        rows = G * N
        self.context_kernel(((rows + _CONTEXT_THREADS - 1) // _CONTEXT_THREADS,), (_CONTEXT_THREADS,),
                            (self.tree["parent"], self.tree["token"], self.tree["depth"], self.committed,
                             np.int32(G), np.int32(N), self.slot_last3))
        self.target_rows(self.slot_last3, self.target_logits)

    def tree_accept(self) -> None:
        t = self.tree
        self.ops.tree_accept(t["token"], t["first_child"], t["next_sibling"], t["n_nodes"], self.config.depth,
                             target_logits=self.target_logits, out=self.accepted, workspace=self.accept_workspace)

    def target_rows(self, last3, out) -> None:
        """The target's logits for each row of last3 [R, 3] into out [R, vocab] (or [G, N, vocab])."""
        rows = int(last3.shape[0])
        self.target_kernel(((rows + _TARGET_ROWS - 1) // _TARGET_ROWS,), (_TARGET_THREADS,),
                           (last3, np.int32(rows), self.emb, np.uint32(TABLE - 1), self.out_t,
                            np.int32(self.config.vocab), out))

    def target_greedy(self, last3):
        """The drafter's view of the target (eager, outside the graphs)."""
        last3 = self.cp.ascontiguousarray(last3, dtype=self.cp.int32)
        self.target_rows(last3, self.draft_target)
        return greedy(self.cp, self.draft_target)

    # graphs -------------------------------------------------------------------------------------------------

    def capture(self) -> None:
        """Warm up eagerly (modules load, launch constants are read), then capture the step and each stage."""
        for function in self.functions.values():
            function()
        self.stream.synchronize()
        self.step_graph = self._capture(list(self.functions.values()))
        self.stage_graphs = {name: self._capture([function]) for name, function in self.functions.items()}

    def _capture(self, functions):
        self.stream.begin_capture()
        try:
            for function in functions:
                function()
        finally:
            graph = self.stream.end_capture()
        return graph


def _run_gpu(config: PipelineConfig, model: TargetModel, prompts: np.ndarray) -> PipelineResult:
    steps = _GpuSteps(config, model)
    cp, stream = steps.cp, steps.stream
    G, K, vocab = config.batch, config.depth, config.vocab
    end = PROMPT_LEN + config.tokens
    timings = {name: StageTiming(name, STAGE_KIND[name]) for name in STAGES}
    accept_lens, request_steps = [], np.zeros(G, np.int64)
    graph_ms: list[float] = []
    disagreements: dict[str, str] = {}
    with stream:
        seq = cp.zeros((G, config.max_len), cp.int32)
        seq[:, :PROMPT_LEN] = cp.asarray(prompts)
        seq_len = cp.full(G, PROMPT_LEN, cp.int32)
        step = 0
        while True:
            active = cp.asnumpy(seq_len) < end  # one small sync per step: who is still generating
            if not active.any():
                break
            _guard(step, config)
            timed = ("drafter", "graph", *GRAPH_STAGES, "append")
            events = {name: (cp.cuda.Event(), cp.cuda.Event()) for name in timed}
            events["drafter"][0].record(stream)
            steps.committed[...] = committed_last3(cp, seq, seq_len)
            steps.logits[...] = draft_logits(cp, steps.target_greedy, steps.committed, step=step, seed=config.seed,
                                             depth=K, vocab=vocab, quality=config.draft_quality)
            events["drafter"][1].record(stream)
            if steps.step_graph is None:
                steps.capture()
            events["graph"][0].record(stream)
            steps.step_graph.launch(stream)
            events["graph"][1].record(stream)
            # each stage again, alone, on the same buffers: same inputs, same outputs, its own time
            for name in GRAPH_STAGES:
                events[name][0].record(stream)
                steps.stage_graphs[name].launch(stream)
                events[name][1].record(stream)
            events["append"][0].record(stream)
            append_accepted(cp, seq, seq_len, steps.accepted["accept_len"], steps.accepted["accept_tokens"],
                            config.tokens)
            events["append"][1].record(stream)
            stream.synchronize()
            elapsed = {name: cp.cuda.get_elapsed_time(start, stop) for name, (start, stop) in events.items()}
            graph_ms.append(elapsed.pop("graph"))
            for name, ms in elapsed.items():
                timings[name].ms.append(ms)
            accept_len = cp.asnumpy(steps.accepted["accept_len"])
            _reference_step(steps, model, step, timings, disagreements)
            accept_lens.append(accept_len[active].astype(np.int32))
            request_steps += active
            step += 1
        generated = cp.asnumpy(seq[:, PROMPT_LEN:end])
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    device = device.decode() if isinstance(device, bytes) else str(device)
    return PipelineResult(config, f"GPU {device}", generated, np.empty(0), accept_lens, request_steps, timings,
                          graph_ms, disagreements)


def _reference_step(steps: _GpuSteps, model: TargetModel, step: int, timings: dict[str, StageTiming],
                    disagreements: dict[str, str]) -> None:
    """The step again on the CPU, each stage on the GPU's inputs to it: the CPU time of each stage (what
    engines do today) and a check of every GPU output against the references."""
    config, cp = steps.config, steps.cp
    host = lambda array: cp.asnumpy(array)  # noqa: E731
    committed, logits = host(steps.committed), host(steps.logits)
    top = {name: host(array) for name, array in steps.top.items()}
    tree = {name: host(array) for name, array in steps.tree.items()}
    target_logits, accepted = host(steps.target_logits), {name: host(a) for name, a in steps.accepted.items()}
    clock = _Clock(timings, reference=True)
    reference: dict[str, dict[str, np.ndarray]] = {}

    def stage(name: str, compute: Callable[[], dict[str, np.ndarray]]) -> None:
        try:
            reference[name] = compute()
        except BadInput as error:  # a GPU output upstream that the contract calls bad input
            disagreements.setdefault(name, f"step {step}: the reference rejects its inputs from the GPU: {error}")
        clock.lap(name)

    def ref_target() -> dict[str, np.ndarray]:
        contexts = slot_contexts(tree["parent"], tree["token"], tree["depth"], committed)
        return {"target_logits": model.logits(contexts.reshape(-1, 3)).reshape(target_logits.shape)}

    stage("drafter", lambda: {"logits": draft_logits(
        np, lambda last3: greedy(np, model.logits(last3)), committed, step=step, seed=config.seed,
        depth=config.depth, vocab=config.vocab, quality=config.draft_quality)})
    stage("topk", lambda: ref_topk.topk(logits, config.topk))
    stage("tree-build", lambda: ref_tree_build.tree_build(top["top_logp"], top["top_ids"], config.budget))
    stage("target", ref_target)
    stage("tree-accept", lambda: ref_tree_accept.tree_accept(
        tree["token"], tree["first_child"], tree["next_sibling"], tree["n_nodes"], config.depth,
        target_logits=target_logits))

    # each GPU output against the reference's, the reference fed the GPU's own inputs to that stage
    gpu = {"drafter": {"logits": logits}, "topk": top, "tree-build": tree, "target": {"target_logits": target_logits},
           "tree-accept": accepted}
    for name, expected in reference.items():
        for output, want in expected.items():
            if name in disagreements:
                break
            atol = TOPK_LOGP_ATOL if output == "top_logp" else 0.0
            # target logits are exact integers: compared by value (a zero's sign is not the model's business)
            problem = first_difference(want, gpu[name][output], atol, bits=output != "target_logits")
            if problem:
                disagreements[name] = f"step {step}: {output} {problem}"


def first_difference(expected: np.ndarray, got: np.ndarray, atol: float = 0.0, bits: bool = True) -> str | None:
    """None when equal (float32: bit for bit, by value when not `bits`, or within atol when atol > 0; NaN never
    equal), else where they first differ."""
    if expected.shape != got.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    if expected.dtype.kind == "f":
        if atol > 0:
            same = np.isclose(got, expected, rtol=0.0, atol=atol)
        elif not bits:
            same = got == expected
        else:
            same = (got.view(np.uint32) == expected.astype(np.float32).view(np.uint32)) & ~np.isnan(got)
    else:
        same = got == expected
    if same.all():
        return None
    index = tuple(int(i) for i in np.argwhere(~same)[0])
    return f"at {index}: {got[index].item()!r}, expected {expected[index].item()!r} ({int((~same).sum())} differ)"


# --------------------------------------------------------------------------------------------------------------
# running, reporting


def run(config: PipelineConfig) -> PipelineResult:
    """Validate, build the models and prompts, decode speculatively on the chosen backend, and attach the
    target's plain greedy decoding for the lossless check."""
    validate(config)
    model = TargetModel.create(config.seed, config.vocab)
    prompts = make_prompts(config.seed, config.batch, config.vocab)
    result = (_run_gpu if config.backend == "gpu" else _run_cpu)(config, model, prompts)
    result.greedy = greedy_decode(model, prompts, config.tokens)
    return result


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def result_json(result: PipelineResult) -> str:
    lens = result.all_accept_lens
    histogram = {str(k): int(c) for k, c in zip(*np.unique(lens, return_counts=True))} if lens.size else {}
    stages = {}
    for name, timing in result.timings.items():
        entry = {"kind": timing.kind, "ms_per_step_median": _ms(timing.median_ms),
                 "ms_per_step_mean": _ms(float(np.mean(timing.ms)) if timing.ms else None)}
        if timing.reference_ms:
            entry["cpu_reference_ms_per_step_median"] = _ms(timing.reference_median_ms)
            entry["speedup_vs_cpu_reference"] = (_ms(timing.reference_median_ms / timing.median_ms)
                                                 if timing.median_ms else None)
        stages[name] = entry
    mismatch = result.mismatch
    payload = {
        "config": asdict(result.config),
        "device": result.device,
        "lossless": result.lossless,
        "passed": result.passed,
        "first_mismatch": asdict(mismatch) if mismatch else None,
        "reference_disagreements": result.disagreements,
        "requests": result.config.batch,
        "tokens_generated": result.tokens_generated,
        "steps": result.steps,
        "target_calls_per_request": [int(n) for n in result.request_steps],
        "mean_accept_len": result.mean_accept_len,
        "tokens_per_target_call": result.tokens_per_target_call,
        "accept_len_histogram": histogram,
        "stages": stages,
        "kdt_stages_ms_per_step_median": _ms(_sum_medians(result, KDT_STAGES)),
        "kdt_stages_cpu_reference_ms_per_step_median": _ms(_sum_medians(result, KDT_STAGES, reference=True)),
        "step_graph_ms_per_step_median": _ms(float(np.median(result.graph_ms)) if result.graph_ms else None),
        "accept_lens_per_step": [[int(x) for x in step] for step in result.accept_lens],
    }
    return json.dumps(payload, indent=2)


def _sum_medians(result: PipelineResult, names, reference: bool = False) -> float | None:
    values = [result.timings[n].reference_median_ms if reference else result.timings[n].median_ms for n in names]
    return None if any(v is None for v in values) else float(sum(values))


def summary_tables(result: PipelineResult):
    from rich.table import Table

    config = result.config
    title = (f"kdt pipeline on {result.device}: G={config.batch} B={config.budget} K={config.depth} V={config.topk} "
             f"vocab={config.vocab} quality={config.draft_quality:g} seed={config.seed}")
    numbers = Table(title=title, show_header=False)
    numbers.add_column("what")
    numbers.add_column("value", justify="right")
    numbers.add_row("requests", str(config.batch))
    numbers.add_row("tokens generated", f"{result.tokens_generated} ({config.tokens} per request)")
    numbers.add_row("steps (batched target calls)", str(result.steps))
    numbers.add_row("mean accepted length (bonus excluded)", f"{result.mean_accept_len:.3f} of {config.depth}")
    numbers.add_row("tokens per target call", f"{result.tokens_per_target_call:.3f}")
    numbers.add_row("lossless (= the target's greedy decoding)", "[green]yes[/]" if result.lossless else "[red]NO[/]")
    if config.backend == "gpu":
        numbers.add_row("every GPU output = the references'",
                        "[green]yes[/]" if not result.disagreements else "[red]NO[/]")

    gpu = config.backend == "gpu"
    stages = Table(title="time per step, ms (median over steps)" +
                   ("; GPU stages replayed from CUDA graphs" if gpu else "; the numpy references"))
    stages.add_column("stage")
    stages.add_column("kind")
    stages.add_column("GPU ms" if gpu else "CPU ms", justify="right")
    if gpu:
        stages.add_column("CPU reference ms", justify="right")
        stages.add_column("x CPU", justify="right")

    def row(label: str, kind: str, ms: float | None, reference: float | None = None) -> None:
        cells = [label, kind, "-" if ms is None else f"{ms:.3f}"]
        if gpu:
            cells.append("-" if reference is None else f"{reference:.3f}")
            cells.append(f"{reference / ms:,.1f}" if reference and ms else "-")
        stages.add_row(*cells)

    for name, timing in result.timings.items():
        kind = timing.kind + (" (eager)" if gpu and name in ("drafter", "append") else "")
        row(name, kind, timing.median_ms, timing.reference_median_ms if gpu and name != "append" else None)
    row("kdt stages (topk + tree-build + tree-accept)", "sum", _sum_medians(result, KDT_STAGES),
        _sum_medians(result, KDT_STAGES, reference=True) if gpu else None)
    if gpu:
        row("step graph (topk -> tree-build -> target -> tree-accept)", "one replay",
            float(np.median(result.graph_ms)) if result.graph_ms else None,
            _sum_medians(result, GRAPH_STAGES, reference=True))
    return numbers, stages


def command(config: PipelineConfig, json_path: Path | None) -> int:
    """The CLI's body: run, print the summary, write the JSON; the exit code (1 when a check fails)."""
    from rich.markup import escape

    from kdt.console import EXIT_CHECK_FAILED, EXIT_OK, console

    validate(config)  # bad options fail before any GPU work
    result = run(config)
    for table in summary_tables(result):
        console.print(table)
    mismatch = result.mismatch
    if mismatch is not None:
        console.print(f"[red]not lossless[/]: request {mismatch.request}, generated token {mismatch.position}: "
                      f"greedy decoding gives {mismatch.expected}, the pipeline gave {mismatch.got} "
                      f"({mismatch.requests_affected} of {config.batch} requests differ)")
    for stage, detail in result.disagreements.items():
        console.print(f"[red]{escape(stage)} disagrees with the reference[/]: {escape(detail)}")
    if json_path is not None:
        from kdt.report import write_atomically

        write_atomically(json_path, result_json(result))
    return EXIT_OK if result.passed else EXIT_CHECK_FAILED
