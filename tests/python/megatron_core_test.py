"""Megatron-core's own tensor-parallel layers (megatron.core.tensor_parallel's
ColumnParallelLinear and RowParallelLinear, groups from parallel_state's
initialize_model_parallel) on 4 processes (TP 2 x DP 2, gloo on CPU), stepped
by muon.Muon with muon.megatron.create_megatron_config: after every step each
rank's pieces are, bit for bit, the pieces of single-process muon.Muon run on
the whole matrices with the same gradients (the TP pieces of the DP-averaged
gradients put together). A control that steps each rank's pieces as if they
were whole matrices (what a naive optimizer does) differs.

Megatron's DistributedDataParallel allocates its grad buffers on CUDA, so the
host averages the gradients over DP here (all_gather, rank-order sum), as
Megatron's DDP would.
"""

import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
import muon.megatron  # noqa: E402
from dist_harness import allgather_tensor, bits_equal, launch, max_abs_diff, ordered_mean, whole_over  # noqa: E402,E501

TP, WORLD = 2, 4
STEPS = 6
HP = dict(lr=0.02, weight_decay=0.1, momentum=0.95, ns_dtype="fp32")


def _model():
    from megatron.core import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    config = ModelParallelConfig(tensor_model_parallel_size=TP, use_cpu_initialization=True,
                                 params_dtype=torch.float32)
    init = torch.nn.init.xavier_normal_

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = ColumnParallelLinear(16, 24, config=config, init_method=init,
                                           bias=False, gather_output=False)
            self.down = RowParallelLinear(24, 16, config=config, init_method=init,
                                          bias=False, input_is_parallel=True,
                                          skip_bias_add=True)
            self.norm = torch.nn.LayerNorm(16)         # replicated over TP; AdamW's
            self.head = torch.nn.Linear(16, 6, bias=False)  # replicated over TP

        def forward(self, x):
            h, _ = self.up(x)
            y, _ = self.down(torch.tanh(h))
            return self.head(self.norm(y))

    torch.manual_seed(0)  # the same whole weights on every rank, each keeps its piece
    return Net()


def _batch(step, dp_rank):
    g = torch.Generator().manual_seed(100 * step + dp_rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 6, generator=g)


def _step_both(opt, ref, params, whole, tp_dims, groups, local_grads):
    """One step of `opt` on this rank's pieces and of single-process `ref` on the
    whole matrices, from this rank's gradients of its pieces (averaged over DP,
    put together over TP); then the largest difference and whether every
    piece is, bit for bit, its part of the whole."""
    tp_group, dp_group = groups
    for p, q, d, g in zip(params, whole, tp_dims, local_grads):
        p.grad = ordered_mean(allgather_tensor(g, dp_group))
        q.grad = whole_over(p.grad, d, tp_group)
    opt.step()
    ref.step()
    worst, exact = 0.0, True
    for p, q, d in zip(params, whole, tp_dims):
        got = whole_over(p, d, tp_group)
        worst = max(worst, max_abs_diff(got, q))
        exact = exact and bits_equal(got, q)
    return worst, exact


def _train(rank, naive, generic=False):
    from megatron.core import parallel_state as ps
    tp_group, dp_group = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group()
    model = _model()
    params = list(model.parameters())
    tp_dims = [muon.megatron.megatron_tp_dim(p) for p in params]
    if generic:  # the generic helper, no TP dims given: read from Megatron's attributes
        config = muon.create_processgroup_config(tp_pg=tp_group, dp_pg=dp_group)
    else:
        config = None if naive else muon.megatron.create_megatron_config(model=model)
    opt = muon.Muon(params, distributed_config=config, **HP)
    whole = [torch.nn.Parameter(whole_over(p, d, tp_group)) for p, d in zip(params, tp_dims)]
    ref = muon.Muon(whole, **HP)
    worst, exact = 0.0, True
    for step in range(STEPS):
        x, y = _batch(step, ps.get_data_parallel_rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        w, e = _step_both(opt, ref, params, whole, tp_dims, (tp_group, dp_group),
                          [p.grad for p in params])
        worst, exact = max(worst, w), exact and e
    stats = opt._groups[0].opt.stats() if not naive else {}
    return {"exact": exact, "worst": worst, "tp_dims": tp_dims,
            "orthogonalized": stats.get("matrices_orthogonalized"),
            "moved": not torch.equal(params[0].detach(), _model().up.weight.detach())}


GQA = dict(heads=4, groups=2, hidden=32)  # kv_channels 8: 16 query rows per group


def _gqa_layer():
    """One Megatron-core transformer layer (local spec, no TransformerEngine)
    with grouped-query attention: its linear_qkv.weight is Megatron's fused
    [groups x (q_per_group + 2) x kv_channels, hidden] layout, TP-split by
    groups."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(num_layers=1, hidden_size=GQA["hidden"],
                               num_attention_heads=GQA["heads"],
                               num_query_groups=GQA["groups"], tensor_model_parallel_size=TP,
                               use_cpu_initialization=True, params_dtype=torch.float32)
    torch.manual_seed(0)
    return build_module(get_gpt_layer_local_spec(), config=config, layer_number=1)


def _train_gqa(rank, split_qkv, by_group=False):
    """The layer's matrices stepped by muon.Muon over create_megatron_config(
    model=layer) against single-process muon.Muon on the whole matrices, the
    fused QKV in a group of its own with Megatron-core's split, computed here
    from the layer's config as Megatron-core's get_megatron_muon_optimizer
    does (heads // groups * kv_channels, kv_channels, kv_channels).
    by_group: the adapter told nothing (split_qkv=False, no model), the split
    given by muon.Muon's param group instead."""
    from megatron.core import parallel_state as ps
    tp_group, dp_group = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group()
    layer = _gqa_layer()
    named = [(n, p) for n, p in layer.named_parameters() if p.dim() == 2]
    params = [p for _, p in named]
    tp_dims = [muon.megatron.megatron_tp_dim(p) for p in params]
    cfg = layer.config
    megatrons = [cfg.num_attention_heads // cfg.num_query_groups * cfg.kv_channels,
                 cfg.kv_channels, cfg.kv_channels]
    if by_group:
        config = muon.megatron.create_megatron_config(split_qkv=False)
        opt = muon.Muon([{"params": [p], "split_sizes": megatrons}
                         if n.endswith("linear_qkv.weight") else {"params": [p]}
                         for n, p in named], distributed_config=config, **HP)
    else:
        config = muon.megatron.create_megatron_config(model=layer, split_qkv=split_qkv)
        opt = muon.Muon(params, distributed_config=config, **HP)
    whole = [torch.nn.Parameter(whole_over(p, d, tp_group)) for p, d in zip(params, tp_dims)]
    groups = [{"params": [w]} for w in whole]
    for (name, _), group in zip(named, groups):
        if name.endswith("linear_qkv.weight"):
            group["split_sizes"] = megatrons
    ref = muon.Muon(groups, **HP)
    worst, exact = 0.0, True
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        w, e = _step_both(opt, ref, params, whole, tp_dims, (tp_group, dp_group),
                          [torch.randn(p.shape, generator=gen) for p in params])
        worst, exact = max(worst, w), exact and e
    found = {n: v for n, p in named
             for q, v in muon.megatron.megatron_qkv_splits(layer).items() if q is p}
    return {"exact": exact, "worst": worst, "found": found, "megatrons": megatrons,
            "qkv_global": [tuple(w.shape) for (n, _), w in zip(named, whole)
                           if n.endswith("linear_qkv.weight")]}


def _worker(rank, world):
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    assert dist.get_world_size(ps.get_data_parallel_group()) == WORLD // TP
    out = {"muon": _train(rank, naive=False), "naive": _train(rank, naive=True),
           "generic": _train(rank, naive=False, generic=True),
           "gqa": _train_gqa(rank, split_qkv=True), "gqa_whole": _train_gqa(rank, False),
           "gqa_group": _train_gqa(rank, False, by_group=True)}
    ps.destroy_model_parallel()
    return out


@pytest.fixture(scope="module")
def runs():
    import megatron.core  # noqa: F401  (tools/python-requirements.txt pins it: no skip)
    return launch(_worker, WORLD)


def test_bit_for_bit_with_single_process_muon_on_the_same_gradients(runs):
    for rank, res in enumerate(runs):
        # up: column-parallel (dim 0), down: row-parallel (dim 1), the rest replicated.
        assert res["muon"]["tp_dims"] == [0, 1, None, None, None], res["muon"]["tp_dims"]
        assert res["muon"]["moved"], rank
        assert res["muon"]["exact"], "rank %d differs by up to %g" % (rank, res["muon"]["worst"])
    # up, down and head, each orthogonalized once per step in the whole job.
    assert sum(r["muon"]["orthogonalized"] for r in runs) == 3
    print("\nMegatron TP 2 x DP 2, %d steps: largest difference %g"
          % (STEPS, max(r["muon"]["worst"] for r in runs)))


def test_the_generic_helper_reads_megatrons_tp_attributes(runs):
    # muon.create_processgroup_config(tp_pg=..., dp_pg=...) with no tp_dims: the
    # same bits as the Megatron adapter, each matrix orthogonalized once.
    for rank, res in enumerate(runs):
        assert res["generic"]["exact"], "rank %d differs by up to %g" % (
            rank, res["generic"]["worst"])
    assert sum(r["generic"]["orthogonalized"] for r in runs) == 3


def test_fused_qkv_is_split_as_megatron_cores_muon_splits_it(runs):
    # Megatron-core's default (OptimizerConfig.muon_split_qkv=True): the fused
    # QKV of a GQA layer (2 groups of 16 query, 8 key, 8 value rows) is three
    # matrices; bit for bit with single-process muon.Muon given that split.
    for rank, res in enumerate(runs):
        gqa = res["gqa"]
        assert gqa["megatrons"] == [16, 8, 8]
        assert list(gqa["found"].values()) == [(0, [16, 8, 8])], gqa["found"]
        assert list(gqa["found"])[0].endswith("self_attention.linear_qkv.weight")
        assert gqa["qkv_global"] == [(64, 32)]
        assert gqa["exact"], "rank %d differs by up to %g" % (rank, gqa["worst"])
        # The same split given by a param group instead of the adapter.
        assert res["gqa_group"]["exact"], (rank, res["gqa_group"]["worst"])
        # split_qkv=False orthogonalizes the fused QKV whole: not Megatron's.
        assert not res["gqa_whole"]["exact"] and res["gqa_whole"]["worst"] > 1e-4, rank
    print("\nMegatron GQA layer, TP 2 x DP 2, fused QKV split [16, 8, 8]: largest difference "
          "%g; kept whole: %g" % (max(r["gqa"]["worst"] for r in runs),
                                  max(r["gqa_whole"]["worst"] for r in runs)))


def test_a_naive_optimizer_on_the_pieces_differs(runs):
    worst = max(r["naive"]["worst"] for r in runs)
    print("\nMegatron TP pieces stepped as whole matrices: differs by up to %g" % worst)
    assert worst > 1e-3


def test_the_adapter_says_what_it_cannot_map():
    expert = torch.nn.Parameter(torch.zeros(4, 4))
    expert.allreduce = False  # how Megatron's MoE marks an expert parameter
    expert.tensor_model_parallel, expert.partition_dim = True, 1
    assert muon.megatron.megatron_tp_dim(expert) == 1  # over its expert TP group
    from megatron.core import parallel_state as ps
    assert not ps.model_parallel_is_initialized()
    with pytest.raises(RuntimeError, match="initialize_model_parallel first"):
        muon.megatron.create_megatron_config()
    with pytest.raises(ValueError, match="replicated_mode must be"):
        muon.megatron.create_megatron_config(replicated_mode="zero3")
