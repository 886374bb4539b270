"""muon.Optimizer(allocator=...): the library's own memory (muon_options_t.allocate,
.release) from a Python object, muon.TorchAllocator on the host here (its
CUDA branch, torch's caching allocator, is tests/gpu/gpu_test.py's): the
same steps bit for bit as the library's own memory, every block 64-byte
aligned and given back at close; a failing allocator is named."""

import numpy
import pytest
import torch

import muon


def _run(steps=3, **kwargs):
    rng = numpy.random.default_rng(5)
    params = [torch.tensor(rng.standard_normal(shape), dtype=torch.float32)
              for shape in [(8, 12), (16, 4), (6, 6)]]
    grads = [torch.zeros_like(p) for p in params]
    with muon.Optimizer(lr=0.02, ns_dtype="fp32", **kwargs) as opt:
        for k, (p, g) in enumerate(zip(params, grads)):
            opt.register(p, g, name="p%d" % k)
        for _ in range(steps):
            for g in grads:
                g.copy_(torch.tensor(rng.standard_normal(tuple(g.shape)), dtype=torch.float32))
            opt.step()
    return params


class Recording(muon.TorchAllocator):
    def __init__(self):
        super().__init__()
        self.calls = []

    def allocate(self, nbytes, device_type, device_id, stream):
        address = super().allocate(nbytes, device_type, device_id, stream)
        self.calls.append(("allocate", address, nbytes, device_type))
        return address

    def release(self, address, nbytes, device_type, device_id, stream):
        self.calls.append(("release", address, nbytes, device_type))
        super().release(address, nbytes, device_type, device_id, stream)


def test_torch_allocator_serves_every_block_and_gets_all_back():
    want = _run()
    allocator = Recording()
    got = _run(allocator=allocator)
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    given = {(a, n) for kind, a, n, _ in allocator.calls if kind == "allocate"}
    taken = {(a, n) for kind, a, n, _ in allocator.calls if kind == "release"}
    assert len(given) >= 3, allocator.calls  # at least each parameter's momentum
    assert given == taken and not allocator.live, "not every block came back"
    assert all(a % 64 == 0 for a, _ in given)
    assert {t for *_, t in allocator.calls} == {1}, "host memory only (kDLCPU) here"


class Short:
    def __init__(self, error=None):
        self.error = error

    def allocate(self, nbytes, device_type, device_id, stream):
        if self.error is not None:
            raise self.error
        return 0

    def release(self, address, nbytes, device_type, device_id, stream):
        raise AssertionError("nothing was allocated")


def test_a_short_or_failing_allocator_is_named():
    with pytest.raises(muon.MuonError) as short:
        _run(allocator=Short())
    assert short.value.status == "RESOURCE_EXHAUSTED", short.value
    assert "momentum" in str(short.value) or "buffer" in str(short.value), short.value
    with pytest.raises(muon.MuonError) as failing:
        _run(allocator=Short(MemoryError("the pool is empty")))
    assert "MemoryError: the pool is empty (in the allocator's allocate)" in str(failing.value)
    with pytest.raises(TypeError, match="allocator must have allocate"):
        muon.Optimizer(allocator=object())


class FailsAtRelease(muon.TorchAllocator):
    def release(self, address, nbytes, device_type, device_id, stream):
        super().release(address, nbytes, device_type, device_id, stream)
        raise OSError("the pool went away")


def test_what_release_raises_at_close_is_reported():
    # Every buffer goes back all the same; close() then names what was raised.
    allocator = FailsAtRelease()
    opt = muon.Optimizer(lr=0.02, allocator=allocator)
    w = torch.randn(8, 12)
    g = torch.randn(8, 12)
    opt.register(w, g, name="w")
    opt.step()
    with pytest.raises(muon.MuonError) as closed:
        opt.close()
    assert "OSError: the pool went away (in the allocator's release, " in str(closed.value), \
        closed.value
    assert isinstance(closed.value.__cause__, OSError)
    assert opt.closed
    opt.close()  # idempotent: nothing more to report
