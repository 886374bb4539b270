"""The design's three functions over process-group layouts (the custom path of
create_processgroup_config and its kin): processgroup_assign_fn,
processgroup_gather_fn and processgroup_redistribute_fn, which read the layout
ProcessGroupConfig.attach writes into the config's state; and the sizes and
checksums the layouts are made of."""

import zlib

from ._config import torch_and_dist


def chunk_sizes(total, n):
    """torch.chunk's sizes of `total` over n (ceil each, tail short, possibly empty)."""
    step = -(-total // n) if total else 0
    return [max(0, min(step, total - r * step)) for r in range(n)]


def crc(t):
    """A checksum of a tensor's bytes (replica checks)."""
    torch, _ = torch_and_dist()
    data = t.detach().to("cpu").contiguous().reshape(-1)
    if data.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        data = data.to(torch.float32)
    return zlib.crc32(data.view(torch.uint8).numpy().tobytes())


# They read what ProcessGroupConfig.attach writes into the config's state:
#   state["groups"][role]       the process group of a role ("tp", "fsdp", ...)
#   state["world_pg"]           the group of every rank stepping Muon (None: the world)
#   state["layouts"][param_idx] {"name", "global_shape", "local_shape", "steps"}:
#       steps go from the whole tensor down to this rank's piece (outermost
#       first), replicas left out; each is {"group": role, "kind": "shard",
#       "dim": d, "sizes": [size on each group rank]} or {"group": role,
#       "kind": "flat", "shape": the piece it flattens, "ranges": [(start,
#       length) on each group rank]}.
# A user's own gather_fn or redistribute_fn may read them too.


def processgroup_assign_fn(params, state):
    """The design's assignment: param_idx round robin over the world."""
    _, dist = torch_and_dist()
    n = dist.get_world_size(state.get("world_pg"))
    out = {r: [] for r in range(n)}
    for i in range(len(params)):
        out[i % n].append(i)
    return out


def processgroup_gather_fn(shard, rank, state):
    """The design's gather: the innermost split undone first (TP before FSDP in
    the design's order), an all_gather over each group; the whole tensor on
    every rank of the world (the assigned one included)."""
    torch, dist = torch_and_dist()
    layout = state["layouts"][state["current_param_idx"]]
    t = shard.reshape(layout["local_shape"])
    for step in reversed(layout["steps"]):
        group = state["groups"][step["group"]]
        if step["kind"] == "shard":
            t = _all_gather_along(torch, dist, t, step["dim"], step["sizes"], group)
        else:
            lengths = [length for _, length in step["ranges"]]
            t = _all_gather_along(torch, dist, t.reshape(-1), 0, lengths, group)
            t = t.reshape(step["shape"])
    return t


def processgroup_redistribute_fn(update, rank, state):
    """The design's redistribute: the assigned rank's update to every rank of
    the world, then the outermost split first (FSDP before TP in the design's
    order); this rank's piece."""
    torch, dist = torch_and_dist()
    layout = state["layouts"][state["current_param_idx"]]
    world = state.get("world_pg")
    full = update.contiguous() if update is not None else torch.empty(layout["global_shape"])
    dist.broadcast(full, src=rank if world is None else dist.get_global_rank(world, rank),
                   group=world)
    t = full
    for step in layout["steps"]:
        me = dist.get_rank(state["groups"][step["group"]])
        if step["kind"] == "shard":
            t = t.narrow(step["dim"], sum(step["sizes"][:me]), step["sizes"][me])
        else:
            start, length = step["ranges"][me]
            t = t.reshape(-1)[start:start + length]
    return t.reshape(layout["local_shape"])


def _all_gather_along(torch, dist, t, dim, sizes, group):
    """Every group rank's piece (sizes[r] long in `dim`), concatenated in rank order."""
    widest = max(sizes)
    if widest == 0:
        return t
    t = t.contiguous()
    if t.shape[dim] < widest:  # all_gather moves equal sizes
        pad = list(t.shape)
        pad[dim] = widest - t.shape[dim]
        t = torch.cat([t, t.new_zeros(pad)], dim)
    parts = [torch.empty_like(t) for _ in sizes]
    dist.all_gather(parts, t, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim)
