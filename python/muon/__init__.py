"""libmuon from Python: the Muon optimizer through the library's C ABI (ctypes).

torch layer: muon.Muon, a torch.optim.Optimizer with torch.optim.Muon's
signature (plus distributed_config):

    opt = muon.Muon(model_matrices, lr=0.02)
    loss.backward(); opt.step(); opt.zero_grad()

Low level (mirrors include/libmuon/muon.h): muon.Optimizer over numpy arrays or torch
tensors, the placements Shard / FlatRange / Replicate, Communicator (a
communicator written in Python) and InProcessWorld (ranks as threads).

    with muon.Optimizer(lr=0.02, weight_decay=0.01) as opt:
        for p in matrices:               # 2-D (or N-D with a matrix_view) tensors
            p.grad = torch.zeros_like(p)  # gradients are borrowed: keep them in place
            opt.register(p, p.grad, name=...)
        ...  # backward() fills p.grad in place, then
        opt.step()

Distributed configs (distributed_config=) derive from muon.DistributedConfigBase,
which documents the protocol muon.Muon calls; the framework adapters
(muon.megatron, muon.deepspeed) build on muon.ProcessGroupConfig.

The library is found through MUON_LIBRARY, next to this package, in the
repository's bazel-bin, or through the system loader (see _lib.py).
"""

from __future__ import annotations

from typing import Any

from ._lib import path as library_path
from ._errors import MuonError
from ._optimizer import Optimizer, version
from ._allocator import TorchAllocator
from ._comm import Communicator, FlatRange, InProcessComm, InProcessWorld, Replicate, Shard
from ._dist import TorchDistComm
from ._base_config import DistributedConfigBase
from ._config import DistributedConfig
from ._pg_config import (ProcessGroupConfig, create_auto_config, create_devicemesh_config,
                         create_processgroup_config)
from ._dtensor_config import create_dtensor_config

__version__: str = "%d.%d.%d" % version()

__all__ = [
    "Communicator",
    "FlatRange",
    "InProcessComm",
    "InProcessWorld",
    "MuonError",
    "Optimizer",
    "Replicate",
    "Shard",
    "TorchAllocator",
    "__version__",
    "library_path",
    "version",
]
__all__ += ["TorchDistComm", "DistributedConfig", "DistributedConfigBase", "ProcessGroupConfig",
            "create_auto_config", "create_devicemesh_config", "create_dtensor_config",
            "create_processgroup_config"]

__all__ += ["Muon", "zeropower_via_newtonschulz"]


def __getattr__(name: str) -> Any:
    # The torch layer imports torch: loaded on first use, so that the low level
    # stays usable (and quick to import) with numpy alone.
    value: Any
    if name == "Muon":
        from ._torch import Muon as value
    elif name in ("megatron", "deepspeed", "torchtitan", "transformers"):
        # (import_module: `from . import x` would ask this __getattr__ again)
        import importlib
        value = importlib.import_module("." + name, __name__)
    elif name in ("zeropower_via_newtonschulz", "_zeropower_via_newtonschulz"):
        from . import _newton_schulz
        value = getattr(_newton_schulz, name)
    else:
        raise AttributeError("module 'muon' has no attribute %r" % name)
    globals()[name] = value
    return value
