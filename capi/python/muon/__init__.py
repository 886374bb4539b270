"""libmuon from Python: the Muon optimizer through the library's C ABI (ctypes).

    import muon
    with muon.Optimizer(lr=0.02, weight_decay=0.01) as opt:
        for p in matrices:               # 2-D (or N-D with a matrix_view) tensors
            p.grad = torch.zeros_like(p)  # gradients are borrowed: keep them in place
            opt.register(p, p.grad, name=...)
        ...  # backward() fills p.grad in place, then
        opt.step()

The library is found through MUON_LIBRARY, next to this package, in the
repository's bazel-bin, or through the system loader (see _lib.py).
"""

from ._lib import path as library_path
from ._optimizer import Optimizer, MuonError, version

__version__ = "%d.%d.%d" % version()

__all__ = ["Optimizer", "MuonError", "library_path", "version", "__version__"]
