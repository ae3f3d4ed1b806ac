"""`kdt pipeline`: speculative decoding end to end must be lossless, greedy or sampled (CPU backend in CI; the GPU
backend where there is one). Small vocabularies and few tokens keep every test fast on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import kdt.refs.tree_accept as ref_tree_accept
import kdt.refs.tree_sample as ref_tree_sample
from kdt import pipeline, stages
from kdt.pipeline import PipelineConfig, PipelineResult, acceptance
from kdt.pipeline.acceptance import greedy, plain_decode
from kdt.pipeline.check import check_step
from kdt.pipeline.config import BACKENDS, PROMPT_LEN, validate
from kdt.pipeline.drafter import draft_logits
from kdt.pipeline.report import print_result
from kdt.pipeline.result import stage_timings
from kdt.pipeline.step import GRAPH_STAGES, KDT_STAGES, STAGES, append_accepted, make_prompts, slot_contexts
from kdt.pipeline.target import CLIP, HIDDEN, TargetModel
from kdt.refs.errors import BadInput
from kdt.refs.topk import topk
from kdt.refs.tree_build import tree_build

SMALL = PipelineConfig(batch=3, budget=15, depth=4, topk=4, tokens=24, seed=1, backend="cpu", draft_quality=0.7,
                       vocab=256)


def run_cpu(**changes) -> PipelineResult:
    return pipeline.run(replace(SMALL, **changes))


def kdt(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "200", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "kdt", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


# ---- lossless ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget, depth, fanout, quality", [
    (1, 1, 1, 0.5),      # the smallest tree: one node
    (7, 4, 4, 0.7),
    (31, 6, 8, 0.9),
    (5, 8, 3, 0.8),      # budget below depth: the tree cannot reach depth K
    (40, 3, 16, 0.4),    # a wide, shallow tree
    (20, 12, 2, 0.95),   # a deep, narrow one
])
def test_lossless_on_cpu(budget, depth, fanout, quality):
    result = run_cpu(budget=budget, depth=depth, topk=fanout, draft_quality=quality)
    assert result.lossless, result.mismatch
    assert result.passed
    assert result.generated.shape == (SMALL.batch, SMALL.tokens)
    lens = result.all_accept_lens
    assert lens.min() >= 0 and lens.max() <= min(depth, budget)
    assert result.tokens_per_target_call >= 1.0
    # one row of accept lengths per step, one entry per request still generating
    assert sum(len(step) for step in result.accept_lens) == int(result.request_steps.sum())


def test_a_drafter_that_is_always_wrong_accepts_nothing_and_is_still_lossless():
    result = run_cpu(draft_quality=0.0, budget=31, depth=5, topk=8)
    assert result.lossless, result.mismatch
    assert (result.all_accept_lens == 0).all()
    assert result.steps == SMALL.tokens  # one token (the bonus) per target call
    assert result.tokens_per_target_call == 1.0


@pytest.mark.parametrize("budget, depth", [(15, 4), (6, 6), (40, 12)])
def test_a_drafter_that_is_always_right_accepts_the_full_depth(budget, depth):
    result = run_cpu(draft_quality=1.0, budget=budget, depth=depth, topk=4)
    assert result.lossless, result.mismatch
    assert (result.all_accept_lens == depth).all()
    steps = -(-SMALL.tokens // (depth + 1))
    assert result.steps == steps and (result.request_steps == steps).all()


def test_an_always_right_drafter_is_limited_by_the_budget():
    result = run_cpu(draft_quality=1.0, budget=3, depth=8)
    assert result.lossless
    assert (result.all_accept_lens == 3).all()


def test_acceptance_varies_and_grows_with_draft_quality():
    low, high = run_cpu(draft_quality=0.3, tokens=32), run_cpu(draft_quality=0.9, tokens=32)
    assert low.lossless and high.lossless
    assert len(np.unique(high.all_accept_lens)) > 2  # lengths vary, as in practice
    assert high.mean_accept_len > low.mean_accept_len
    assert high.tokens_per_target_call > low.tokens_per_target_call


def test_requests_finish_independently_and_exactly_at_tokens():
    result = run_cpu(tokens=17, draft_quality=0.8)
    assert result.lossless
    assert result.generated.shape == (SMALL.batch, 17)
    assert len(set(result.request_steps.tolist())) > 1  # some requests needed more steps than others


def test_same_seed_same_run_other_seed_other_text():
    a, b, c = run_cpu(), run_cpu(), run_cpu(seed=2)
    assert np.array_equal(a.generated, b.generated)
    assert [x.tolist() for x in a.accept_lens] == [x.tolist() for x in b.accept_lens]
    assert not np.array_equal(a.generated, c.generated)


# ---- sampling: temperature, top-k, top-p -----------------------------------------------------------------------
# The synthetic target's logits are integers spread ~110 apart (the top two ~20 apart), so temperatures of tens
# make draws that often leave the argmax; at 0.8 only a few do.


def argmax_decode(config: PipelineConfig) -> np.ndarray:
    """The target's greedy decoding, written without the pipeline's acceptance module."""
    model = TargetModel.create(config.seed, config.vocab)
    sequence = make_prompts(config.seed, config.batch, config.vocab)
    out = []
    for _ in range(config.tokens):
        out.append(np.argmax(model.logits(sequence[:, -3:]), axis=1).astype(np.int32))  # ties: the smaller id
        sequence = np.concatenate([sequence[:, -2:], out[-1][:, None]], axis=1)
    return np.stack(out, axis=1)


@pytest.mark.parametrize("temperature, top_k, top_p, seed, quality", [
    (0.8, 0, 0.95, 1, 0.8),
    (8.0, 0, 1.0, 2, 0.9),
    (30.0, 20, 1.0, 3, 0.7),
    (30.0, 0, 0.7, 4, 0.9),
    (100.0, 50, 0.9, 2**64 - 1, 0.8),
    (1000.0, 0, 1.0, 5, 1.0),   # nearly uniform: the drafter's greedy guesses are seldom drawn
])
def test_sampled_speculative_decoding_equals_plain_sampling(temperature, top_k, top_p, seed, quality):
    result = run_cpu(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft_quality=quality)
    assert result.lossless and result.passed, result.mismatch
    assert np.array_equal(result.generated, result.plain)
    # the baseline is plain sampling, drawn apart from the speculative run: one token per target call
    assert np.array_equal(result.plain, plain_decode(result.config, TargetModel.create(seed, SMALL.vocab),
                                                     make_prompts(seed, SMALL.batch, SMALL.vocab)))
    assert sum(len(step) for step in result.accept_lens) == int(result.request_steps.sum())
    assert result.tokens_per_target_call >= 1.0
    if temperature >= 8:  # hot enough that the text leaves the greedy one
        assert not np.array_equal(result.generated, argmax_decode(result.config))


def test_sampling_reports_acceptance_that_falls_with_temperature():
    cool, hot = (run_cpu(temperature=t, draft_quality=0.9, tokens=32) for t in (0.8, 100.0))
    assert cool.lossless and hot.lossless
    assert cool.mean_accept_len > hot.mean_accept_len > 0  # the drafter guesses the greedy tokens
    assert cool.tokens_per_target_call > hot.tokens_per_target_call >= 1.0


@pytest.mark.parametrize("top_k, top_p", [(1, 1.0), (0, 1e-6)])
def test_a_kept_set_of_one_token_samples_the_greedy_text(top_k, top_p):
    result = run_cpu(temperature=50.0, top_k=top_k, top_p=top_p, draft_quality=1.0, depth=4)
    assert result.lossless
    assert np.array_equal(result.generated, argmax_decode(result.config))
    assert (result.all_accept_lens == 4).all()  # a perfect greedy drafter is accepted to the full depth


def test_temperature_0_is_todays_greedy_run(monkeypatch):
    greedy_run = run_cpu()
    assert np.array_equal(greedy_run.generated, argmax_decode(SMALL))
    zero = run_cpu(temperature=0.0, top_k=3, top_p=0.5)  # the contract: top-k and top-p ignored at temperature 0
    assert np.array_equal(zero.generated, greedy_run.generated)
    assert [x.tolist() for x in zero.accept_lens] == [x.tolist() for x in greedy_run.accept_lens]
    # the sampled rule's own temperature-0 case (tree-sample, sample) is the greedy run too, token for token
    monkeypatch.setattr(acceptance, "is_greedy", lambda config: False)
    sampled = run_cpu(temperature=0.0)
    assert sampled.lossless
    assert np.array_equal(sampled.generated, greedy_run.generated)
    assert [x.tolist() for x in sampled.accept_lens] == [x.tolist() for x in greedy_run.accept_lens]


def test_another_seed_samples_another_text():
    result = run_cpu(temperature=30.0)
    model = TargetModel.create(SMALL.seed, SMALL.vocab)
    prompts = make_prompts(SMALL.seed, SMALL.batch, SMALL.vocab)
    other = plain_decode(replace(result.config, seed=SMALL.seed + 1), model, prompts)  # same model, other noise
    assert not np.array_equal(result.generated, other)


def test_noise_keyed_by_the_wrong_position_fails_the_lossless_check(monkeypatch):
    real = ref_tree_sample.tree_sample

    def one_position_late(*args, position, **kwargs):
        return real(*args, position=position + 1, **kwargs)

    monkeypatch.setattr(ref_tree_sample, "tree_sample", one_position_late)
    result = run_cpu(temperature=30.0)
    assert not result.lossless and not result.passed
    assert result.plain[result.mismatch.request, result.mismatch.position] == result.mismatch.expected


def test_cli_sampling_run_shows_its_options(root, tmp_path):
    out = tmp_path / "sampled.json"
    done = kdt("pipeline", "--backend", "cpu", "--batch", "2", "--budget", "15", "--depth", "4", "--topk", "4",
               "--tokens", "16", "--vocab", "256", "--temperature", "20", "--top-k", "40", "--top-p", "0.9",
               "--seed", "18446744073709551615", "--json", str(out), cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sampling T=20 top-k=40 top-p=0.9" in done.stdout
    assert "lossless (= the target's plain sampling with the same seed)" in done.stdout
    assert "tree-sample" in done.stdout and "mean accepted length" in done.stdout
    report = json.loads(out.read_text())
    assert report["lossless"] is True and report["acceptance_stage"] == "tree-sample"
    assert {key: report["config"][key] for key in ("temperature", "top_k", "top_p", "seed")} == {
        "temperature": 20.0, "top_k": 40, "top_p": 0.9, "seed": 2**64 - 1}
    assert report["tokens_per_target_call"] >= 1.0 and report["accept_len_histogram"]


@pytest.mark.parametrize("changes, option", [
    ({"temperature": -0.5}, "--temperature"),
    ({"temperature": float("nan")}, "--temperature"),
    ({"temperature": float("inf")}, "--temperature"),
    ({"temperature": 1e-50}, "--temperature"),    # 0 as float32: greedy by accident
    ({"top_k": -1}, "--top-k"),
    ({"top_k": 257}, "--top-k"),                  # above --vocab
    ({"top_p": 0.0}, "--top-p"),
    ({"top_p": 1.5}, "--top-p"),
    ({"top_p": float("nan")}, "--top-p"),
    ({"seed": -1}, "--seed"),
    ({"seed": 2**64}, "--seed"),
])
def test_bad_sampling_options_are_named(changes, option):
    with pytest.raises(BadInput) as error:
        validate(replace(SMALL, **{"temperature": 1.0, **changes}))
    assert error.value.argument == option


# (a loop, not parametrize: a test id holding "gpu" would be marked as needing one, see conftest.py)
def test_sampling_options_are_checked_alike_on_both_backends():
    for backend in BACKENDS:
        validate(replace(SMALL, backend=backend, temperature=0.8, top_k=5, top_p=0.95, seed=2**64 - 1))
        with pytest.raises(BadInput) as error:
            validate(replace(SMALL, backend=backend, temperature=0.8, top_p=1.5))
        assert error.value.argument == "--top-p", backend


def test_cli_bad_sampling_option_exits_3_before_any_gpu_work(root):
    # validate runs before the GPU is looked for, so the answer is the same with or without one
    for backend in BACKENDS:
        done = kdt("pipeline", "--backend", backend, "--temperature", "0.8", "--top-p", "1.5", cwd=root)
        assert done.returncode == 3, done.stdout + done.stderr
        assert "--top-p" in done.stderr and "Traceback" not in done.stderr


def one_step_on_cpu(config: PipelineConfig):
    """Step 0 computed by the references, shaped as GpuStep.outputs_on_host: (model, committed, position, outputs)."""
    model = TargetModel.create(config.seed, config.vocab)
    committed = make_prompts(config.seed, config.batch, config.vocab)[:, -3:]
    position = np.full(config.batch, PROMPT_LEN, np.int64)
    logits = draft_logits(np, lambda last3: greedy(np, model.logits(last3)), committed, step=0, seed=config.seed,
                          depth=config.depth, vocab=config.vocab, quality=config.draft_quality)
    top = topk(logits, config.topk)
    tree = tree_build(top["top_logp"], top["top_ids"], config.budget)
    contexts = slot_contexts(tree["parent"], tree["token"], tree["depth"], committed)
    target_logits = model.logits(contexts.reshape(-1, 3)).reshape(config.batch, config.slots, config.vocab)
    outputs = {"drafter": {"logits": logits}, "topk": top, "tree-build": tree,
               "target": {"target_logits": target_logits},
               "tree-accept": acceptance.accept(config, tree, target_logits, position)}
    return model, committed, position, outputs


def test_the_gpu_backend_gives_tree_sample_its_contract_inputs():
    config = replace(SMALL, backend="gpu", temperature=0.8, top_k=5, top_p=0.9, seed=2**64 - 1)
    sampling = acceptance.gpu_sampling_inputs(np, config)  # numpy stands in for CuPy: the same calls
    outputs = one_step_on_cpu(config)[3]
    tree, groups = outputs["tree-build"], config.batch
    inputs = {**{name: tree[name] for name in ("token", "first_child", "next_sibling", "n_nodes")},
              "target_logits": outputs["target"]["target_logits"], **sampling}
    stages.get("tree-sample").check_layout({name: array.shape for name, array in inputs.items()},
                                           {name: array.dtype.name for name, array in inputs.items()},
                                           {"max_depth": config.depth})
    assert sampling["temperature"].tolist() == [np.float32(0.8)] * groups
    assert sampling["top_k"].tolist() == [5] * groups and sampling["top_p"].tolist() == [np.float32(0.9)] * groups
    assert sampling["seed"].tolist() == [2**64 - 1] * groups
    assert acceptance.gpu_sampling_inputs(np, replace(config, temperature=0.0)) == {}  # tree-accept takes none


@pytest.mark.parametrize("temperature", [0.0, 30.0])
def test_the_gpu_check_takes_the_rule_and_positions(temperature):
    """check.check_step (the GPU backend's per-step check) on one step computed on the CPU: no disagreement; an
    accepted token changed: the acceptance stage disagrees."""
    config = replace(SMALL, backend="gpu", temperature=temperature)
    model, committed, position, outputs = one_step_on_cpu(config)
    disagreements: dict[str, str] = {}
    check_step(config, model, 0, committed, position, outputs, stage_timings(), disagreements)
    assert disagreements == {}
    outputs["tree-accept"]["accept_tokens"][0, 0] += 1
    check_step(config, model, 0, committed, position, outputs, stage_timings(), disagreements)
    assert set(disagreements) == {"tree-accept"} and "accept_tokens" in disagreements["tree-accept"]


def test_the_gpu_check_of_sampling_says_whether_a_draw_was_on_a_knifes_edge(monkeypatch):
    """A walk drawn one position late (noise keyed wrongly) disagrees, and the check says whether the reference's
    draws were decisive there (a kernel bug) or on a knife's edge (float32 may round either way)."""
    config = replace(SMALL, backend="gpu", temperature=30.0)
    model, committed, position, outputs = one_step_on_cpu(config)
    tree, target_logits = outputs["tree-build"], outputs["target"]["target_logits"]
    late = acceptance.accept(config, tree, target_logits, position + 1)
    assert not all(np.array_equal(late[name], outputs["tree-accept"][name]) for name in late), "no walk moved"
    outputs["tree-accept"] = late
    decisive: dict[str, str] = {}
    check_step(config, model, 0, committed, position, outputs, stage_timings(), decisive)
    assert set(decisive) == {"tree-accept"} and "was decisive" in decisive["tree-accept"]
    monkeypatch.setattr(acceptance, "draw_margins", lambda *args: np.zeros(config.batch))
    on_edge: dict[str, str] = {}
    check_step(config, model, 0, committed, position, outputs, stage_timings(), on_edge)
    assert "knife's edge" in on_edge["tree-accept"] and "float32 may round either way" in on_edge["tree-accept"]


def test_a_sampled_gpu_report_names_tree_sample_for_the_acceptance_stage(capsys):
    """The step's acceptance stage is keyed "tree-accept" in timings and disagreements; the report names the contract
    stage it ran."""
    result = run_cpu(temperature=30.0)
    result.config = replace(result.config, backend="gpu")  # the GPU report's rows, on a CPU run's numbers
    result.disagreements = {"tree-accept": "step 0: accept_tokens at (0, 0): 1, expected 2 (1 differ)"}
    print_result(result)
    out = capsys.readouterr().out
    assert "tree-sample disagrees with the reference" in out and "tree-accept disagrees" not in out
    assert "step graph (topk -> tree-build -> target -> tree-sample)" in out


# ---- the check can fail --------------------------------------------------------------------------------------


def _off_by_one_bonus(monkeypatch, vocab: int) -> None:
    """A broken acceptance: the bonus token is the target's prediction plus one."""
    real = ref_tree_accept.tree_accept

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        rows = np.arange(out["accept_len"].shape[0])
        out["accept_tokens"][rows, out["accept_len"]] = (out["accept_tokens"][rows, out["accept_len"]] + 1) % vocab
        return out

    monkeypatch.setattr(ref_tree_accept, "tree_accept", broken)


def test_a_broken_acceptance_fails_the_lossless_check(monkeypatch):
    _off_by_one_bonus(monkeypatch, SMALL.vocab)
    result = run_cpu()
    assert not result.lossless and not result.passed
    mismatch = result.mismatch
    assert mismatch.expected != mismatch.got
    assert result.generated[mismatch.request, mismatch.position] == mismatch.got
    assert result.plain[mismatch.request, mismatch.position] == mismatch.expected
    assert np.array_equal(result.generated[mismatch.request, :mismatch.position],
                          result.plain[mismatch.request, :mismatch.position])


def test_a_broken_acceptance_exits_1(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from kdt.cli import app

    _off_by_one_bonus(monkeypatch, 256)
    out = tmp_path / "p.json"
    done = CliRunner().invoke(app, ["pipeline", "--backend", "cpu", "--batch", "2", "--tokens", "12", "--vocab", "256",
                                    "--budget", "7", "--depth", "3", "--topk", "4", "--json", str(out)])
    assert done.exit_code == 1, done.output
    assert "not lossless" in done.output
    report = json.loads(out.read_text())
    assert report["lossless"] is False and report["first_mismatch"]["position"] >= 0


# ---- the command line ----------------------------------------------------------------------------------------


def test_cli_cpu_runs_and_writes_json(root, tmp_path):
    out = tmp_path / "pipeline.json"
    done = kdt("pipeline", "--backend", "cpu", "--batch", "2", "--budget", "15", "--depth", "4", "--topk", "4",
               "--tokens", "20", "--seed", "3", "--draft-quality", "0.8", "--vocab", "512", "--json", str(out),
               cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mean accepted length" in done.stdout and "tokens per target call" in done.stdout
    report = json.loads(out.read_text())
    assert report["lossless"] is True and report["passed"] is True
    assert report["config"]["budget"] == 15 and report["config"]["backend"] == "cpu"
    assert report["tokens_generated"] == 40
    assert report["tokens_per_target_call"] >= 1.0
    assert set(report["stages"]) == set(STAGES)
    assert all(stage["ms_per_step_median"] is not None for stage in report["stages"].values())


@pytest.mark.parametrize("args, option", [
    (["--budget", "0"], "--budget"),
    (["--budget", "1024"], "--budget"),
    (["--depth", "65"], "--depth"),
    (["--topk", "0"], "--topk"),
    (["--topk", "600", "--vocab", "512"], "--topk"),
    (["--tokens", "0"], "--tokens"),
    (["--batch", "0"], "--batch"),
    (["--draft-quality", "1.5"], "--draft-quality"),
    (["--backend", "tpu"], "--backend"),
])
def test_bad_options_are_named(args, option):
    values = dict(zip(args[::2], args[1::2]))
    config = PipelineConfig(
        batch=int(values.get("--batch", 1)), budget=int(values.get("--budget", 7)), depth=int(values.get("--depth", 3)),
        topk=int(values.get("--topk", 4)), tokens=int(values.get("--tokens", 8)),
        backend=values.get("--backend", "cpu"),
        draft_quality=float(values.get("--draft-quality", 0.5)), vocab=int(values.get("--vocab", 512)))
    with pytest.raises(BadInput) as error:
        validate(config)
    assert error.value.argument == option


def test_cli_bad_option_exits_3_naming_it(root):
    done = kdt("pipeline", "--backend", "cpu", "--draft-quality", "2", cwd=root)
    assert done.returncode == 3
    assert "--draft-quality" in done.stderr and "Traceback" not in done.stderr


def test_overlapping_launches_are_the_gpu_backends_alone(root):
    """--overlap-previous changes how kernels are launched: the CPU backend has none, and says so."""
    assert replace(SMALL, backend="gpu", overlap_previous=True).knobs == {"overlap_previous": True}
    assert SMALL.knobs == {}
    with pytest.raises(BadInput) as error:
        validate(replace(SMALL, overlap_previous=True))
    assert error.value.argument == "--overlap-previous" and "--backend cpu" in str(error.value)
    done = kdt("pipeline", "--backend", "cpu", "--overlap-previous", cwd=root)
    assert done.returncode == 3 and "--overlap-previous" in done.stderr and "Traceback" not in done.stderr


# ---- the pieces ----------------------------------------------------------------------------------------------


def test_target_logits_are_exact_integers_and_greedy_breaks_ties_to_the_smaller_id():
    model = TargetModel.create(0, 300)
    logits = model.logits(np.array([[1, 2, 3], [4, 5, 6]], np.int32))
    assert logits.dtype == np.float32 and (logits == np.round(logits)).all() and np.abs(logits).max() < 2**24
    tied = np.array([[1.0, 5.0, 5.0, 2.0], [3.0, 3.0, 3.0, 3.0]], np.float32)
    assert greedy(np, tied).tolist() == [1, 0]


def test_slot_contexts_follow_the_path_back_into_the_committed_text():
    rng = np.random.default_rng(4)
    top = topk(rng.standard_normal((2, 5, 50)).astype(np.float32) * 3, 3)
    tree = tree_build(top["top_logp"], top["top_ids"], 20)
    committed = np.array([[7, 8, 9], [10, 11, 12]], np.int32)
    contexts = slot_contexts(tree["parent"], tree["token"], tree["depth"], committed)
    for g in range(2):
        for slot in range(21):
            path = []
            cur = slot
            while cur > 0:  # unused slots (depth -1) have no path: the committed text alone
                path.append(int(tree["token"][g, cur]))
                cur = int(tree["parent"][g, cur])
            text = committed[g].tolist() + path[::-1]
            assert contexts[g, slot].tolist() == text[-3:], (g, slot)


def test_append_stops_each_request_at_its_token_count():
    tokens = 5
    seq = np.zeros((2, PROMPT_LEN + tokens + 4), np.int32)
    seq_len = np.array([PROMPT_LEN, PROMPT_LEN + 3], np.int32)
    accept_tokens = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    append_accepted(np, seq, seq_len, np.array([3, 3], np.int32), accept_tokens, tokens)
    assert seq_len.tolist() == [PROMPT_LEN + 4, PROMPT_LEN + 5]
    assert seq[0, PROMPT_LEN:PROMPT_LEN + 4].tolist() == [1, 2, 3, 4]
    assert seq[1, PROMPT_LEN + 3:PROMPT_LEN + 5].tolist() == [5, 6]


def test_drafter_quality_extremes():
    model = TargetModel.create(0, 200)
    committed = np.array([[1, 2, 3], [40, 50, 60]], np.int32)

    def target_greedy(last3):
        return greedy(np, model.logits(last3))

    def truth_chain():
        context, chain = committed, []
        for _ in range(4):
            t = target_greedy(context)
            chain.append(t)
            context = np.concatenate([context[:, 1:], t[:, None]], axis=1)
        return np.stack(chain, axis=1)

    options = dict(step=0, seed=0, depth=4, vocab=200)
    right = draft_logits(np, target_greedy, committed, quality=1.0, **options)
    assert np.array_equal(greedy(np, right), truth_chain())
    wrong = draft_logits(np, target_greedy, committed, quality=0.0, **options)
    truth = target_greedy(committed)
    assert (greedy(np, wrong)[:, 0] != truth).all()
    assert (wrong[np.arange(2), 0, truth] == -np.inf).all()  # ruled out: never in any tree


# ---- the synthetic target's kernel ---------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a", "sm_120"])
def test_the_synthetic_target_kernel_builds_and_exports_what_the_python_side_assumes(arch, tmp_path, monkeypatch):
    from kdt import build

    monkeypatch.setenv("KDT_CACHE_DIR", str(tmp_path))
    result = build.build("synthetic-target", arch)
    assert result.cubin.is_file() and not result.cached
    assert {r.function for r in result.resources} == {"kdt_pipeline_slot_context", "kdt_pipeline_target_logits"}
    assert all(r.spill_store_bytes == 0 and r.stack_bytes == 0 for r in result.resources), result.resources
    constants = {name.removeprefix("kdt_synthetic_target_"): value for name, value in result.constants.items()}
    assert set(constants) == {"hidden", "clip", "rows", "logits_threads", "context_threads"}
    # the model's numbers: the numpy model (kdt/pipeline/target.py) computes with the same
    assert constants["hidden"] == HIDDEN and constants["clip"] == CLIP
    # the launch shape kdt/pipeline/gpu.py reads: whole warps, and the hidden states of a block's rows in shared
    logits = next(r for r in result.resources if r.function == "kdt_pipeline_target_logits")
    assert logits.shared_bytes == constants["rows"] * HIDDEN * 4
    assert constants["logits_threads"] % 32 == 0 and constants["context_threads"] % 32 == 0
    assert build.build("synthetic-target", arch).cached


# ---- the GPU backend -----------------------------------------------------------------------------------------


def assert_the_gpu_decodes_as_the_cpu(config: PipelineConfig) -> PipelineResult:
    """Both backends on `config`: the GPU run lossless, every kernel output equal to its reference, and the same
    text and accepted lengths as the CPU run. -> the GPU run."""
    gpu = pipeline.run(replace(config, backend="gpu"))
    cpu = pipeline.run(replace(config, backend="cpu", overlap_previous=False))   # a GPU-only launch option
    assert gpu.lossless, gpu.mismatch
    assert not gpu.disagreements, gpu.disagreements
    assert np.array_equal(gpu.generated, cpu.generated)
    assert [x.tolist() for x in gpu.accept_lens] == [x.tolist() for x in cpu.accept_lens]
    return gpu


GPU_CONFIG = PipelineConfig(batch=4, budget=31, depth=6, topk=8, tokens=40, seed=5, vocab=2048)


@pytest.mark.gpu
@pytest.mark.parametrize("quality", [0.0, 0.7, 1.0])
def test_gpu_is_lossless_and_accepts_what_the_cpu_accepts(quality):
    gpu = assert_the_gpu_decodes_as_the_cpu(replace(GPU_CONFIG, draft_quality=quality))
    assert len(gpu.graph_ms) == gpu.steps and all(ms > 0 for ms in gpu.graph_ms)
    for name in STAGES:
        assert len(gpu.timings[name].ms) == gpu.steps
    for name in GRAPH_STAGES:
        assert len(gpu.timings[name].reference_ms) == gpu.steps


@pytest.mark.gpu
@pytest.mark.parametrize("temperature, top_k, top_p, seed", [
    (0.8, 0, 0.95, 1),
    (30.0, 20, 1.0, 3),
    (30.0, 0, 0.7, 4),
    (100.0, 50, 0.9, 2**64 - 1),
    (1000.0, 0, 1.0, 5),   # nearly uniform: the drafter's greedy guesses are seldom drawn
])
def test_gpu_sampling_equals_plain_sampling_and_the_cpu_run(temperature, top_k, top_p, seed):
    """tree-sample in the step graph: its positions are written into the graph's buffers each step, so the
    speculative text is plain sampling's with the same seed, token for token, step after step."""
    config = replace(GPU_CONFIG, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft_quality=0.8)
    gpu = assert_the_gpu_decodes_as_the_cpu(config)
    assert gpu.steps > 1 and gpu.tokens_per_target_call >= 1.0
    if temperature >= 30:  # hot enough that the text leaves the greedy one: the kernel really sampled
        assert not np.array_equal(gpu.generated, argmax_decode(config))


@pytest.mark.gpu
@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (0.8, 0.95)])
def test_gpu_with_overlapping_launches_decodes_as_the_cpu(temperature, top_p):
    """Every kdt stage of the step graph launched to overlap the launch before it (programmatic dependent launch):
    each waits for its inputs, so the text and every stage's outputs stay the CPU run's."""
    config = replace(GPU_CONFIG, temperature=temperature, top_p=top_p, draft_quality=0.8, overlap_previous=True)
    gpu = assert_the_gpu_decodes_as_the_cpu(config)
    assert gpu.steps > 1 and len(gpu.graph_ms) == gpu.steps


@pytest.mark.gpu
def test_gpu_cli_default_run(root, tmp_path):
    out = tmp_path / "gpu.json"
    done = kdt("pipeline", "--backend", "gpu", "--tokens", "64", "--json", str(out), cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["lossless"] and report["passed"] and report["step_graph_ms_per_step_median"] > 0
    for name in KDT_STAGES:
        assert report["stages"][name]["cpu_reference_ms_per_step_median"] > 0


@pytest.mark.gpu
def test_gpu_cli_sampling_run(root, tmp_path):
    """Issue 18's closing run: the GPU backend sampling, lossless against plain sampling, with its acceptance."""
    out = tmp_path / "gpu_sampled.json"
    done = kdt("pipeline", "--backend", "gpu", "--temperature", "0.8", "--top-p", "0.95", "--tokens", "64",
               "--json", str(out), cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sampling T=0.8 top-k=off top-p=0.95" in done.stdout and "tree-sample" in done.stdout
    assert "lossless (= the target's plain sampling with the same seed)" in done.stdout
    report = json.loads(out.read_text())
    assert report["lossless"] and report["passed"] and report["reference_disagreements"] == {}
    assert report["acceptance_stage"] == "tree-sample"
    assert report["tokens_per_target_call"] > 1.0 and report["accept_len_histogram"]
    for name in KDT_STAGES:
        assert report["stages"][name]["cpu_reference_ms_per_step_median"] > 0
