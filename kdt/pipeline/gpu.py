"""The GPU backend: kdt.ops on CuPy arrays, the step replayed from one CUDA graph.

topk, tree-build, the target at every slot (kernels/synthetic_target.cu) and tree-accept (or, sampling,
tree-sample) run captured in one CUDA graph, replayed each step on fixed buffers (eager launches hide where the time
goes); what changes from step to step (the committed tokens, and the positions tree-sample keys its noise by) is
written into those buffers before each replay. Each stage is also captured alone, to time it; and the references
run on the same step's inputs on the CPU (check.py), which times what engines do today and checks every kernel
output against them. The drafter and the append run eagerly (CuPy).
"""

from __future__ import annotations

import numpy as np

from kdt.launch.plan import cdiv
from kdt.pipeline import acceptance, check
from kdt.pipeline.config import PROMPT_LEN, PipelineConfig
from kdt.pipeline.drafter import draft_logits
from kdt.pipeline.result import PipelineResult, stage_timings
from kdt.pipeline.step import GRAPH_STAGES, append_accepted, check_progress, committed_last3
from kdt.pipeline.target import CLIP, TargetModel

KERNEL = "synthetic-target"   # kernels/synthetic_target.cu


class SyntheticTarget:
    """The target model on the GPU: its weights, and the two kernels of kernels/synthetic_target.cu with the
    launch shape the cubin exports."""

    def __init__(self, model: TargetModel):
        from kdt import runtime

        cp = runtime.cupy()
        module = runtime.load(KERNEL)
        constants = runtime.target(KERNEL)
        hidden = constants.constant("kdt_synthetic_target_hidden")
        clip = constants.constant("kdt_synthetic_target_clip")
        if (hidden, clip) != (model.emb.shape[2], CLIP):
            raise RuntimeError(f"kernels/synthetic_target.cu computes hidden width {hidden}, clip {clip}; the model "
                               f"in kdt/pipeline/target.py has {model.emb.shape[2]}, {CLIP}")
        self.rows_per_block = constants.constant("kdt_synthetic_target_rows")
        self.logits_threads = constants.constant("kdt_synthetic_target_logits_threads")
        self.context_threads = constants.constant("kdt_synthetic_target_context_threads")
        self.slot_context_kernel = module.get_function("kdt_pipeline_slot_context")
        self.logits_kernel = module.get_function("kdt_pipeline_target_logits")
        self.emb = cp.asarray(model.emb)
        self.out_t = cp.asarray(model.out_t)
        self.table_mask = np.uint32(model.emb.shape[1] - 1)
        self.vocab = model.vocab

    def slot_contexts(self, tree, committed, out) -> None:
        """step.slot_contexts on the GPU: tree (kdt.ops.Tree) and committed [G, 3] -> out int32 [G * N, 3]."""
        groups, slots = (int(n) for n in tree.parent.shape)
        self.slot_context_kernel((cdiv(groups * slots, self.context_threads),), (self.context_threads,),
                                 (tree.parent, tree.token, tree.depth, committed, np.int32(groups), np.int32(slots),
                                  out))

    def logits(self, last3, out) -> None:
        """The target's logits for each row of last3 [R, 3] into out [R, vocab] (or [G, N, vocab])."""
        rows = int(last3.shape[0])
        self.logits_kernel((cdiv(rows, self.rows_per_block),), (self.logits_threads,),
                           (last3, np.int32(rows), self.emb, self.table_mask, self.out_t, np.int32(self.vocab), out))


class GpuStep:
    """Fixed device buffers, the stages as closures over them, and their CUDA graphs."""

    def __init__(self, config: PipelineConfig, model: TargetModel):
        from kdt import ops, runtime, stages

        cp = runtime.cupy()
        self.cp, self.ops, self.config = cp, ops, config
        G, K, N, V, vocab = config.batch, config.depth, config.slots, config.topk, config.vocab
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            self.target = SyntheticTarget(model)
            # every buffer a graph touches lives as long as this object: the graphs hold raw pointers
            self.committed = cp.zeros((G, 3), cp.int32)
            self.logits = cp.zeros((G, K, vocab), cp.float32)
            self.top = ops.TopK(top_ids=cp.zeros((G, K, V), cp.int32), top_logp=cp.zeros((G, K, V), cp.float32))
            layout = stages.get("tree-build").output_layout({"top_logp": (G, K, V), "top_ids": (G, K, V)},
                                                            {"budget": config.budget})
            self.tree = ops.Tree(**{name: cp.zeros(want.shape, np.dtype(want.dtype)) for name, want in layout.items()})
            self.slot_last3 = cp.zeros((G * N, 3), cp.int32)
            self.target_logits = cp.zeros((G, N, vocab), cp.float32)
            self.accepted = ops.Acceptance(accept_len=cp.zeros(G, cp.int32),
                                           accept_index=cp.zeros((G, K + 1), cp.int32),
                                           accept_tokens=cp.zeros((G, K + 1), cp.int32))
            self.draft_target = cp.zeros((G, vocab), cp.float32)
            # workspaces sized as ops.run would size them, so nothing is allocated inside a capture
            self.topk_workspace = ops.workspace_for("topk", {"logits": self.logits}, {"k": V}, knobs=config.knobs)
            self.build_workspace = ops.workspace_for("tree-build", self.top._asdict(), {"budget": config.budget},
                                                     knobs=config.knobs)
            self.sampling = acceptance.gpu_sampling_inputs(cp, config)
            self.accept_workspace = acceptance.gpu_workspace(config, self.tree, self.target_logits, self.sampling)
        self.stages = {"topk": self.topk, "tree-build": self.tree_build, "target": self.target_at_slots,
                       "tree-accept": self.tree_accept}   # GRAPH_STAGES, in order
        self.step_graph = None
        self.stage_graphs: dict[str, object] = {}

    # the stages, on the fixed buffers ---------------------------------------------------------------------

    def topk(self) -> None:
        self.ops.topk(self.logits, self.config.topk, out=self.top, workspace=self.topk_workspace,
                      knobs=self.config.knobs)

    def tree_build(self) -> None:
        self.ops.tree_build(self.top.top_logp, self.top.top_ids, self.config.budget, out=self.tree,
                            workspace=self.build_workspace, knobs=self.config.knobs)

    def target_at_slots(self) -> None:
        self.target.slot_contexts(self.tree, self.committed, self.slot_last3)
        self.target.logits(self.slot_last3, self.target_logits)

    def tree_accept(self) -> None:
        acceptance.accept_on_gpu(self.config, self.tree, self.target_logits, self.sampling, out=self.accepted,
                                 workspace=self.accept_workspace)

    def start_step(self, seq, seq_len) -> None:
        """Where this step starts, into the buffers the graphs read: the last three committed tokens (the drafter's
        and the target's context) and, sampling, the committed lengths, the absolute position of each request's
        root draw (as the CPU backend computes it, so the noise matches plain sampling's)."""
        self.committed[...] = committed_last3(self.cp, seq, seq_len)
        if self.sampling:
            self.sampling["position"][...] = seq_len

    def target_greedy(self, last3):
        """The drafter's view of the target (eager, outside the graphs)."""
        last3 = self.cp.ascontiguousarray(last3, dtype=self.cp.int32)
        self.target.logits(last3, self.draft_target)
        return acceptance.greedy(self.cp, self.draft_target)

    def outputs_on_host(self) -> dict[str, dict[str, np.ndarray]]:
        """Every stage's outputs of this step, copied to the host, by stage (the check's input)."""
        host = self.cp.asnumpy
        return {"drafter": {"logits": host(self.logits)},
                "topk": {name: host(array) for name, array in self.top._asdict().items()},
                "tree-build": {name: host(array) for name, array in self.tree._asdict().items()},
                "target": {"target_logits": host(self.target_logits)},
                "tree-accept": {name: host(array) for name, array in self.accepted._asdict().items()}}

    # graphs -------------------------------------------------------------------------------------------------

    def capture(self) -> None:
        """Warm up eagerly (modules load, launch constants are read), then capture the step and each stage."""
        for function in self.stages.values():
            function()
        self.stream.synchronize()
        self.step_graph = self._capture(list(self.stages.values()))
        self.stage_graphs = {name: self._capture([function]) for name, function in self.stages.items()}

    def _capture(self, functions):
        self.stream.begin_capture()
        try:
            for function in functions:
                function()
        finally:
            graph = self.stream.end_capture()
        return graph


def run_gpu(config: PipelineConfig, model: TargetModel, prompts: np.ndarray) -> PipelineResult:
    """Decode every request to `config.tokens` tokens, one graph replay per step, each step checked against the
    references on the CPU; `plain` is left for the caller."""
    steps = GpuStep(config, model)
    cp, stream = steps.cp, steps.stream
    G, K, vocab = config.batch, config.depth, config.vocab
    end = PROMPT_LEN + config.tokens
    timings = stage_timings()
    accept_lens, request_steps = [], np.zeros(G, np.int64)
    graph_ms: list[float] = []
    disagreements: dict[str, str] = {}
    with stream:
        seq = cp.zeros((G, config.max_len), cp.int32)
        seq[:, :PROMPT_LEN] = cp.asarray(prompts)
        seq_len = cp.full(G, PROMPT_LEN, cp.int32)
        step = 0
        while True:
            position = cp.asnumpy(seq_len).astype(np.int64)  # one small sync per step: the committed lengths
            active = position < end
            if not active.any():
                break
            check_progress(step, config)
            timed = ("drafter", "graph", *GRAPH_STAGES, "append")
            events = {name: (cp.cuda.Event(), cp.cuda.Event()) for name in timed}
            events["drafter"][0].record(stream)
            steps.start_step(seq, seq_len)
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
            append_accepted(cp, seq, seq_len, steps.accepted.accept_len, steps.accepted.accept_tokens, config.tokens)
            events["append"][1].record(stream)
            stream.synchronize()
            elapsed = {name: cp.cuda.get_elapsed_time(start, stop) for name, (start, stop) in events.items()}
            graph_ms.append(elapsed.pop("graph"))
            for name, ms in elapsed.items():
                timings[name].ms.append(ms)
            accept_len = cp.asnumpy(steps.accepted.accept_len)
            check.check_step(config, model, step, cp.asnumpy(steps.committed), position, steps.outputs_on_host(),
                             timings, disagreements)
            accept_lens.append(accept_len[active].astype(np.int32))
            request_steps += active
            step += 1
        generated = cp.asnumpy(seq[:, PROMPT_LEN:end])
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    device = device.decode() if isinstance(device, bytes) else str(device)
    return PipelineResult(config, f"GPU {device}", generated, np.empty(0), accept_lens, request_steps, timings,
                          graph_ms, disagreements)
