"""Parameters of 3 or more dims in muon.Muon: a param group's matrix_view says
how Muon sees them. Stacked experts ((E, m, n), torchtitan's GroupedExperts)
with "batched_leading" are E matrices, each orthogonalized and lr-adjusted for
its own m x n, as torch.optim.Muon steps E separate matrices; "flatten_trailing"
is one d0 x (d1*...) matrix (a convolution's filters). Sharded over ranks as
DTensors (experts split over an expert-parallel mesh dim 0, or each expert's
rows split as FSDP2 splits dim 1), 2 ranks end bit for bit where one process
ends. A group without a matrix_view is refused on every rank at construction,
naming the parameter and both views: flattening stacked experts into one
matrix would orthogonalize them together, silently."""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402
from real_torch_muon_test import fp32_torch_ns  # noqa: E402,F401 (a fixture)

EXPERTS, CONV, STEPS = (4, 12, 6), (6, 2, 3), 3


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(*EXPERTS, generator=g), torch.randn(*CONV, generator=g)


def _initial():
    g = torch.Generator().manual_seed(7)
    return torch.randn(*EXPERTS, generator=g), torch.randn(*CONV, generator=g)


def _groups(experts, conv):
    return [{"params": [experts], "matrix_view": "batched_leading"},
            {"params": [conv], "matrix_view": "flatten_trailing"}]


# fp32 Newton-Schulz on both sides (torch.optim.Muon's iteration monkeypatched to
# fp32, as real_torch_muon_test.py does): bf16 products sum in another order on
# a CPU whose bf16 engine is native (AMX, AVX512-BF16) than in torch's.
KWARGS = dict(lr=0.02, adjust_lr_fn="match_rms_adamw")
MUON_KWARGS = dict(KWARGS, ns_dtype="fp32")


def _one_process():
    w, c = _initial()
    experts, conv = torch.nn.Parameter(w.clone()), torch.nn.Parameter(c.clone())
    opt = muon.Muon(_groups(experts, conv), **MUON_KWARGS)
    for step in range(STEPS):
        experts.grad, conv.grad = _grads(step)
        opt.step()
    return experts.detach(), conv.detach()


def _torch_reference():
    """torch.optim.Muon on the E experts as E matrices and the conv flattened."""
    w, c = _initial()
    slices = [torch.nn.Parameter(w[k].clone()) for k in range(EXPERTS[0])]
    flat = torch.nn.Parameter(c.reshape(CONV[0], -1).clone())
    ref = torch.optim.Muon(slices + [flat], **KWARGS)
    for step in range(STEPS):
        ge, gc = _grads(step)
        for k, s in enumerate(slices):
            s.grad = ge[k].clone()
        flat.grad = gc.reshape(CONV[0], -1).clone()
        ref.step()
    return torch.stack([s.detach() for s in slices]), flat.detach()


def _sharded(rank, world, experts_dim):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    w, c = _initial()
    experts = torch.nn.Parameter(distribute_tensor(w, mesh, [Shard(experts_dim)]))
    conv = torch.nn.Parameter(distribute_tensor(c, mesh, [Replicate()]))
    opt = muon.Muon(_groups(experts, conv), distributed_config=muon.create_dtensor_config(),
                    **MUON_KWARGS)
    for step in range(STEPS):
        ge, gc = _grads(step)
        experts.grad = distribute_tensor(ge, mesh, [Shard(experts_dim)])
        conv.grad = distribute_tensor(gc, mesh, [Replicate()])
        opt.step()
    return experts.full_tensor().detach(), conv.full_tensor().detach()


def _refused(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    w, _ = _initial()
    experts = torch.nn.Parameter(distribute_tensor(w, mesh, [Shard(0)]))
    try:
        muon.Muon([experts], distributed_config=muon.create_dtensor_config(), **MUON_KWARGS)
    except ValueError as e:
        return str(e)
    return None


def test_batched_experts_step_as_separate_matrices_in_one_process(fp32_torch_ns):
    experts, conv = _one_process()
    slices, flat = _torch_reference()
    # torch.optim.Muon on E separate matrices: the same update per expert (each
    # scaled for its own shape), within fp32 rounding.
    assert (experts - slices).abs().max().item() <= 1e-6
    assert (conv.reshape(CONV[0], -1) - flat).abs().max().item() <= 1e-6
    moved = (experts - _initial()[0]).abs().max().item()
    assert moved > 1e-3  # it did step


@pytest.mark.parametrize("experts_dim", [0, 1], ids=["expert-parallel", "fsdp-rows"])
def test_sharded_experts_match_one_process_bit_for_bit(experts_dim):
    experts, conv = _one_process()
    for got_experts, got_conv in launch(_sharded, 2, experts_dim):
        assert torch.equal(got_experts, experts)
        assert torch.equal(got_conv, conv)


def test_without_a_matrix_view_every_rank_refuses_naming_the_views():
    messages = launch(_refused, 2)
    assert messages[0] is not None and messages[0] == messages[1]
    for part in ("shape (4, 12, 6) (3 dims)", "matrix_view", "'batched_leading'",
                 "'flatten_trailing' (one 4 x 72 matrix"):
        assert part in messages[0]
