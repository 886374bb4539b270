"""Megatron-core's distributed-optimizer layout trained with libmuon's Muon, on 4
processes (tensor parallel 2 x data parallel 2, gloo on CPU): Megatron's own
DistributedDataParallel with use_distributed_optimizer=True reduce-scatters
the gradients so that each data-parallel rank owns a flat range of every
weight; muon.Muon steps exactly those ranges (each matrix orthogonalized
once in the job) and all-gathers the weights after its step, as Megatron's
DistributedOptimizer does for Adam.

    .venv/bin/python examples/python/megatron_distopt.py   (PYTHONPATH=python)

On GPUs: init_process_group("nccl"), the model on CUDA, the same config.
"""

import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import muon

TP, DP = 2, 2


def train(rank, world, port):
    warnings.filterwarnings("ignore")
    if not torch.cuda.is_available():
        # Megatron's DDP allocates its buffers on torch.cuda.current_device() and
        # takes no device argument: on a CPU-only machine, point it at the CPU.
        torch.cuda.current_device = lambda: torch.device("cpu")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=world)
    from megatron.core import parallel_state
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig)
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP)
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=TP,
                               tensor_model_parallel_size=TP, use_cpu_initialization=True)
    init = torch.nn.init.xavier_normal_

    class MLP(MegatronModule):
        def __init__(self):
            super().__init__(config=config)
            self.up = ColumnParallelLinear(16, 64, config=config, init_method=init,
                                           gather_output=False)
            self.down = RowParallelLinear(64, 16, config=config, init_method=init,
                                          bias=True, input_is_parallel=True,
                                          skip_bias_add=False)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            h, _ = self.up(x)
            y, _ = self.down(torch.nn.functional.gelu(h))
            return self.head(y)

    torch.manual_seed(0)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(
        use_distributed_optimizer=True, overlap_grad_reduce=True, bucket_size=1000), MLP())
    x = torch.randn(256, 16)
    y = torch.sin(x[:, :4] * 2)
    dp_rank = parallel_state.get_data_parallel_rank()
    x, y = x.chunk(DP)[dp_rank], y.chunk(DP)[dp_rank]          # this DP rank's batch

    opt = muon.Muon(ddp.parameters(), lr=0.05, weight_decay=0.0, adamw_lr=3e-3,
                    distributed_config=muon.megatron.create_megatron_config(ddp=ddp))
    losses = []
    for step in range(40):
        ddp.zero_grad_buffer()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        ddp.finish_grad_sync()   # the reduce-scatter: each rank's ranges averaged
        opt.step()               # Muon on the ranges, then the weights all-gathered
        losses.append(loss.item())
    if rank == 0:
        print("loss %.4f -> %.4f" % (losses[0], losses[-1]))
    assert losses[-1] < 0.5 * losses[0], "rank %d: the loss did not go down" % rank
    parallel_state.destroy_model_parallel()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(TP * DP, port), nprocs=TP * DP)
    print("megatron_distopt: OK")
