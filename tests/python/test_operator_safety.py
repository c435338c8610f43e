"""Issue 79: no operator call crashes a rank, trips an internal assert or leaves ranks disagreeing.

- batch norm, every entry point, training and eval, on batch splits that leave 1 or 0 rows on a
  rank, with running statistics plain, Replicate and (eval) split: values, the running
  statistics written in place and gradients, against one process, at 1-4 ranks (a split eval
  running mean reached the kernel as rank 2's empty piece and segfaulted it);
- torch's OpInfo samples of the operators the issue found (tests/python/opinfo_sweep.py, at
  world size 3): no crash, internal assert, storage error, disagreement or wrong value.
"""

import pytest
import torch

from oracle import assert_close, chunk_sizes
from opinfo_sweep import run_sweep, summary
from ranks import run_ranks

WORLD_SIZES = [1, 2, 3, 4]


def _batch_norm_calls():
    """(name, training, call(x, w, b, rm, rv) -> output tensor or tuple)."""
    aten = torch.ops.aten
    calls = []
    for training in (True, False):
        calls += [
            ("F.batch_norm", training, lambda x, w, b, rm, rv, t=training: torch.nn.functional.batch_norm(x, rm, rv, w, b, t, 0.3, 1e-5)),
            ("torch.batch_norm", training, lambda x, w, b, rm, rv, t=training: torch.batch_norm(x, w, b, rm, rv, t, 0.3, 1e-5, False)),
            ("native_batch_norm", training, lambda x, w, b, rm, rv, t=training: aten.native_batch_norm(x, w, b, rm, rv, t, -1.2, 1e-5)),
            ("_native_batch_norm_legit", training, lambda x, w, b, rm, rv, t=training: aten._native_batch_norm_legit(x, w, b, rm, rv, t, -1.2, 1e-5)),
        ]
    calls += [
        ("_native_batch_norm_legit.no_stats", True, lambda x, w, b, rm, rv: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.3, 1e-5)),
        ("_native_batch_norm_legit_no_training", False, lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.3, 1e-5)),
        ("_batch_norm_with_update", True, lambda x, w, b, rm, rv: aten._batch_norm_with_update(x, w, b, rm, rv, 0.3, 1e-5)[:3]),
        ("_batch_norm_no_update", False, lambda x, w, b, rm, rv: aten._batch_norm_no_update(x, w, b, rm, rv, 0.3, 1e-5)[:3]),
    ]
    return calls


def batch_norm_body(rank, world_size):
    import shardtensor as st

    mesh = st.init_device_mesh("cpu", (world_size,))
    rows = max(1, world_size - 1)                      # pieces of 1 row, and one of 0 past one rank
    assert chunk_sizes(rows, world_size)[-1] == (0 if world_size > 1 else 1)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, 3, 4, generator=g, dtype=torch.float64)
    w, b = torch.randn(3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    stats = (torch.randn(3, generator=g, dtype=torch.float64), torch.rand(3, generator=g, dtype=torch.float64) + 0.5)

    def stats_as(kind):
        rm, rv = (s.clone() for s in stats)
        if kind == "plain":
            return rm, rv
        placement = st.Replicate() if kind == "replicate" else st.Shard(0)
        return tuple(st.distribute_tensor(s, mesh, [placement]) for s in (rm, rv))

    def whole(t):
        return t.full_tensor() if isinstance(t, st.ShardTensor) else t

    for name, training, call in _batch_norm_calls():
        # A split running mean is read whole in eval; in training it is written, and must be whole.
        for kind in ("plain", "replicate") + (() if training else ("split",)):
            what = f"{name} training={training} running stats {kind}"
            xe, we, be = (t.clone().requires_grad_() for t in (x, w, b))
            rm_e, rv_e = (s.clone() for s in stats)
            expected = call(xe, we, be, rm_e, rv_e)
            expected_out = expected[0] if isinstance(expected, (tuple, list)) else expected

            xs = st.distribute_tensor(x, mesh, [st.Shard(0)]).requires_grad_()
            ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()
            rm, rv = stats_as(kind)
            actual = call(xs, ws, bs, rm, rv)
            actual_out = actual[0] if isinstance(actual, (tuple, list)) else actual
            assert_close(whole(actual_out), expected_out.detach(), what)
            if isinstance(expected, (tuple, list)):
                for k in (1, 2):
                    if expected[k].numel():
                        assert_close(whole(actual[k]), expected[k].detach(), f"{what}: output {k}")
            assert_close(whole(rm), rm_e, f"{what}: running mean")
            assert_close(whole(rv), rv_e, f"{what}: running var")

            seed = torch.randn(expected_out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
            (expected_out * seed).sum().backward()
            (actual_out * st.distribute_tensor(seed, mesh, [st.Shard(0)])).sum().backward()
            assert_close(xs.grad.full_tensor(), xe.grad, f"{what}: input gradient")
            if ws.grad is not None or we.grad is not None:
                assert_close(whole(ws.grad), we.grad, f"{what}: weight gradient")
                assert_close(whole(bs.grad), be.grad, f"{what}: bias gradient")

    # Training writes the running statistics: a split one is refused on every rank, saying so.
    rm, rv = stats_as("split")
    with pytest.raises(RuntimeError, match="running mean is updated in place, so it must be replicated"):
        torch.ops.aten._native_batch_norm_legit(st.distribute_tensor(x, mesh, [st.Shard(0)]), w, b, rm, rv, True, 0.3, 1e-5)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_batch_norm_entry_points_on_one_and_zero_row_pieces(world_size):
    run_ranks(batch_norm_body, world_size)


# The operators issue 79 found crashing a rank, asserting, reaching a storage error or raising
# where one process computes, with the composites that reach them.
ISSUE_79_OPS = (
    "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update", "nn.functional.batch_norm",
    "linalg.eigvalsh", "linalg.eigh", "linalg.matrix_rank", "linalg.qr", "linalg.svdvals",
    "nn.functional.max_pool1d", "tensor_split", "nn.functional.ctc_loss",
    "squeeze", "unfold", "diagonal", "linalg.diagonal", "corrcoef", "as_strided", "stft",
    "nn.functional.linear_cross_entropy",
)
# The one refusal among them: training batch norm writes its running statistics, which must be
# whole (Replicate) to be written; a split one is a clear error on every rank.
_ALLOWED_ERRORS = ("is updated in place, so it must be replicated",)


def test_issue_79_operators_against_one_process():
    cases = run_sweep(world_size=3, selected=set(ISSUE_79_OPS))
    ran = {c["op"].split(".")[0] if not c["op"].startswith(("nn.", "linalg.")) else c["op"] for c in cases}
    assert len(cases) > 300, f"only {len(cases)} cases ran"
    missing = {op for op in ISSUE_79_OPS if not any(c["op"] == op or c["op"].startswith(op + ".") for c in cases)}
    assert not missing, f"no case ran for {sorted(missing)} (ran {sorted(ran)})"
    bad = [c for c in cases if c["outcome"] not in ("ok", "skipped", "error")
           or (c["outcome"] == "error" and not any(a in c["detail"] for a in _ALLOWED_ERRORS))]
    assert not bad, summary(bad)
