"""DeepSpeed's ZeRO (stage 2 by default; 0, 1 and 3 with --stage N) trained
with libmuon's Muon, on 4 processes (gloo on CPU): DeepSpeed's engine averages
and partitions the gradients and hands muon.Muon each param group's flat fp32
partition (at stage 0, the whole params);
muon.deepspeed maps the partitions back to the weights, the library
orthogonalizes each matrix once in the job, and AdamW steps the biases and
norms inside the same optimizer.

    .venv/bin/python examples/python/deepspeed_zero.py [--stage 3]   (PYTHONPATH=python)

On GPUs: the same script with deepspeed's launcher (`deepspeed
examples/python/deepspeed_zero.py`), NCCL picked by DeepSpeed.
"""

import os
import socket
import sys

import torch
import torch.multiprocessing as mp

import muon

WORLD = 4
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2},
    "steps_per_print": 10 ** 6,
}


def train(rank, world, port, stage):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    # DeepSpeed builds a shared-memory collective for inference with g++ when its
    # communication backend first starts on a CPU (1-2 minutes); training does not
    # use it, so this CPU demo skips the build. Not needed on GPUs.
    import deepspeed.comm.torch  # noqa: F401
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 4))
    opt = muon.Muon(model.parameters(), lr=0.05, weight_decay=0.0, adamw_lr=3e-3,
                    distributed_config=muon.deepspeed.create_deepspeed_config())
    config = dict(DS_CONFIG, zero_optimization={"stage": stage})
    engine, _, _, _ = muon.deepspeed.initialize(model=model, optimizer=opt, config=config)

    g = torch.Generator().manual_seed(rank)   # this rank's data
    x = torch.randn(16, 16, generator=g)
    y = torch.sin(x[:, :4] * 2)
    losses = []
    for step in range(40):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if rank == 0:
        print("ZeRO-%d: loss %.4f -> %.4f (Newton-Schulz on rank 0: %d matrices)"
              % (stage, losses[0], losses[-1], opt.stats()["matrices_orthogonalized"]))
    assert losses[-1] < 0.5 * losses[0], "rank %d: the loss did not go down" % rank
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    stage = int(sys.argv[sys.argv.index("--stage") + 1]) if "--stage" in sys.argv else 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(WORLD, port, stage), nprocs=WORLD)
    print("deepspeed_zero: OK")
