"""The CPU backend: the numpy references (`refs/`) for the three kdt stages, numpy for the models,
time.perf_counter per stage."""

from __future__ import annotations

import platform

import numpy as np

import kdt.refs.topk as ref_topk
import kdt.refs.tree_build as ref_tree_build
from kdt.pipeline import acceptance
from kdt.pipeline.config import PROMPT_LEN, PipelineConfig
from kdt.pipeline.drafter import draft_logits
from kdt.pipeline.result import PipelineResult, StageClock, stage_timings
from kdt.pipeline.step import append_accepted, check_progress, committed_last3, slot_contexts
from kdt.pipeline.target import TargetModel


def run_cpu(config: PipelineConfig, model: TargetModel, prompts: np.ndarray) -> PipelineResult:
    """Decode every request to `config.tokens` tokens, one step per loop; `plain` is left for the caller."""
    G, K, N, vocab = config.batch, config.depth, config.slots, config.vocab
    seq = np.zeros((G, config.max_len), np.int32)
    seq[:, :PROMPT_LEN] = prompts
    seq_len = np.full(G, PROMPT_LEN, np.int32)
    end = PROMPT_LEN + config.tokens
    timings = stage_timings()
    accept_lens, request_steps = [], np.zeros(G, np.int64)

    def target_greedy(last3):
        return acceptance.greedy(np, model.logits(last3))

    step = 0
    while (seq_len < end).any():
        check_progress(step, config)
        active = seq_len < end
        position = seq_len.astype(np.int64)  # where the token drawn at the root goes
        clock = StageClock(timings)
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
        accepted = acceptance.accept(config, tree, target_logits, position)
        clock.lap("tree-accept")
        append_accepted(np, seq, seq_len, accepted["accept_len"], accepted["accept_tokens"], config.tokens)
        clock.lap("append")
        accept_lens.append(np.asarray(accepted["accept_len"])[active].astype(np.int32))
        request_steps += active
        step += 1
    device = f"CPU ({platform.processor() or platform.machine()}), numpy references"
    return PipelineResult(config, device, seq[:, PROMPT_LEN:end].copy(), np.empty(0), accept_lens, request_steps,
                          timings)
