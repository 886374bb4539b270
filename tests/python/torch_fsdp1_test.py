"""The design's Example 1 as written, under torch's own FSDP1
(FullyShardedDataParallel, use_orig_params=False: model.parameters() yields
FlatParameters, 1-D buffers holding ranges of several weights and biases)
on 4 gloo processes:

    model = FSDP(model, ...)
    optimizer = Muon(model.parameters(), lr=0.02, momentum=0.95, nesterov=True,
                     ns_steps=5, distributed_config=create_processgroup_config(
                         fsdp_pg=model.process_group))

Each rank steps its ranges of every matrix through the library (Newton-Schulz
of the whole matrix, once in the job) and its ranges of every bias through
AdamW. Against single-process muon.Muon on the same (gathered) gradients,
bit for bit (fp32 Newton-Schulz). The optimizer's state is the
FlatParameters' (torch's format): FSDP1's own optim_state_dict turns it into
per-weight state equal to the single-process optimizer's, and a state_dict
saved at step 2 resumes bit for bit in a fresh optimizer. The same with
normuon=True: NorMuon's moments (whole-matrix state) ride in each
FlatParameter's state as a dict by weight name."""

import copy

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 4
STEPS = 4
RESUME_AT = 2
MATRICES = 5  # 2 blocks x (up, down) + head


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(10, 14)
        self.down = torch.nn.Linear(14, 10)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.head = torch.nn.Linear(10, 3)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def _batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(6, 10, generator=g), torch.randn(6, 3, generator=g)


def _fsdp1_model():
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    torch.manual_seed(0)
    return FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}),
                device_id=torch.device("cpu"))


def _full_params(model):
    """Every weight's whole value, by name (FSDP1 unshards them)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    with FSDP.summon_full_params(model):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def _full_grads(model):
    """Every weight's whole (averaged) gradient, by name: each FlatParameter's
    gradient shard put in its data for a moment and unsharded by FSDP1."""
    flats = list(model.parameters())
    saved = [p.detach().clone() for p in flats]
    with torch.no_grad():
        for p in flats:
            p.copy_(p.grad)
    grads = _full_params(model)
    with torch.no_grad():
        for p, s in zip(flats, saved):
            p.copy_(s)
    return grads


def _example_1_optimizer(model, normuon=False):
    # The design's Example 1, as written (fp32 Newton-Schulz for a bit-for-bit check).
    return muon.Muon(model.parameters(), lr=0.02, momentum=0.95, nesterov=True, ns_steps=5,
                     ns_dtype="fp32", normuon=normuon,
                     distributed_config=muon.create_processgroup_config(
                         fsdp_pg=model.process_group))


def _train(rank, model, opt, reference, ref_opt, steps):
    worst, exact = 0.0, True
    for step in steps:
        x, y = _batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads = _full_grads(model)
        for n, q in reference.named_parameters():
            q.grad = grads[n].clone()
        opt.step()
        ref_opt.step()
        got = _full_params(model)
        for n, q in reference.named_parameters():
            worst = max(worst, (got[n] - q.detach()).abs().max().item())
            exact = exact and torch.equal(got[n], q.detach())
    return worst, exact


def _worker(rank, world, normuon=False):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    torch.set_num_threads(1)
    model = _fsdp1_model()
    flats = list(model.parameters())
    assert all(p.ndim == 1 for p in flats)
    start = _full_params(model)
    reference = Net()
    with torch.no_grad():
        for n, q in reference.named_parameters():
            q.copy_(start[n])
    opt = _example_1_optimizer(model, normuon)
    ref_opt = muon.Muon(reference.parameters(), lr=0.02, ns_dtype="fp32", normuon=normuon)
    worst, exact = _train(rank, model, opt, reference, ref_opt, range(RESUME_AT))

    # A checkpoint: the optimizer's own state_dict (buffer-shaped state), and
    # FSDP1's per-weight view of it.
    saved = copy.deepcopy(opt.state_dict())
    shapes = {k: {n: tuple(v.shape) for n, v in s.items() if torch.is_tensor(v) and v.ndim}
              for k, s in saved["state"].items()}
    full_osd = FSDP.optim_state_dict(model, opt)
    ref_state = ref_opt.state_dict()["state"]
    names = [n for n, _ in reference.named_parameters()]
    fsdp_vs_ref = {}
    for i, n in enumerate(names):
        mine, theirs = full_osd["state"][n], ref_state[i]
        # Buffer-shaped state covers every key for every weight: the ones the
        # single-process optimizer has are equal, the others (a matrix's AdamW
        # moments, a bias's momentum) zero.
        fsdp_vs_ref[n] = set(theirs) <= set(mine) and all(
            torch.equal(mine[k].reshape(theirs[k].shape).to(theirs[k].dtype), theirs[k])
            if k in theirs else not mine[k].any()
            for k in mine if torch.is_tensor(mine[k]) and mine[k].ndim > 0)

    # The rest of the run in a fresh optimizer loaded from the checkpoint.
    resumed = _example_1_optimizer(model, normuon)
    resumed.load_state_dict(saved)
    worst2, exact2 = _train(rank, model, resumed, reference, ref_opt, range(RESUME_AT, STEPS))
    moments = {k: sorted(s.get("normuon_second_moment", {})) for k, s in saved["state"].items()}
    return {"exact": exact and exact2, "worst": max(worst, worst2), "moments": moments,
            "flat_numels": [p.numel() for p in flats], "state_shapes": shapes,
            "fsdp_vs_ref": fsdp_vs_ref,
            "orthogonalized": resumed.stats()["matrices_orthogonalized"],
            "moved": not torch.equal(_full_params(model)["head.weight"], start["head.weight"])}


@pytest.fixture(scope="module")
def runs():
    return launch(_worker, WORLD)


def test_example_1_as_written_equals_single_process_muon(runs):
    for rank, res in enumerate(runs):
        assert res["moved"], rank
        assert res["exact"], "rank %d differs by up to %g" % (rank, res["worst"])
    # Each matrix orthogonalized once in the job per step, not once per rank.
    assert sum(r["orthogonalized"] for r in runs) == MATRICES
    print("\nFSDP1 Example 1: %d steps on %d ranks, largest difference %g"
          % (STEPS, WORLD, max(r["worst"] for r in runs)))


def test_state_is_the_flat_parameters_and_fsdp1_reads_it(runs):
    for rank, res in enumerate(runs):
        # One entry per FlatParameter, its tensors shaped like it.
        assert len(res["state_shapes"]) == len(res["flat_numels"]), res["state_shapes"]
        for k, numel in enumerate(res["flat_numels"]):
            assert set(res["state_shapes"][k]) == {"momentum_buffer", "exp_avg",
                                                   "exp_avg_sq"}, res["state_shapes"][k]
            assert all(s == (numel,) for s in res["state_shapes"][k].values())
        # FSDP1's optim_state_dict: per weight, equal to the single-process state.
        assert res["fsdp_vs_ref"] and all(res["fsdp_vs_ref"].values()), res["fsdp_vs_ref"]


def test_example_1_with_normuon_resumes_bit_for_bit():
    """NorMuon's second moments are a whole matrix's, kept by its owner: in a
    FlatParameter's state, by the names of the weights whose ranges it holds
    (before, state_dict() failed folding them into the buffer's shape)."""
    for rank, res in enumerate(launch(_worker, WORLD, True)):
        assert res["moved"], rank
        assert res["exact"], "rank %d differs by up to %g" % (rank, res["worst"])
        named = [n for names in res["moments"].values() for n in names]
        assert named and all(n.endswith("weight") for n in named), res["moments"]
