"""The distributed configs in one process: argument checks, what they hand to
the low-level optimizer, and DeviceMesh / DTensor needing torch >= 2.x."""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from muon import _config  # noqa: E402

HAS_MESH = _config._device_mesh_class() is not None
HAS_DTENSOR = _config._dtensor_class() is not None
NEEDS_2X = "torch %s has no DeviceMesh/DTensor (they need torch >= 2.x)" % torch.__version__


def _noop(*args):
    return None


def test_exports():
    for name in ("TorchDistComm", "DistributedConfig", "create_processgroup_config",
                 "create_auto_config", "create_devicemesh_config", "create_dtensor_config"):
        assert hasattr(muon, name) and name in muon.__all__, name
    assert issubclass(muon.TorchDistComm, muon.Communicator)


def test_pipeline_options_reach_the_low_level_optimizer():
    cfg = muon.DistributedConfig(_noop, _noop, _noop, prefetch_count=2,
                                 async_gpu_parallelism=False)
    assert cfg._options() == {"prefetch_count": 2, "async_parallelism": False}
    opt = muon.Optimizer(**cfg._options())
    assert opt.options()["prefetch_count"] == 2 and opt.options()["async_parallelism"] == 0
    opt.close()
    assert muon.create_processgroup_config()._options() == {"prefetch_count": 1,
                                                             "async_parallelism": True}
    assert muon.create_auto_config(prefetch_count=0)._options()["prefetch_count"] == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_prefetch_count_must_be_a_non_negative_int(bad):
    with pytest.raises(ValueError, match="prefetch_count"):
        muon.DistributedConfig(_noop, _noop, _noop, prefetch_count=bad)
    with pytest.raises(ValueError, match="prefetch_count"):
        muon.create_processgroup_config(prefetch_count=bad)


def test_distributed_config_needs_callables():
    with pytest.raises(TypeError, match="gather_fn must be callable"):
        muon.DistributedConfig(_noop, None, _noop)
    with pytest.raises(TypeError, match="assign_fn must be callable"):
        muon.DistributedConfig(3, _noop, _noop)


def test_processgroup_config_argument_checks():
    with pytest.raises(ValueError, match="fsdp_mode must be 'chunk' or 'flat'"):
        muon.create_processgroup_config(fsdp_mode="rows")
    with pytest.raises(ValueError, match="replicated_mode"):
        muon.create_processgroup_config(replicated_mode="zero3")
    with pytest.raises(ValueError, match="tp_dims given without tp_pg"):
        muon.create_processgroup_config(tp_dims={"w": 0})
    with pytest.raises(TypeError, match="names must be a dict"):
        muon.create_processgroup_config(names=["a"])
    with pytest.raises(TypeError, match="tp_dim_per_param"):
        muon.create_auto_config(tp_dim_per_param="rows")
    with pytest.raises(ValueError, match="tp_dim_per_param given without tp_process_group"):
        muon.create_auto_config(tp_dim_per_param=0)
    with pytest.raises(TypeError, match="expert_assignments"):
        muon.create_auto_config(expert_assignments=[1, 2])


@pytest.mark.skipif(dist.is_initialized(), reason="a process group is initialized here")
def test_attaching_needs_an_initialized_process_group():
    w = torch.nn.Parameter(torch.randn(4, 3))
    w.grad = torch.zeros_like(w)
    for cfg in (muon.create_processgroup_config(),
                muon.DistributedConfig(_noop, _noop, _noop)):
        opt = muon.Muon([w], distributed_config=cfg)
        with pytest.raises(RuntimeError, match="init_process_group"):
            opt.step()


def test_lookup_tables_accept_params_names_and_callables():
    w = torch.nn.Parameter(torch.randn(4, 3))
    assert _config._lookup_any({w: 1}, "a", "group0.param0", w, int) == 1
    assert _config._lookup_any({"group0.param0": 0}, "a", "group0.param0", w, int) == 0
    assert _config._lookup_any({"a": 1}, "a", "group0.param0", w, int) == 1
    assert _config._lookup_any(lambda n, p: 1 if p is w else None, "a", "x", w, int) == 1
    assert _config._lookup_any({"b": 1}, "a", "group0.param0", w, int) is None
    assert _config._chunk_sizes(10, 4) == [3, 3, 3, 1]
    assert _config._chunk_sizes(5, 4) == [2, 2, 1, 0]
    assert _config._chunk_sizes(3, 4) == [1, 1, 1, 0]


@pytest.mark.skipif(HAS_MESH, reason="this torch has DeviceMesh")
def test_devicemesh_config_says_it_needs_torch_2():
    with pytest.raises(RuntimeError, match=r"DeviceMesh \(torch >= 2.x\).*this torch is"):
        muon.create_devicemesh_config(object(), ("dp", "tp"))


@pytest.mark.skipif(HAS_DTENSOR, reason="this torch has DTensor")
def test_dtensor_config_says_it_needs_torch_2():
    with pytest.raises(RuntimeError, match=r"DTensor \(torch >= 2.x\).*this torch is"):
        muon.create_dtensor_config()


@pytest.mark.skipif(not HAS_MESH, reason=NEEDS_2X)
def test_devicemesh_config_maps_mesh_dims_to_groups():
    class FakeMesh:
        ndim = 2
        mesh_dim_names = ("dp", "tp")

        def get_group(self, dim):
            return "group%d" % dim

    cfg = muon.create_devicemesh_config(FakeMesh(), tp_dims={"w": 0})
    assert cfg.groups["dp"] == "group0" and cfg.groups["tp"] == "group1"
    with pytest.raises(ValueError, match="named 'rows'"):
        muon.create_devicemesh_config(FakeMesh(), ("rows", "tp"))


@pytest.mark.skipif(not HAS_DTENSOR, reason=NEEDS_2X)
def test_dtensor_config_builds_on_torch_2():
    cfg = muon.create_dtensor_config(prefetch_count=2)
    assert cfg._options()["prefetch_count"] == 2


def test_auto_config_takes_both_names_of_the_tp_dim():
    group = object()  # stored, not used before attaching
    by_int = muon.create_auto_config(tp_process_group=group, tp_shard_dim=1)
    assert by_int._index_tables["tp_dims"] == 1
    assert muon.create_auto_config(tp_process_group=group,
                                   tp_dim_per_param={0: 1})._index_tables["tp_dims"] == {0: 1}
    # Nothing given: every matrix on dim 0, as the design's default.
    assert muon.create_auto_config(tp_process_group=group)._index_tables["tp_dims"] == {}
    assert muon.create_auto_config(tp_process_group=group)._tp_default == 0
    with pytest.raises(ValueError, match="not both"):
        muon.create_auto_config(tp_process_group=group, tp_shard_dim=1, tp_dim_per_param=0)
