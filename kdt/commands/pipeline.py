"""`kdt pipeline`: DDTree speculative decoding end to end on a synthetic target and drafter, checked lossless."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kdt.commands.common import RunArchOption, SmsOption, select_run


def command(batch: int = typer.Option(8, "--batch", help="requests decoded together (G)"),
            budget: int = typer.Option(63, "--budget", help="tree nodes per request and step, root excluded (B)"),
            depth: int = typer.Option(8, "--depth", help="draft positions per step (K)"),
            topk: int = typer.Option(8, "--topk", help="candidates kept per position (V)"),
            tokens: int = typer.Option(128, "--tokens", help="tokens to generate per request"),
            seed: int = typer.Option(0, "--seed", help="0..2^64-1: seeds the models, the prompts, the drafter and the "
                                                        "sampling noise"),
            backend: str = typer.Option("gpu", "--backend", help="gpu (kdt kernels in a CUDA graph) or cpu (the references)"),
            draft_quality: float = typer.Option(0.8, "--draft-quality",
                                                help="0..1: how often the drafter's top guess is the target's token"),
            vocab: int = typer.Option(4096, "--vocab", help="vocabulary of the target and the drafter"),
            temperature: float = typer.Option(0.0, "--temperature",
                                              help="0: greedy (tree-accept); > 0: sampling (tree-sample)"),
            top_k: int = typer.Option(0, "--top-k", help="sampling: keep the K most probable tokens (0: off)"),
            top_p: float = typer.Option(1.0, "--top-p", help="sampling: keep the fewest most probable tokens of "
                                                             "probability >= P (0 < P <= 1; 1: off)"),
            overlap_previous: bool = typer.Option(False, "--overlap-previous",
                                                  help="GPU: every kdt stage's first launch by programmatic "
                                                       "dependent launch (the knob overlap_previous=true), so in the "
                                                       "step graph its blocks start while the launch before it ends "
                                                       "(without it, the knob's auto: the stages that measured "
                                                       "faster so)"),
            json_file: Optional[Path] = typer.Option(None, "--json", help="write every number as JSON"),
            arch: Optional[str] = RunArchOption, sms: Optional[int] = SmsOption):
    """DDTree speculative decoding end to end on a synthetic target/drafter pair, greedy or sampled; exit 1 unless
    lossless (token for token the target's plain decoding with the same seed)."""
    from kdt import pipeline

    select_run(arch, sms)
    config = pipeline.PipelineConfig(batch=batch, budget=budget, depth=depth, topk=topk, tokens=tokens, seed=seed,
                                     backend=backend, draft_quality=draft_quality, vocab=vocab,
                                     temperature=temperature, top_k=top_k, top_p=top_p,
                                     overlap_previous=overlap_previous)
    raise typer.Exit(pipeline.command(config, json_file))
