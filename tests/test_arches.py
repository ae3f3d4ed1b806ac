"""The build targets without a GPU: the sm_120 emulation takes exactly the sm_120 configuration (constants,
functions, shared memory, plans), every cubin is held to its arch's limits and the gate fires, and the arch a
process runs is chosen and checked against the GPU."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kdt import arches, build, envcheck, limits, ops, runtime, stages
import numpy as np

from kdt.launch.plan import NULL, ArraySpec, KernelLaunch, LaunchPlan, Target, Workspace
from kdt.refs.errors import BadInput


@pytest.mark.nvcc
@pytest.mark.compile
@pytest.mark.parametrize("kernel", stages.names())
def test_the_emulation_builds_exactly_the_sm120_configuration(kernel):
    """sm_120-emu (sm_90 code with -DKDT_EMULATE_SM120) and sm_120: the same exported launch constants, the same
    entry points with the same static shared memory, and the same launch plan for every bench shape, whatever the
    SM count, so what is verified on the H200 is what an sm_120 GPU runs."""
    real, emulated = build.build(kernel, "sm_120"), build.build(kernel, "sm_120-emu")
    assert emulated.constants == real.constants
    static = lambda result: {r.function: r.shared_bytes for r in result.resources}
    assert static(emulated) == static(real)
    spec = stages.get(kernel)
    for count in (70, 188):
        for shape in spec.every_bench_shape():
            inputs = {name: ArraySpec(tuple(dims), dtype) for name, (dims, dtype) in shape.layout.items()}
            plans = [ops.plan_for(spec, inputs, dict(shape.params), Target.make(r.arch, count, r.constants))
                     for r in (real, emulated)]
            assert plans[0].launches == plans[1].launches and plans[0].path == plans[1].path, shape.name


@pytest.mark.nvcc
@pytest.mark.compile
def test_the_emulation_differs_from_the_hopper_build():
    """The configuration really moves: verify-attn's 32-row CTA, 16-key tiles and 99 KB budget, topk's 8-block
    clusters."""
    hopper, emulated = build.build("verify-attn", "sm_90"), build.build("verify-attn", "sm_120-emu")
    assert emulated.constants["kdt_verify_attn_kv_tile"] == 16 and hopper.constants["kdt_verify_attn_kv_tile"] == 64
    assert emulated.constants["kdt_verify_attn_rows"] == 32 and hopper.constants["kdt_verify_attn_rows"] == 64
    assert emulated.constants["kdt_verify_attn_smem_bytes"] <= 99 * 1024 < hopper.constants["kdt_verify_attn_smem_bytes"]
    assert build.build("topk", "sm_120-emu").constants["kdt_topk_cluster_size"] == 8


@pytest.mark.nvcc
@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90", "sm_120", "sm_120-emu"])
@pytest.mark.parametrize("kernel", stages.names())
def test_every_cubin_is_within_its_arch_limits(kernel, arch):
    result = build.build(kernel, arch)
    assert limits.check(result, limits.bench_plans(stages.get(kernel), result)) == []


FAKE_VERIFY_ATTN = """
extern "C" __constant__ int kdt_verify_attn_threads = 256;
extern "C" __constant__ int kdt_verify_attn_rows = 64;
extern "C" __constant__ int kdt_verify_attn_kv_tile = 64;
extern "C" __constant__ int kdt_verify_attn_smem_bytes = 150000;
extern "C" __constant__ int kdt_verify_attn_dqk = 576;
extern "C" __constant__ int kdt_verify_attn_dv = 512;
extern "C" __constant__ int kdt_verify_attn_page = 64;
extern "C" __constant__ int kdt_verify_attn_combine_group_threads = 128;
extern "C" __constant__ int kdt_verify_attn_combine_max_groups = 4;
extern "C" __constant__ int kdt_verify_attn_combine_unroll = 8;
extern "C" __constant__ int kdt_verify_attn_value_split_max = 1;
extern "C" __constant__ int kdt_verify_attn_pair_merge = 0;
extern "C" __constant__ int kdt_verify_attn_tensor_keys = 0;
struct alignas(64) Map { unsigned long long words[16]; };
extern "C" __global__ void kdt_verify_attn_fwd(const void*, const void*, const __grid_constant__ Map, int, const int*,
                                               const int*, const void*, const unsigned*, const int*, int, int, int,
                                               int, int, float, int, int, int, float* out, float*, float*, float*) {
    extern __shared__ float s[]; s[threadIdx.x] = 1.f; out[threadIdx.x] = s[255 - threadIdx.x]; }
extern "C" __global__ void kdt_verify_attn_combine(const float*, const float*, const int*, int, int, int, int, int,
                                                   int, int, float* out, float*) { out[threadIdx.x] = 0.f; }
"""


@pytest.mark.nvcc
def test_the_gate_fires_on_a_kernel_that_asks_for_too_much(tmp_path, root):
    """A verify-attn whose plan asks for 150,000 B of shared memory per block: fine on sm_90 (227 KB), refused for
    sm_120 (99 KB) by `kdt build`, exit 2, with the table of what exceeded what."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "verify_attn.cu").write_text(FAKE_VERIFY_ATTN)
    env = {**os.environ, "KDT_KERNELS_DIR": str(kernels), "KDT_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    run = lambda arch: subprocess.run([sys.executable, "-m", "kdt", "build", "verify-attn", "--arch", arch],
                                      capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert run("sm_90").returncode == 0
    done = run("sm_120")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "limits exceeded" in done.stdout and "kdt_verify_attn_fwd" in done.stdout
    assert "shared memory per block (dynamic + static)" in done.stdout and "150,000" in done.stdout
    assert "101,376" in done.stdout and "Traceback" not in done.stderr


def test_the_limits_each_launch_is_held_to():
    result = build.BuildResult("topk", "sm_120", Path("x"), True,
                               [build.FunctionResources("f", 64, 1024, 0, 0, 0, ()),
                                build.FunctionResources("g", 300, 0, 0, 0, 0, ())], {})
    plan = LaunchPlan("topk", "cluster", (KernelLaunch("f", (32, 1, 1), 256, (), 101376, 16),
                                          KernelLaunch("h", (1, 1, 1), 2048, ())))
    found = {(v.function, v.limit): (v.allowed, v.asked) for v in limits.check(result, [("shape", plan)])}
    assert found == {("f", "shared memory per block (dynamic + static)"): (101376, 102400),
                     ("f", "blocks per cluster"): (8, 16),
                     ("g", "registers per thread"): (255, 300),
                     ("h", "an entry point of the cubin"): (0, 1)}
    hopper_cubin = build.BuildResult("topk", "sm_90", Path("x"), True, result.resources[:1], {})
    assert limits.check(hopper_cubin, [("shape", dataclasses.replace(plan, launches=plan.launches[:1]))]) == []


def test_blocks_that_must_share_a_multiprocessor_fit_it_together():
    """A launch whose plan needs two blocks resident on one multiprocessor (tree-sample's every-slot kernel): their
    shared memory with the driver's 1 KB each, their threads and their registers, against the arch's per-SM
    figures; sm_120 has 100 KB and 1,536 threads where sm_90 has 228 KB and 2,048."""
    f = build.FunctionResources("f", 60, 50_000, 0, 0, 0, ())        # 60 registers are allocated as 64
    together = LaunchPlan("tree-sample", "every slot", (KernelLaunch("f", (128, 1, 1), 1024, (), blocks_per_sm=2),))
    sm120 = build.BuildResult("tree-sample", "sm_120", Path("x"), True, [f], {})
    found = {v.limit: (v.allowed, v.asked) for v in limits.check(sm120, [("shape", together)])}
    assert found == {"threads per multiprocessor (2 blocks)": (1536, 2048),           # 2 x (50,000 + 1,024) B fit
                     "registers per multiprocessor (2 blocks)": (65_536, 131_072)}
    fits = dataclasses.replace(together, launches=(KernelLaunch("f", (128, 1, 1), 512, (), blocks_per_sm=2),))
    assert limits.check(sm120, [("shape", fits)]) == []
    wider = build.FunctionResources("f", 64, 50_600, 0, 0, 0, ())
    over = limits.check(build.BuildResult("tree-sample", "sm_120", Path("x"), True, [wider], {}), [("shape", fits)])
    assert [(v.limit, v.allowed, v.asked) for v in over] == [
        ("shared memory per multiprocessor (2 blocks, 1024 B reserved each)", 102_400, 103_248)]
    hopper = build.BuildResult("tree-sample", "sm_90a", Path("x"), True, [wider], {})
    assert limits.check(hopper, [("shape", fits)]) == []


def test_a_launch_whose_arguments_are_not_the_parameters():
    """An argument gained or lost between the launcher and the kernel (the driver would read past the argument array
    and the process would die), or one of another size: a violation naming both layouts, once per layout; a plan the
    cubin's constants cannot make, one too."""
    result = build.BuildResult("tree-accept", "sm_90a", Path("x"), True,
                               [build.FunctionResources("f", 32, 0, 0, 0, 0, (8, 4, 4, 8))], {})
    fits = KernelLaunch("f", (1, 1, 1), 32, ("token", np.int32(1), np.float32(2), Workspace()))
    one_fewer = dataclasses.replace(fits, args=fits.args[:3])
    widened = dataclasses.replace(fits, args=("token", np.int32(1), NULL, "out"))
    plan = lambda *launches: LaunchPlan("tree-accept", "p", launches)
    plans = [("a", plan(fits, one_fewer)), ("b", plan(one_fewer)), ("c", plan(widened))]
    found = [(v.function, v.limit, v.allowed, v.asked, v.where) for v in limits.check(result, plans)]
    assert found == [("f", "parameters (bytes each): 8,4,4,8 in the cubin, 8,4,4 launched", 4, 3, "a"),
                     ("f", "parameters (bytes each): 8,4,4,8 in the cubin, 8,4,8,8 launched", 4, 4, "c")]
    assert limits.check(result, [("a", plan(fits))]) == []
    unplanned = LaunchPlan("tree-accept", "no plan: the sm_90a cubin exports no constant 'x'", ())
    assert [(v.function, v.limit) for v in limits.mismatches(result, [("d", unplanned)])] == [("-", unplanned.path)]


def test_the_size_of_every_kind_of_launch_argument():
    launch = KernelLaunch("f", (1, 1, 1), 32, ("out", Workspace(64), NULL, np.int32(1), np.float32(1), np.int8(1)))
    assert launch.arg_sizes == (8, 8, 8, 4, 4, 1)
    with pytest.raises(TypeError, match="int"):
        dataclasses.replace(launch, args=(3,)).arg_sizes


@pytest.fixture
def hopper(monkeypatch):
    """An H200 that is never used: its compute capability and SM count."""
    monkeypatch.setattr(runtime, "cupy", lambda: types.SimpleNamespace())
    monkeypatch.setattr(runtime, "gpu_arch", lambda: "sm_90")
    yield
    runtime.select()


def test_the_arch_a_process_runs(hopper):
    assert runtime.device_arch() == "sm_90a"                       # the GPU's own: Hopper with wgmma
    runtime.select("sm_120-emu", 70)
    assert runtime.device_arch() == "sm_120-emu" and runtime.multiprocessors() == 70
    with runtime.selected("sm_90"):
        assert runtime.device_arch() == "sm_90"
    assert runtime.device_arch() == "sm_120-emu"
    runtime.select("sm_120")
    with pytest.raises(runtime.GpuMissing, match="--arch sm_120-emu runs its configuration here"):
        runtime.device_arch()
    with pytest.raises(BadInput, match="--arch"):
        runtime.select("sm_121")
    with pytest.raises(BadInput, match="--sms"):
        runtime.select("sm_120-emu", 0)


def test_env_check_says_how_to_emulate():
    fix = envcheck._arch_fix("sm_120", "sm_90")
    assert "--arch sm_120-emu" in fix and "--sms 70" in fix and "--arch sm_90a" in fix
    assert envcheck._arch_fix("sm_100", "sm_90") == "pass --arch sm_90a to target this GPU"


def test_every_arch_has_nvcc_flags_and_limits():
    emulation = arches.get("sm_120-emu")
    assert emulation.nvcc_flags() == ["-gencode=arch=compute_90,code=sm_90", "-DKDT_EMULATE_SM120"]
    assert (emulation.smem_per_block, emulation.max_cluster) == (arches.get("sm_120").smem_per_block, 8)
    assert arches.get("sm_90a").nvcc_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
    with pytest.raises(ValueError, match="arch"):
        arches.get("sm_7")
