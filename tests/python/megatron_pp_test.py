"""Megatron-core's pipeline parallel (parallel_state.initialize_model_parallel
with pipeline_model_parallel_size=2 and tensor_model_parallel_size=2, 4 gloo
processes): each stage builds its own layers from Megatron's
ColumnParallelLinear and RowParallelLinear, under the same module names on
both stages, as Megatron's stages number their layers from 0.
muon.megatron.create_megatron_config(model=stage) reads the pipeline group
from parallel_state and prefixes each param's name with its stage. After every step
each rank's pieces are, bit for bit, those of single-process muon.Muon on
its stage's whole matrices with the same gradients; each matrix is
orthogonalized once per step by one rank of its stage's TP group. Groups
given by hand without the pipeline group are refused on every rank (TP x DP
covers half the world), not mixed up across stages."""

import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
import muon.megatron  # noqa: E402
from dist_harness import bits_equal, launch, whole_over  # noqa: E402

TP, PP, WORLD, STEPS = 2, 2, 4, 3
HP = dict(lr=0.02, weight_decay=0.1, momentum=0.95, ns_dtype="fp32")
WIDTH = {0: 24, 1: 12}  # the stages' hidden widths: different matrices under the same names


def _stage(stage):
    from megatron.core import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    config = ModelParallelConfig(tensor_model_parallel_size=TP, use_cpu_initialization=True,
                                 params_dtype=torch.float32)
    init = torch.nn.init.xavier_normal_
    torch.manual_seed(20 + stage)
    layer = torch.nn.Module()
    layer.up = ColumnParallelLinear(16, WIDTH[stage], config=config, init_method=init,
                                    bias=False, gather_output=False)
    layer.down = RowParallelLinear(WIDTH[stage], 16, config=config, init_method=init,
                                   bias=False, input_is_parallel=True, skip_bias_add=True)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([layer])  # "layers.0..." on each stage
    return model


def _grad(stage, step, name, shape):
    g = torch.Generator().manual_seed(1000 * step + 100 * stage + len(name))
    return torch.randn(shape, generator=g)


def _piece(whole, dim, tp_rank):
    return whole.chunk(TP, dim)[tp_rank].contiguous()


def _worker(rank, world):
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP)
    stage, tp_group = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_group()
    tp_rank = ps.get_tensor_model_parallel_rank()
    model = _stage(stage)
    named = list(model.named_parameters())
    dims = {n: muon.megatron.megatron_tp_dim(p) for n, p in named}
    opt = muon.Muon([p for _, p in named], distributed_config=muon.megatron.create_megatron_config(
        model=model), **HP)
    whole = {n: torch.nn.Parameter(whole_over(p, dims[n], tp_group)) for n, p in named}
    ref = muon.Muon(list(whole.values()), **HP)
    start = {n: w.detach().clone() for n, w in whole.items()}
    exact = True
    for step in range(STEPS):
        for n, p in named:
            g = _grad(stage, step, n, tuple(whole[n].shape))
            whole[n].grad = g
            p.grad = _piece(g, dims[n], tp_rank)
        opt.step()
        ref.step()
        exact = exact and all(bits_equal(whole_over(p, dims[n], tp_group), whole[n].detach())
                              for n, p in named)
    moved = min((whole[n].detach() - start[n]).abs().max().item() for n in whole)
    names = sorted(opt._groups[0].opt.param_name(k) for k in range(opt._groups[0].opt.num_params))
    orthogonalized = opt._groups[0].opt.stats()["matrices_orthogonalized"]
    ps.destroy_model_parallel()
    return {"stage": stage, "exact": exact, "moved": moved, "names": names,
            "orthogonalized": orthogonalized}


def _without_pp_group(rank, world):
    """The groups given by hand without the pipeline group: the stages would
    name their params alike ("group0.param0") though they are other
    matrices."""
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP)
    stage, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    model = _stage(stage)
    config = muon.megatron.create_megatron_config(
        model=model, tp_group=ps.get_tensor_model_parallel_group(),
        dp_group=ps.get_data_parallel_group())
    opt = muon.Muon(model.parameters(), distributed_config=config, **HP)
    for n, p in model.named_parameters():
        dim = muon.megatron.megatron_tp_dim(p)
        shape = list(p.shape)
        shape[dim] *= TP
        p.grad = _piece(_grad(stage, 0, n, tuple(shape)), dim, tp_rank)
    try:
        opt.step()
    except Exception as e:  # noqa: BLE001 (the refusal is the result)
        return str(e)
    finally:
        ps.destroy_model_parallel()
    return None


def test_a_config_without_the_pipeline_group_is_refused_not_mixed():
    import megatron.core  # noqa: F401
    for rank, message in enumerate(launch(_without_pp_group, WORLD)):
        # TP 2 x DP 1 covers half the world: refused on every rank, naming the sizes
        assert message is not None and "multiply to 2 but the world has 4 ranks" in message \
            and "every rank raises this" in message, (rank, message)


def test_pipeline_stages_step_bit_for_bit_as_one_process_each():
    import megatron.core  # noqa: F401  (tools/python-requirements.txt pins it: no skip)
    runs = launch(_worker, WORLD)
    assert sorted(r["stage"] for r in runs) == [0, 0, 1, 1]
    for rank, r in enumerate(runs):
        assert r["exact"], rank
        assert r["moved"] > 1e-3, rank
        # the same (default) names on both stages, told apart by the stage
        assert r["names"] == ["stage%d.group0.param0" % r["stage"],
                              "stage%d.group0.param1" % r["stage"]], (rank, r["names"])
    for stage in (0, 1):  # each of the stage's 2 matrices once per step, on one TP rank
        assert sum(r["orthogonalized"] for r in runs if r["stage"] == stage) == 2
