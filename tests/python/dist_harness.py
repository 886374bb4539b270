"""Runs a function on N processes joined by torch.distributed (gloo over
loopback, a free TCP port per launch), and the helpers the distributed tests
share: process groups of a mesh, deterministic data, the host's fixed-order
gradient average, bit-for-bit comparison.

A worker is a module-level function `fn(rank, world_size, *args)`; its return
value (anything torch.save takes) comes back to the parent, one per rank. An
exception in a worker fails the launch with every rank's traceback, and so
does a process that crashes after its result; a rank still running `timeout`
seconds after the launch (or 15 seconds after another rank failed, so it is
probably waiting on it) is killed.

The ranks fork from a server process (multiprocessing's forkserver) that has
imported torch and the worker's module once per test process, not each from a
fresh interpreter that imports torch (and DeepSpeed, Megatron, torchtitan)
again: 3-8 s of CPU per rank, most of a small launch's cost. The server is
started from the first launch's parent, with nothing run in it (no thread
pool, no process group), and each rank takes the parent's environment as it
is at the launch. MUON_TEST_SPAWN=1 starts each rank from a fresh interpreter
instead.

A rank tears down what fn left (gc.collect(): every muon optimizer destroyed,
with the interpreter alive), saves its result, destroys the process groups and
leaves with os._exit(0), skipping interpreter finalization: there, a gloo
worker thread that drops the last reference to a tensor needs the GIL and
aborts the process ("terminate called without an active exception"; seen in
2 of 12 runs of torch_checkpoint_test under load), torch's teardown, not the
library's.
"""

import datetime
import gc
import os
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, out_dir, args, env):
    if os.environ != env:  # a forked rank has the server's environment
        os.environ.clear()
        os.environ.update(env)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # the same BLAS path as the reference, and 2 cores for 4 ranks
    result = {"ok": False}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        result = {"ok": True, "value": fn(rank, world_size, *args)}
        gc.collect()
        dist.barrier()
    except BaseException:  # noqa: B902 - reported to the parent
        result = {"ok": False, "error": traceback.format_exc()}
    finally:
        torch.save(result, os.path.join(out_dir, "rank%d.pt" % rank))
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # see the module's docstring


_server = {"preloaded": None}


def _context(fn):
    """Where the ranks of a launch of `fn` start (the module's docstring)."""
    if os.environ.get("MUON_TEST_SPAWN") == "1":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if _server["preloaded"] is None:  # the server starts at its first use
        modules = ["torch", "torch.distributed"]
        if fn.__module__ != "__main__":
            modules.append(fn.__module__)
        ctx.set_forkserver_preload(modules)
        _server["preloaded"] = modules
    return ctx


def launch(fn, world_size, *args, timeout=240):
    """Runs fn(rank, world_size, *args) on world_size processes; returns the
    per-rank results."""
    ctx = _context(fn)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="muon_dist_") as out_dir:
        port = free_port()
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, out_dir, args, env),
                             daemon=True) for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        failed_at = None
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.exitcode not in (None, 0) or
                                         _failed(out_dir, r) for r, p in enumerate(procs)):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + 15):
                break
            time.sleep(0.05)
        stuck = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        results, problems = [], []
        for r in range(world_size):
            path = os.path.join(out_dir, "rank%d.pt" % r)
            res = torch.load(path) if os.path.exists(path) else None
            results.append(res)
            if r in stuck:
                problems.append("rank %d: still running, killed" % r)
            elif res is None:
                problems.append("rank %d: exited with code %s and no result"
                                % (r, procs[r].exitcode))
            elif not res["ok"]:
                problems.append("rank %d:\n%s" % (r, res["error"]))
            elif procs[r].exitcode != 0:
                problems.append("rank %d: finished, then exited with code %s (a crash after "
                                "its result)" % (r, procs[r].exitcode))
        if problems:
            raise AssertionError("distributed run of %s failed:\n%s"
                                 % (fn.__name__, "\n".join(problems)))
        return [res["value"] for res in results]


def _failed(out_dir, rank):
    path = os.path.join(out_dir, "rank%d.pt" % rank)
    if not os.path.exists(path):
        return False
    try:
        return not torch.load(path)["ok"]
    except Exception:
        return False  # still being written


# ---------------------------------------------------------------------------
# Groups of a 2-D mesh
# ---------------------------------------------------------------------------


def mesh_groups(dims):
    """Process groups of a row-major mesh of shape `dims` (len 2 or 3). Returns,
    for this rank, (coords, [group of mesh dim 0, group of mesh dim 1, ...]),
    the group of dim d being the ranks that differ from this one in coord d only.
    Every rank creates every group (torch.distributed.new_group is collective)."""
    world = 1
    for d in dims:
        world *= d
    rank = dist.get_rank()

    def coords_of(r):
        c = []
        for d in reversed(dims):
            c.append(r % d)
            r //= d
        return tuple(reversed(c))

    mine = coords_of(rank)
    groups = []
    for axis in range(len(dims)):
        found = None
        seen = set()
        for r in range(world):
            c = coords_of(r)
            key = c[:axis] + c[axis + 1:]
            if key in seen:
                continue
            seen.add(key)
            members = [q for q in range(world) if coords_of(q)[:axis] + coords_of(q)[axis + 1:]
                       == key]
            g = dist.new_group(members)
            if rank in members:
                found = g
        groups.append(found)
    return mine, groups


# ---------------------------------------------------------------------------
# Arithmetic both runs share
# ---------------------------------------------------------------------------


def ordered_mean(tensors):
    """((t0 + t1) + ...) / n in float32: the host's fixed-order average, the same
    on every replica and in the single-process reference."""
    acc = tensors[0].detach().clone()
    for t in tensors[1:]:
        acc += t
    return acc / len(tensors)


def allgather_tensor(t, group=None):
    """Every member's `t` (same shape), in group-rank order (exact copies)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def whole_over(t, dim, group):
    """A piece of a tensor split along `dim` over `group` (None: every member
    holds it whole) put together in group-rank order, detached."""
    if dim is None:
        return t.detach().clone()
    return torch.cat(allgather_tensor(t.detach().contiguous(), group), dim)


def batch(step, shard, rows, d_in, d_out):
    """The data of one step's batch shard (deterministic)."""
    g = torch.Generator().manual_seed(1000 * step + shard + 7)
    return torch.randn(rows, d_in, generator=g), torch.randn(rows, d_out, generator=g)


def bits_equal(a, b):
    a, b = a.detach().contiguous(), b.detach().contiguous()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.view(-1).view(torch.int32) if a.dtype == torch.float32 else a.view(-1),
        b.view(-1).view(torch.int32) if b.dtype == torch.float32 else b.view(-1))


def max_abs_diff(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0
