"""`kdt pipeline`: DDTree speculative decoding end to end, on a synthetic but honest pair of models.

Every step does what an engine does: the drafter's logits for the next K positions, `topk`, `tree-build`, the
target at every slot of the tree, `tree-accept` (or, sampling, `tree-sample`), then the accepted tokens and the
bonus are appended. At the end each request's tokens are compared, token for token, with the target's plain
decoding (greedy, or sampling with the same seed): speculative decoding must be lossless.

The modules, one job each:
  config.py      PipelineConfig, its limits, validate
  hashing.py     the counter-based uint32 hash all randomness comes from (numpy, CuPy, CUDA alike)
  target.py      the target model: hashed n-gram embeddings, integer weights, exact integer logits
  drafter.py     the drafter: logits for the next K positions of a tunable quality
  acceptance.py  the acceptance rule (greedy or sampled): the target's token, plain decoding, tree acceptance
  step.py        the stages of a step and the pieces both backends share (contexts at the slots, the append)
  cpu.py         the CPU backend: the numpy references, timed per stage
  gpu.py         the GPU backend: kdt.ops and kernels/synthetic_target.cu on fixed buffers, CUDA graphs
  check.py       the GPU backend's check: every stage again on the CPU, on the GPU's inputs
  result.py      PipelineResult, StageTiming: what a run produces
  report.py      the rich tables and the JSON
"""

from __future__ import annotations

from pathlib import Path

from kdt.pipeline.acceptance import plain_decode
from kdt.pipeline.config import PipelineConfig, validate
from kdt.pipeline.cpu import run_cpu
from kdt.pipeline.gpu import run_gpu
from kdt.pipeline.report import print_result, result_json
from kdt.pipeline.result import PipelineResult
from kdt.pipeline.step import make_prompts
from kdt.pipeline.target import TargetModel

__all__ = ["PipelineConfig", "PipelineResult", "command", "run", "validate"]

BACKEND_RUNS = {"cpu": run_cpu, "gpu": run_gpu}


def run(config: PipelineConfig) -> PipelineResult:
    """Validate, build the models and prompts, decode speculatively on the chosen backend, and attach the
    target's plain decoding (one token per call, the same rule and seed) for the lossless check."""
    validate(config)
    model = TargetModel.create(config.seed, config.vocab)
    prompts = make_prompts(config.seed, config.batch, config.vocab)
    result = BACKEND_RUNS[config.backend](config, model, prompts)
    result.plain = plain_decode(config, model, prompts)
    return result


def command(config: PipelineConfig, json_path: Path | None) -> int:
    """The CLI's body: run, print the summary, write the JSON; the exit code (1 when a check fails)."""
    from kdt.console import EXIT_CHECK_FAILED, EXIT_OK

    validate(config)  # bad options fail before any GPU work
    result = run(config)
    print_result(result)
    if json_path is not None:
        from kdt.report import write_atomically

        write_atomically(json_path, result_json(result))
    return EXIT_OK if result.passed else EXIT_CHECK_FAILED
