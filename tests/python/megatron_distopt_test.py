"""Megatron-core's distributed-optimizer layout stepped by muon.Muon, on 4
processes (TP 2 x DP 2, gloo on CPU): Megatron's own DistributedDataParallel
(use_distributed_optimizer=True, overlapped grad reduce in 300-element
buckets) over its ColumnParallelLinear / RowParallelLinear layers, so each
DP rank owns a flat range of each TP piece (ranges split rows, padding
between params, several buckets). muon.Muon with
muon.megatron.create_megatron_config(ddp=ddp) steps exactly those ranges
from the reduce-scattered main_grad and ends with the DDP param all-gather.
After every step each rank's pieces are, bit for bit, those of
single-process muon.Muon on the whole matrices with the same (DP-averaged)
gradients; each matrix is orthogonalized once per step in the job; the
ranges are Megatron's own (DistributedOptimizer._build_model_gbuf_range on
the real buffers) and tile every parameter.

Megatron's DDP allocates its buffers with device=torch.cuda.current_device()
and takes no device argument: the test points that call at the CPU (in its
own processes only), nothing else is changed.
"""

import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import allgather_tensor, bits_equal, launch, max_abs_diff, ordered_mean, whole_over  # noqa: E402,E501

TP, WORLD = 2, 4
STEPS = 4
HP = dict(lr=0.02, weight_decay=0.1, momentum=0.95, ns_dtype="fp32")


def _model():
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=TP,
                            tensor_model_parallel_size=TP, use_cpu_initialization=True,
                            params_dtype=torch.float32)
    init = torch.nn.init.xavier_normal_

    class Net(MegatronModule):
        def __init__(self):
            super().__init__(config=cfg)
            self.up = ColumnParallelLinear(16, 38, config=cfg, init_method=init, bias=True,
                                           gather_output=False)
            self.down = RowParallelLinear(38, 16, config=cfg, init_method=init, bias=False,
                                          input_is_parallel=True, skip_bias_add=True)
            self.norm = torch.nn.LayerNorm(16)
            self.head = torch.nn.Linear(16, 7, bias=False)

        def forward(self, x):
            h, _ = self.up(x)
            y, _ = self.down(torch.tanh(h))
            return self.head(self.norm(y))

    torch.manual_seed(0)
    return cfg, Net()


def _batch(step, dp_rank):
    g = torch.Generator().manual_seed(100 * step + dp_rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 7, generator=g)


def _worker(rank, world):
    warnings.filterwarnings("ignore")
    torch.cuda.current_device = lambda: torch.device("cpu")  # see the module's docstring
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig)
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    tp_group, dp_group = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group()
    cfg, model = _model()
    _, local = _model()  # the same weights: computes this rank's own (unreduced) gradients
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        use_distributed_optimizer=True, overlap_grad_reduce=True, bucket_size=300), model)
    params = list(ddp.module.parameters())
    tp_dims = [muon.megatron.megatron_tp_dim(p) for p in params]

    # The ranges: Megatron's own recipe on the real buffers, and a tiling.
    ranges = muon.megatron.megatron_flat_ranges(ddp)
    theirs = {}
    for buf in ddp.buffers:
        for b in range(len(buf.buckets)):
            for p, r in DistributedOptimizer._build_model_gbuf_range(buf, b)["param_map"].items():
                theirs[p] = (r["param"].start, r["param"].size)
    ours = {p: r for p, r in ranges.items() if r[1]}
    everyone = [None] * dist.get_world_size(dp_group)
    dist.all_gather_object(everyone, [ranges[p] for p in params], group=dp_group)
    tiles = all(_tiling(p.numel(), [e[k] for e in everyone]) is not None
                for k, p in enumerate(params))

    opt = muon.Muon(params, distributed_config=muon.megatron.create_megatron_config(ddp=ddp),
                    **HP)
    whole = [torch.nn.Parameter(whole_over(p, d, tp_group)) for p, d in zip(params, tp_dims)]
    ref = muon.Muon(whole, **HP)
    worst, exact = 0.0, True
    for step in range(STEPS):
        x, y = _batch(step, ps.get_data_parallel_rank())
        with torch.no_grad():
            for p, q in zip(params, local.parameters()):
                q.copy_(p)
        local.zero_grad()
        torch.nn.functional.mse_loss(local(x), y).backward()
        ddp.zero_grad_buffer()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        ddp.finish_grad_sync()
        opt.step()
        for q, l, d in zip(whole, local.parameters(), tp_dims):
            q.grad = whole_over(ordered_mean(allgather_tensor(l.grad, dp_group)), d, tp_group)
        ref.step()
        for p, q, d in zip(params, whole, tp_dims):
            got = whole_over(p, d, tp_group)
            worst = max(worst, max_abs_diff(got, q))
            exact = exact and bits_equal(got, q)
    state = opt.state_dict()["state"]
    out = {"exact": exact, "worst": worst, "tp_dims": tp_dims,
           "same_ranges_as_megatron": ours == theirs, "tiles": tiles,
           "split": sum(1 for p, r in ranges.items() if 0 < r[1] < p.numel()),
           "buckets": [len(b.buckets) for b in ddp.buffers],
           "orthogonalized": opt.stats()["matrices_orthogonalized"],
           "state_shapes": {k: tuple(v["momentum_buffer"].shape) for k, v in state.items()
                            if "momentum_buffer" in v},
           "param_shapes": [tuple(p.shape) for p in params]}
    ps.destroy_model_parallel()
    return out


def _tiling(numel, pieces):
    """The (start, end) of pieces that tile [0, numel) in order, or None."""
    spans = sorted((s, s + n) for s, n in pieces if n)
    at = 0
    for s, e in spans:
        if s != at:
            return None
        at = e
    return spans if at == numel else None


@pytest.fixture(scope="module")
def runs():
    import megatron.core  # noqa: F401  (tools/python-requirements.txt pins it: no skip)
    return launch(_worker, WORLD)


def test_bit_for_bit_with_single_process_muon_on_the_same_gradients(runs):
    for rank, res in enumerate(runs):
        # up: column-parallel (dim 0, and its bias), down: row-parallel (dim 1).
        assert res["tp_dims"] == [0, 0, 1, None, None, None], res["tp_dims"]
        assert res["exact"], "rank %d differs by up to %g" % (rank, res["worst"])
    # up, down and head, each orthogonalized once per step in the whole job.
    assert sum(r["orthogonalized"] for r in runs) == 3
    print("\nMegatron distributed-optimizer layout, TP 2 x DP 2, %d steps: largest "
          "difference %g" % (STEPS, max(r["worst"] for r in runs)))


def test_ranges_are_megatrons_and_split_params(runs):
    for res in runs:
        assert res["same_ranges_as_megatron"] and res["tiles"]
        assert any(n > 1 for n in res["buckets"]), res["buckets"]
    # Some parameter is split between the DP ranks (not owned whole by one).
    assert any(r["split"] > 0 for r in runs)


def test_state_is_shaped_like_the_params(runs):
    for res in runs:
        assert sorted(res["state_shapes"].values()) == sorted(
            s for s in res["param_shapes"] if len(s) == 2)
