"""Launch plan for `kernels/tree_sample.cu` (stage `tree-sample`): one launch for the whole batch.

`kdt_tree_sample`: one block per request walks its tree, the whole block drawing each visited row (temperature,
top-k, top-p, Gumbel-max with Philox noise keyed by seed and position). No workspace; every per-request value is
read on the device, so a launch is graph-capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdt.launch.plan import ArraySpec, KernelLaunch, LaunchPlan, Target

PREFIX = "kdt_tree_sample_"
OUTPUTS = ("accept_len", "accept_index", "accept_tokens")
SAMPLING = ("temperature", "top_k", "top_p", "seed", "position")


@dataclass(frozen=True)
class Knobs:
    pass


def plan(inputs: dict[str, ArraySpec], params: dict, target: Target, knobs: Knobs) -> LaunchPlan:
    groups, slots = inputs["token"].shape
    if groups == 0:
        return LaunchPlan("tree-sample", "empty", (), knobs=knobs)
    logits = inputs["target_logits"]
    bf16 = logits.dtype == "bfloat16"
    launch = KernelLaunch("kdt_tree_sample", (groups, 1, 1), target.constant(PREFIX + "threads"),
                          ("target_logits", np.int32(1 if bf16 else 0), np.int32(logits.shape[2]), "token",
                           "first_child", "next_sibling", np.int32(slots), np.int32(int(params["max_depth"])),
                           *SAMPLING, *OUTPUTS))
    return LaunchPlan("tree-sample", "one block per request, draws along the walk", (launch,), knobs=knobs)
