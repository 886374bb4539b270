"""The distributed configs in one process: argument checks, what they hand to
the low-level optimizer, the helpers' configs as DistributedConfigs, and the
message of DeviceMesh / DTensor on a torch without them."""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from muon import _config, _dtensor_config, _pg_config  # noqa: E402



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
    assert _config.lookup_any({w: 1}, "a", "group0.param0", w, int) == 1
    assert _config.lookup_any({"group0.param0": 0}, "a", "group0.param0", w, int) == 0
    assert _config.lookup_any({"a": 1}, "a", "group0.param0", w, int) == 1
    assert _config.lookup_any(lambda n, p: 1 if p is w else None, "a", "x", w, int) == 1
    assert _config.lookup_any({"b": 1}, "a", "group0.param0", w, int) is None
    assert _pg_config._chunk_sizes(10, 4) == [3, 3, 3, 1]
    assert _pg_config._chunk_sizes(5, 4) == [2, 2, 1, 0]
    assert _pg_config._chunk_sizes(3, 4) == [1, 1, 1, 0]


def test_a_torch_without_devicemesh_or_dtensor_is_told_so(monkeypatch):
    # torch 2.x has both (the supported range); what an older one would see:
    monkeypatch.setattr(_pg_config, "_device_mesh_class", lambda: None)
    monkeypatch.setattr(_dtensor_config, "_dtensor_class", lambda: None)
    with pytest.raises(RuntimeError, match=r"DeviceMesh \(torch >= 2.x\).*this torch is"):
        muon.create_devicemesh_config(object(), ("dp", "tp"))
    with pytest.raises(RuntimeError, match=r"DTensor \(torch >= 2.x\).*this torch is"):
        muon.create_dtensor_config()


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


def test_dtensor_config_builds_on_torch_2():
    cfg = muon.create_dtensor_config(prefetch_count=2)
    assert cfg._options()["prefetch_count"] == 2


def test_auto_config_takes_both_names_of_the_tp_dim():
    group = object()  # stored, not used before attaching
    by_int = muon.create_auto_config(tp_process_group=group, tp_shard_dim=1)
    assert by_int.index_tables.tp_dims == 1
    assert muon.create_auto_config(tp_process_group=group,
                                   tp_dim_per_param={0: 1}).index_tables.tp_dims == {0: 1}
    # Nothing given: every matrix on dim 0, as the design's default.
    # (dist_errors_test: a replicated matrix read so is refused, naming the fix.)
    assert muon.create_auto_config(tp_process_group=group).index_tables.tp_dims == {}
    experts = muon.create_auto_config(expert_assignments={3: 1})
    assert experts.index_tables.experts == {3: 1}
    with pytest.raises(ValueError, match="not both"):
        muon.create_auto_config(tp_process_group=group, tp_shard_dim=1, tp_dim_per_param=0)


def test_the_helpers_return_distributed_configs_with_their_three_functions():
    group = object()  # stored, not used before attaching
    for cfg in (muon.create_processgroup_config(fsdp_pg=group),
                muon.create_auto_config(fsdp_process_group=group, tp_process_group=group),
                muon.create_dtensor_config()):
        assert isinstance(cfg, muon.DistributedConfig)
        assert cfg._native()
        kind = "dtensor" if cfg.__class__.__name__ == "_DTensorConfig" else "processgroup"
        for role in ("assign_fn", "gather_fn", "redistribute_fn"):
            fn = getattr(cfg, role)
            assert fn.__name__ == "%s_%s" % (kind, role) and fn.__doc__, (kind, role)
        # "Create the config, then override one function": the custom path.
        cfg.assign_fn = lambda params, state: {0: list(range(len(params)))}
        assert not cfg._native()


def test_gather_order_defaults_to_the_designs_and_can_be_stated():
    group = object()
    assert muon.create_processgroup_config(fsdp_pg=group, tp_pg=group).gather_order == \
        ("tp", "fsdp")
    assert muon.create_auto_config(fsdp_process_group=group, tp_process_group=group,
                                   gather_order=["fsdp", "tp"]).gather_order == ("fsdp", "tp")
    # Flat FSDP flattens each TP piece: one order only.
    assert muon.create_processgroup_config(fsdp_pg=group, fsdp_mode="flat").gather_order == \
        ("fsdp", "tp")
    with pytest.raises(ValueError, match="fsdp_mode='flat' flattens each TP piece"):
        muon.create_processgroup_config(fsdp_pg=group, fsdp_mode="flat",
                                        gather_order=("tp", "fsdp"))
    for bad in ("tp", ("tp", "dp"), ("tp",)):
        with pytest.raises(ValueError, match="gather_order must be"):
            muon.create_processgroup_config(fsdp_pg=group, gather_order=bad)


def test_framework_adapters_load_as_attributes_of_a_plain_import():
    # `import muon` then muon.megatron / muon.deepspeed, as their docs write it
    # (a fresh interpreter: no test has imported them yet).
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import muon; print(muon.megatron.__name__, "
                          "muon.deepspeed.__name__)"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["muon.megatron", "muon.deepspeed"]


def test_the_configs_protocol_has_public_names_and_keeps_the_0_6_ones():
    from muon._base_config import ConfigHooks

    for name in ("DistributedConfigBase", "ProcessGroupConfig"):
        assert hasattr(muon, name) and name in muon.__all__, name
    for cfg in (muon.DistributedConfig(_noop, _noop, _noop), muon.create_processgroup_config(),
                muon.create_dtensor_config(), muon.deepspeed.create_deepspeed_config()):
        assert isinstance(cfg, muon.DistributedConfigBase), type(cfg)
        assert cfg.options() == cfg._options()  # the 0.6 name, an alias for 0.7
    assert isinstance(muon.deepspeed.create_deepspeed_config(), muon.ProcessGroupConfig)

    class Written06(muon.DistributedConfig):  # overrides the 0.6 names
        _flat_grad_attr = "main_grad"

        def _options(self):
            return {"prefetch_count": 3}

        def _global_ndim(self, name, param):
            return 5

    hooks = ConfigHooks(Written06(_noop, _noop, _noop))
    w = torch.zeros(2)
    assert hooks.options() == {"prefetch_count": 3}
    assert hooks.global_ndim("w", w) == 5 and hooks.flat_grad_attr == "main_grad"

    class Duck:  # no base class, the public names only
        def options(self):
            return {}

        def attach(self, optimizer, named_params):
            pass

    hooks = ConfigHooks(Duck())
    assert ConfigHooks.accepts(Duck()) and not ConfigHooks.accepts(object())
    assert hooks.global_ndim("w", w) == 1 and hooks.flat_segments("w", w) is None
    assert hooks.flat_grad_attr == "grad" and hooks.skip_empty_groups is False

    class Mine(muon.DistributedConfigBase):
        def attach(self, optimizer, named_params):
            self.attached = list(named_params)

    cfg = Mine(prefetch_count=0)
    assert cfg.options() == {"prefetch_count": 0, "async_parallelism": True}
    cfg._attach(None, [("a", w)])
    assert cfg.attached == [("a", w)]
    cfg._skip_empty_groups = True  # a 0.6 adapter's assignment reaches the public name
    assert cfg.skip_empty_groups and ConfigHooks(cfg).skip_empty_groups
    with pytest.raises(NotImplementedError, match="attach"):
        muon.DistributedConfigBase().attach(None, [])
