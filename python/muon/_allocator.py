"""torch's allocators serving the library's own memory (muon_options_t.allocate
and .release): on a GPU torch's caching allocator, so that the optimizer's
buffers (momentum, updates, exchange buffers, the Newton-Schulz workspace)
count in torch.cuda.memory_allocated(), obey its limits and reuse its cache
instead of cudaMalloc beside it; host memory from torch's CPU allocator.
muon.Muon takes it for CUDA parameters; muon.Optimizer(allocator=...)
takes it, or any object with the same two methods, by hand."""

from __future__ import annotations

from typing import Any

K_DL_CPU = 1   # DLPack device types, as include/dlpack/dlpack.h numbers them
K_DL_CUDA = 2
K_DL_CUDA_HOST = 3
ALIGNMENT = 64  # what the library asks of every block (muon_options_t.allocate)


class TorchAllocator:
    """allocate(nbytes, device_type, device_id, stream) -> address and
    release(address, nbytes, device_type, device_id, stream), as the library
    calls them. CUDA memory comes from torch.cuda.caching_allocator_alloc on
    the stream the library names (stream-ordered reuse, as torch's own
    tensors); host memory from a torch uint8 tensor kept until release,
    aligned to 64 bytes. `live` maps each address handed out to its block
    (a CUDA block: the stream it was allocated on).

    torch may hand a freed CUDA block out again at once to work on the stream
    it was allocated on. The library's work on it is ordered on the stream
    it releases it with; when that is another stream (a block allocated at
    registration, before the optimizer had its stream), release waits for
    the device first, so that no later tensor of torch's shares the block
    with work of the optimizer still running."""

    def __init__(self) -> None:
        self.live: dict[int, Any] = {}
        self.served = 0

    def allocate(self, nbytes: int, device_type: int, device_id: int, stream: int) -> int:
        import torch

        if device_type == K_DL_CUDA:
            # No stream yet (registration): torch's current one of the device.
            on = int(stream) if stream else torch.cuda.current_stream(device_id).cuda_stream
            address = int(torch.cuda.caching_allocator_alloc(
                max(int(nbytes), 1), device=device_id, stream=on))
            if address % ALIGNMENT:  # torch's blocks are 512-byte aligned
                torch.cuda.caching_allocator_delete(address)
                raise MemoryError("torch's caching allocator returned a block at %#x, not "
                                  "%d-byte aligned" % (address, ALIGNMENT))
            self.live[address] = ("cuda", on)
        elif device_type in (K_DL_CPU, K_DL_CUDA_HOST):
            block = torch.empty(int(nbytes) + ALIGNMENT, dtype=torch.uint8,
                                pin_memory=device_type == K_DL_CUDA_HOST)
            address = (block.data_ptr() + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
            self.live[address] = block
        else:
            raise ValueError("muon.TorchAllocator: no memory of DLPack device type %d"
                             % device_type)
        self.served += 1
        return address

    def release(self, address: int, nbytes: int, device_type: int, device_id: int,
                stream: int) -> None:
        block = self.live.pop(address)
        if isinstance(block, tuple):
            import torch

            if stream and block[1] != int(stream):
                torch.cuda.synchronize(device_id)
            torch.cuda.caching_allocator_delete(address)
