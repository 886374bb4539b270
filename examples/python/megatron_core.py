"""Megatron-core's own tensor-parallel layers trained with libmuon's Muon, on 4
processes (tensor parallel 2 x data parallel 2, gloo on CPU): the groups come
from megatron.core.parallel_state, each weight's split from the attributes
ColumnParallelLinear and RowParallelLinear put on it. Biases and norms go to
AdamW inside the same optimizer.

    .venv/bin/python examples/python/megatron_core.py   (PYTHONPATH=python)

On GPUs: init_process_group("nccl"), the model on CUDA, the same config.
"""

import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import muon
import muon.megatron

TP, DP = 2, 2


def train(rank, world, port):
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=world)
    from megatron.core import ModelParallelConfig, parallel_state
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP)
    config = ModelParallelConfig(tensor_model_parallel_size=TP, use_cpu_initialization=True)
    init = torch.nn.init.xavier_normal_

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
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

    torch.manual_seed(0)  # the same whole weights on every rank; each keeps its piece
    model = MLP()
    x = torch.randn(256, 16)
    y = torch.sin(x[:, :4] * 2)
    dp_rank = parallel_state.get_data_parallel_rank()
    x, y = x.chunk(DP)[dp_rank], y.chunk(DP)[dp_rank]          # this DP rank's batch

    opt = muon.Muon(model.parameters(), lr=0.05, weight_decay=0.0, adamw_lr=3e-3,
                    distributed_config=muon.megatron.create_megatron_config(model=model))
    dp = parallel_state.get_data_parallel_group()
    losses = []
    for step in range(40):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():                            # what Megatron's DDP does
            dist.all_reduce(p.grad, group=dp)
            p.grad /= DP
        opt.step()
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
    print("megatron_core: OK")
