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
from dist_harness import allgather_tensor, bits_equal, launch, max_abs_diff, ordered_mean  # noqa: E402,E501

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


def _whole(t, dim, tp_group):
    """A piece of a parameter or gradient (TP-split along `dim`, None when
    replicated) put together over TP."""
    return t.detach().clone() if dim is None else \
        torch.cat(allgather_tensor(t.detach(), tp_group), dim)


def _batch(step, dp_rank):
    g = torch.Generator().manual_seed(100 * step + dp_rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 6, generator=g)


def _train(rank, naive, generic=False):
    from megatron.core import parallel_state as ps
    tp_group, dp_group = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group()
    model = _model()
    params = list(model.parameters())
    tp_dims = [muon.megatron.megatron_tp_dim(p) for p in params]
    if generic:  # the generic helper, no TP dims given: read from Megatron's attributes
        config = muon.create_processgroup_config(tp_pg=tp_group, dp_pg=dp_group)
    else:
        config = None if naive else muon.megatron.create_megatron_config()
    opt = muon.Muon(params, distributed_config=config, **HP)
    whole = [torch.nn.Parameter(_whole(p, d, tp_group)) for p, d in zip(params, tp_dims)]
    ref = muon.Muon(whole, **HP)
    worst, exact = 0.0, True
    for step in range(STEPS):
        x, y = _batch(step, ps.get_data_parallel_rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p, q, d in zip(params, whole, tp_dims):
            p.grad = ordered_mean(allgather_tensor(p.grad, dp_group))
            q.grad = _whole(p.grad, d, tp_group)
        opt.step()
        ref.step()
        for p, q, d in zip(params, whole, tp_dims):
            got = _whole(p, d, tp_group)
            worst = max(worst, max_abs_diff(got, q))
            exact = exact and bits_equal(got, q)
    stats = opt._groups[0].opt.stats() if not naive else {}
    return {"exact": exact, "worst": worst, "tp_dims": tp_dims,
            "orthogonalized": stats.get("matrices_orthogonalized"),
            "moved": not torch.equal(params[0].detach(), _model().up.weight.detach())}


def _worker(rank, world):
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    assert dist.get_world_size(ps.get_data_parallel_group()) == WORLD // TP
    out = {"muon": _train(rank, naive=False), "naive": _train(rank, naive=True),
           "generic": _train(rank, naive=False, generic=True)}
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


def test_a_naive_optimizer_on_the_pieces_differs(runs):
    worst = max(r["naive"]["worst"] for r in runs)
    print("\nMegatron TP pieces stepped as whole matrices: differs by up to %g" % worst)
    assert worst > 1e-3


def test_the_adapter_says_what_it_cannot_map():
    expert = torch.nn.Parameter(torch.zeros(4, 4))
    expert.allreduce = False  # how Megatron's MoE marks an expert parameter
    with pytest.raises(ValueError, match="expert parameter"):
        muon.megatron.megatron_tp_dim(expert)
    from megatron.core import parallel_state as ps
    assert not ps.model_parallel_is_initialized()
    with pytest.raises(RuntimeError, match="initialize_model_parallel first"):
        muon.megatron.create_megatron_config()
