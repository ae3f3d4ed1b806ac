"""The tree-build kernel's small path (B <= 63: `small_build<SETS>` in kernels/tree_build/small.cuh, one or two slots
per lane), modelled lane by lane in numpy, against the heapq reference.

Each numpy array of [SETS, 32] entries is one register per set across the 32 lanes of warp 0; the loop's
statements follow small_build's in order (the REDUX over each lane's larger key before apply, the late merge of the
newborn's key, one ballot per set with set 1 winning only where set 0's is empty, the shuffle from lane wl % 32,
steps past B as no-ops, groups of kSmallUnroll steps, then of kSmallUnrollTwoSets), so CI checks the algorithm and
its tie-breaks on many inputs (ties, -inf, zero and positive log-probs, deep greedy chains), and the finalize's
set-wise sibling logic. The GPU tests check the kernel itself against the reference on the same kinds of input."""

from __future__ import annotations

import numpy as np
import pytest

from kdt.refs.tree_build import tree_build

LANES = 32
UNROLL = 4          # kSmallUnroll: steps 1-32
UNROLL_TWO_SETS = 8 # kSmallUnrollTwoSets: steps 33-63
LP0_LEN = 72        # kLp0Len
F32 = np.float32


def score_key(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, F32)
    u = x.view(np.uint32).astype(np.uint64)
    k = np.where(u >> 31, (~u) & 0xFFFFFFFF, u | 0x80000000)
    return np.where(x > -np.inf, k, 0).astype(np.uint32)          # -inf and NaN -> 0


def key_score(k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, np.uint32).astype(np.uint64)
    u = np.where(k & 0x80000000, k ^ 0x80000000, (~k) & 0xFFFFFFFF).astype(np.uint32)
    return u.view(F32)


def fadd(a, b) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return (np.asarray(a, F32) + np.asarray(b, F32)).astype(F32)


def small_build(top_logp: np.ndarray, top_ids: np.ndarray, B: int) -> dict:
    """The kernel's small_build, lane by lane: SETS = ceil((B + 1) / 32) slots per lane (slot q on lane q % 32 of
    set q // 32), each register an array [SETS, 32]."""
    K, V = top_logp.shape
    assert 1 <= B <= 2 * LANES - 1
    sets = (B + 1 + LANES - 1) // LANES
    Vs = min(V, B + 1)
    lp_s = top_logp[:, :Vs].astype(F32).reshape(-1)
    ids_s = top_ids[:, :Vs].reshape(-1)
    lp0 = np.full(LP0_LEN, -np.inf, F32)
    lp1 = np.full(LP0_LEN, -np.inf, F32)
    lp0[:K] = top_logp[:, 0]
    if V > 1:
        lp1[:K] = top_logp[:, 1]
    lane = np.arange(LANES)
    slot = np.arange(sets)[:, None] * LANES + lane[None, :]
    lanes_below = ((1 << lane) - 1).astype(np.uint64)
    full = lambda v, dt: np.full((sets, LANES), v, dt)
    uniform = lambda v, dt: np.full((sets, LANES), v, dt)     # a warp-uniform value, in every lane of every set

    st = {}
    st["D"], st["rho"], st["par"] = full(0, np.int64), full(0, np.int64), full(-1, np.int64)
    st["L"] = full(0.0, F32)
    sc0 = fadd(0.0, lp0[0])
    st["adv"] = full(score_key(fadd(0.0, lp1[0])), np.uint32)
    st["nxt"] = full(lp_s[min(2, Vs - 1)], F32)
    st["rc0"], st["rc1"] = full(lp0[1], F32), full(lp1[1], F32)
    st["gl0"], st["gl1"] = full(lp0[2], F32), full(lp1[2], F32)
    st["ck"] = full(score_key(fadd(sc0, lp0[1])), np.uint32)
    st["ca"] = full(score_key(fadd(sc0, lp1[1])), np.uint32)
    st["mask"] = full(1, np.uint64)
    st["key"] = full(0, np.uint32)
    st["is_w"] = full(False, bool)
    st["is_n"] = slot == 0
    st["bal"] = 1
    st["m"] = np.uint32(0)
    st["c"] = uniform(score_key(sc0), np.uint32)
    st["a"] = st["adv"].copy()
    st["wmask"] = uniform(1, np.uint64)
    st["wl"], st["wD"], st["sp"] = -1, uniform(-1, np.int64), 0
    st["g0"], st["g1"] = st["rc0"].copy(), st["rc1"].copy()

    def apply(t: int, loads: bool) -> None:
        """loads: a step over both sets, or the last apply, with two sets (kLoadRc): the newborn's rc0 and rc1 come
        from loads at the winner's depth wD, and gl0 and gl1 are not kept (poisoned here)."""
        is_w, is_n = st["is_w"], st["is_n"]
        w_adv = np.where(st["rho"] + 2 < V, score_key(fadd(st["L"], st["nxt"])), 0).astype(np.uint32)
        st["adv"] = np.where(is_w, w_adv, st["adv"]).astype(np.uint32)
        st["rho"] = np.where(is_w, st["rho"] + 1, st["rho"])
        if loads:                                   # one load each for every lane, at the winner's depth
            wD = st["wD"][0, 0]
            st["g0"], st["g1"] = uniform(lp0[wD + 2], F32), uniform(lp1[wD + 2], F32)
        born = is_n & (t > 0)
        st["adv"] = np.where(born, st["a"], st["adv"]).astype(np.uint32)
        st["rho"] = np.where(born, 0, st["rho"])
        st["L"] = np.where(born, key_score(np.full(slot.shape, st["m"], np.uint32)), st["L"]).astype(F32)
        st["D"] = np.where(born, st["wD"] + 1, st["D"])
        st["rc0"] = np.where(born, st["g0"], st["rc0"]).astype(F32)
        st["rc1"] = np.where(born, st["g1"], st["rc1"]).astype(F32)
        st["par"] = np.where(born, st["wl"], st["par"])
        st["mask"] = np.where(born, st["wmask"] | np.uint64(1 << (t & 63)), st["mask"]).astype(np.uint64)
        sc = key_score(np.where(is_n, st["c"], st["key"]).astype(np.uint32))
        st["ck"] = score_key(fadd(sc, st["rc0"]))
        st["ca"] = score_key(fadd(sc, st["rc1"]))
        idx = np.minimum(st["D"], K - 1) * Vs + np.minimum(st["rho"] + 2, Vs - 1)
        st["nxt"] = lp_s[idx]
        assert (st["D"] + 2 < LP0_LEN).all()
        if loads:
            st["gl0"], st["gl1"] = full(np.nan, F32), full(np.nan, F32)
        else:
            st["gl0"], st["gl1"] = lp0[st["D"] + 2], lp1[st["D"] + 2]

    def step(s: int) -> None:
        if s > 32:      # the kernel's two-set steps hold no newborn in set 0 (`bears`): slots 33-63 are set 1's
            assert not st["is_n"][0].any()
        else:           # and its one-set steps shuffle only the low word of the winner's (a set-0 slot's) mask
            assert not (st["mask"][0] >> np.uint64(32)).any()
        one_set = s <= 32                           # steps 1-32 run over set 0 alone
        R = st["key"].max()                         # REDUX over each lane's largest key
        apply(s - 1, loads=sets == 2 and not one_set)
        key = np.where(st["is_n"], st["c"], st["key"]).astype(np.uint32)
        live = (key != 0) & (s <= B)
        m = np.uint32(max(int(R), int(st["c"][0, 0])))
        st["m"] = m
        cand = live & (key == m)
        ballots = [int(sum(1 << int(i) for i in np.nonzero(cand[k])[0])) for k in range(sets)]
        # the smallest slot holding the best key: set 0's lowest lane, else set 1's
        win = next((k for k in range(sets) if ballots[k]), 0)
        bal = ballots[win]
        lower = (np.uint64(bal) & lanes_below) != 0
        st["is_w"] = cand & ~lower[None, :] & (np.arange(sets) == win)[:, None]
        st["key"] = np.where(st["is_w"], st["adv"], key).astype(np.uint32)
        wl = (bal & -bal).bit_length() - 1          # 31 - __clz(bal & -bal): -1 when bal == 0
        src = wl % LANES                            # a shuffle from lane -1 reads lane 31
        shuffled = (("c", "ck"), ("a", "ca"), ("wD", "D"), ("wmask", "mask"))
        if one_set:                                 # a step over both sets loads these in the next apply
            shuffled += (("g0", "gl0"), ("g1", "gl1"))
        for name, reg in shuffled:
            st[name] = np.full(slot.shape, st[reg][win, src], st[reg].dtype)
        st["wl"] = wl + LANES * win if bal else -1
        st["is_n"] = (slot == s) & (bal != 0)
        st["bal"] = bal
        st["sp"] = s

    more = True
    for s0 in range(1, min(B, 32) + 1, UNROLL):
        for u in range(UNROLL):
            step(s0 + u)
        if st["bal"] == 0:
            more = False
            break
    for s0 in range(33, B + 1, UNROLL_TWO_SETS) if more else ():
        for u in range(UNROLL_TWO_SETS):
            step(s0 + u)
        if st["bal"] == 0:
            break
    apply(st["sp"], loads=sets == 2)

    # finalize, as small_finalize: per set, __match_any_sync over the parents (unborn slots: distinct negatives);
    # with two sets, set 1's ranks start after the parent's children in set 0, and a set-0 slot with no later
    # sibling in its set continues with the parent's first child in set 1
    N = B + 1
    D, par, L, mask = st["D"], st["par"], st["L"], st["mask"]
    born = D > 0
    n = int(born.sum())
    value = np.where(born, par, -2 - slot)
    sib = [np.array([sum(1 << j for j in range(LANES) if value[k, j] == value[k, i]) for i in range(LANES)])
           for k in range(sets)]
    rnk = np.array([[bin(int(sib[k][i]) & ((1 << i) - 1)).count("1") for i in range(LANES)] for k in range(sets)])
    nxt = np.full((sets, LANES), -1)
    for k in range(sets):
        for i in range(LANES):
            later = int(sib[k][i]) & ~((1 << (i + 1)) - 1)
            if born[k, i] and later:
                nxt[k, i] = LANES * k + (later & -later).bit_length() - 1
    fc = np.full(LANES * sets, -1)
    for i in range(LANES):
        if born[0, i] and rnk[0, i] == 0:
            fc[par[0, i]] = i
    if sets == 2:
        count0, first1 = np.zeros(2 * LANES, np.int64), np.full(2 * LANES, -1)
        for i in range(LANES):
            if born[0, i] and rnk[0, i] == 0:
                count0[par[0, i]] = bin(int(sib[0][i])).count("1")
            if born[1, i] and rnk[1, i] == 0:
                first1[par[1, i]] = LANES + i
        before = np.where(born[1], count0[np.maximum(par[1], 0)], 0)
        for i in range(LANES):
            if born[1, i] and rnk[1, i] == 0 and before[i] == 0:
                fc[par[1, i]] = LANES + i
        rnk[1] += before
        nxt[0] = np.where(born[0] & (nxt[0] < 0), first1[np.maximum(par[0], 0)], nxt[0])
    W = (N + 31) // 32
    out = {k: [] for k in ("parent", "depth", "token", "rank", "logw", "first_child", "next_sibling", "mask")}
    for q in range(N):
        k, i = divmod(q, LANES)
        valid = q <= n
        out["parent"].append(par[k, i] if born[k, i] else -1)
        out["depth"].append(D[k, i] if valid else -1)
        out["token"].append(ids_s[(D[k, i] - 1) * Vs + rnk[k, i]] if born[k, i] else -1)
        out["rank"].append(rnk[k, i] if born[k, i] else -1)
        out["logw"].append(L[k, i] if valid else -np.inf)
        out["first_child"].append(fc[q])
        out["next_sibling"].append(nxt[k, i])
        out["mask"].append([(int(mask[k, i]) >> (32 * w)) & 0xFFFFFFFF if valid else 0 for w in range(W)])
    res = {k: np.array(v) for k, v in out.items()}
    res["logw"] = res["logw"].astype(F32)
    res["n_nodes"] = n
    return res


def random_case(rng: np.random.Generator):
    K = int(rng.choice([1, 2, 3, 5, 15, int(rng.integers(1, 65))]))
    V = int(rng.choice([1, 2, 3, 8, 31, 32, 33, int(rng.integers(1, 70))]))
    B = int(rng.integers(1, 64))
    kind = rng.integers(0, 6)
    if kind == 0:       # drafter-like
        raw = rng.normal(-2, 1.5, (K, V)).astype(F32)
    elif kind == 1:     # coarse grid: ties and -inf
        raw = rng.choice(np.array([0.0, -0.5, -1.0, -1.5, -2.25, -3.0, -7.125, -np.inf], F32), (K, V))
    elif kind == 2:     # positive log-probs too
        raw = rng.choice(np.array([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -np.inf], F32), (K, V))
    elif kind == 3:     # many exact ties, tiny magnitudes, -0.0
        raw = rng.choice(np.array([-0.0, 0.0, -1e-30, -1e-7, -1.0], F32), (K, V))
    elif kind == 4:     # peaked: greedy deep chains (a child wins right after its birth)
        raw = np.concatenate([np.full((K, 1), -0.01, F32), rng.normal(-6, 1, (K, V - 1)).astype(F32)], axis=1)
    else:               # large magnitudes, rounding in the sums
        raw = (rng.normal(0, 1, (K, V)) * 1e3).astype(F32)
    top_logp = -np.sort(-raw, axis=1)
    top_ids = rng.integers(0, 1 << 20, (K, V)).astype(np.int32)
    return top_logp.astype(F32), top_ids, B




def assert_matches_reference(top_logp: np.ndarray, top_ids: np.ndarray, budget: int) -> None:
    got = small_build(top_logp, top_ids, budget)
    want = tree_build(top_logp[None], top_ids[None], budget)
    assert got["n_nodes"] == want["n_nodes"][0]
    for name in ("parent", "depth", "token", "rank", "first_child", "next_sibling"):
        assert np.array_equal(got[name], want[name][0]), name
    assert np.array_equal(got["logw"].view(np.uint32), want["logw"][0].view(np.uint32)), "logw bits"
    assert np.array_equal(got["mask"].astype(np.uint32), want["mask"][0]), "mask"


@pytest.mark.parametrize("seed", range(8))
def test_small_path_matches_reference_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        assert_matches_reference(*random_case(rng))


@pytest.mark.parametrize("budget", [1, 2, 15, 16, 30, 31, 32, 33, 47, 62, 63])
@pytest.mark.parametrize("rows", ["one_rank", "all_tied", "masked_tail", "greedy_chain", "deepest"])
def test_small_path_matches_reference_on_edge_rows(budget, rows):
    if rows == "one_rank":          # V = 1: a single chain
        top_logp = np.full((15, 1), -0.5, F32)
    elif rows == "all_tied":        # every score ties: slots and ranks decide
        top_logp = np.full((3, 8), -1.0, F32)
    elif rows == "masked_tail":     # -inf past the first two ranks: children run out
        top_logp = np.full((4, 8), -np.inf, F32)
        top_logp[:, :2] = [-0.25, -0.75]
    elif rows == "greedy_chain":    # rank 0 dominates: each newborn wins the next step
        top_logp = np.concatenate([np.full((64, 1), -0.001, F32), np.full((64, 7), -9.0, F32)], axis=1)
    else:                           # K = 64 (the deepest) with zero log-probs
        top_logp = np.zeros((64, 2), F32)
    top_ids = np.arange(top_logp.size, dtype=np.int32).reshape(top_logp.shape)
    assert_matches_reference(top_logp, top_ids, budget)
