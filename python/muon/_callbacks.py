"""Python callables as the library's C callbacks (include/libmuon/muon.h): the
assignment callable (muon_assign_fn_t) and the custom path's assign_fn,
gather_fn and redistribute_fn (muon_custom_layout_t). An exception a callable
raises becomes a failed status, the exception kept in a sink for step() to
raise with."""

import ctypes
import operator

from . import _comm, _lib
from ._errors import callback_failed
from ._tensor import is_torch


def _prod(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def float_matrix(x):
    """What a gather_fn returned, as a float32 C-contiguous 2-D numpy array
    (no copy when it already is one)."""
    import numpy

    if is_torch(x):
        if x.device.type != "cpu":
            raise TypeError("gather_fn returned a tensor on %s; the library reads host memory"
                            % x.device)
        import torch
        x = x.detach().to(torch.float32).contiguous().numpy()  # the array keeps the tensor alive
    arr = numpy.ascontiguousarray(x, dtype=numpy.float32)
    if arr.ndim != 2:
        raise ValueError("gather_fn must return a (rows, cols) matrix, got shape %s"
                         % (tuple(arr.shape),))
    return arr


def assignment_callback(fn, sink):
    """The muon_assign_fn_t calling `fn` (muon.Optimizer's assignment callable)
    with one dict per matrix of the job; what it raises goes to `sink`."""

    def c_assign(state, count, matrices, owners):
        try:
            table = []
            for i in range(count):
                m = matrices[i]
                table.append({
                    "param_name": m.param_name.decode("utf-8", "replace"),
                    "index": m.index,
                    "rows": m.rows,
                    "cols": m.cols,
                    "ns_flops": m.ns_flops,
                    "holders": [m.holders[j] for j in range(m.num_holders)],
                })
            chosen = list(fn(table))
            if len(chosen) != count:
                raise ValueError("the assignment returned %d owners for %d matrices"
                                 % (len(chosen), count))
            ranks = [operator.index(r) for r in chosen]
            for i, r in enumerate(ranks):
                owners[i] = r
            return 0
        except BaseException as e:  # noqa: B902 - turned into a status
            return callback_failed(e, "the assignment callable", sink)

    return _lib.ASSIGN_FN(c_assign)


def custom_layout(name, shape, rows, cols, assign_fn, gather_fn, redistribute_fn, sink):
    """The muon_custom_layout_t of a custom-path parameter (see
    muon.Optimizer.register_custom) registered as `name`, this rank's piece of
    `shape`, whose callbacks call the three callables; returns (layout, the
    ctypes callbacks to keep alive while the library may call them)."""
    numel = _prod(shape)
    label = "param '%s'" % name
    held = [None]  # the owner's gathered matrix, until redistribute_fn returns

    def local_shape(n):
        return shape if n == numel else (int(n),)

    def c_assign(state, param_name, world_size):
        try:
            owner = operator.index(assign_fn(name, int(world_size)))
            return owner if -2 ** 31 <= owner < 2 ** 31 else -1
        except BaseException as e:  # noqa: B902 - reported as an invalid owner
            sink.append(("assign_fn of %s" % label, e))
            return -1

    def c_gather(state, local, n, owner, out, stream):
        try:
            full = gather_fn(_comm.view(local, local_shape(n), "<f4"),
                             int(owner))
            held[0] = None
            if full is not None:
                arr = float_matrix(full)
                held[0] = arr
                out[0].data = arr.ctypes.data
                out[0].rows, out[0].cols = arr.shape
            return 0
        except BaseException as e:  # noqa: B902 - turned into a status
            return callback_failed(e, "gather_fn of %s" % label, sink)

    def c_redistribute(state, full, rows, cols, owner, local, n, stream):
        try:
            matrix = _comm.view(full, (rows, cols), "<f4") if full else None
            redistribute_fn(matrix, int(owner),
                            _comm.view(local, local_shape(n), "<f4"))
            return 0
        except BaseException as e:  # noqa: B902 - turned into a status
            return callback_failed(e, "redistribute_fn of %s" % label, sink)
        finally:
            held[0] = None

    layout = _lib.muon_custom_layout_t()
    layout.struct_size = ctypes.sizeof(layout)
    layout.state = None
    layout.global_rows = operator.index(rows)
    layout.global_cols = operator.index(cols)
    callbacks = (_lib.CUSTOM_ASSIGN_FN(c_assign), _lib.CUSTOM_GATHER_FN(c_gather),
                 _lib.CUSTOM_REDISTRIBUTE_FN(c_redistribute))
    layout.assign_fn, layout.gather_fn, layout.redistribute_fn = callbacks
    return layout, callbacks


def allocator_callbacks(allocator, sink):
    """muon_options_t.allocate and .release calling allocator.allocate(nbytes,
    device_type, device_id, stream) (an address; 0 or None: short) and
    allocator.release(address, nbytes, device_type, device_id, stream), the
    stream a cudaStream_t as an int (0: none). What they raise goes to `sink`;
    allocate then returns NULL, which the library reports naming the buffer."""

    def c_allocate(ctx, nbytes, device_type, device_id, stream):
        try:
            address = allocator.allocate(nbytes, device_type, device_id, stream or 0)
            return operator.index(address) if address else None
        except BaseException as e:  # noqa: B902 - nothing may escape into the library
            callback_failed(e, "the allocator's allocate", sink)
            return None

    def c_release(ctx, address, nbytes, device_type, device_id, stream):
        try:
            allocator.release(address, nbytes, device_type, device_id, stream or 0)
        except BaseException as e:  # noqa: B902 - nothing may escape into the library
            callback_failed(e, "the allocator's release", sink)

    return _lib.ALLOCATE_FN(c_allocate), _lib.RELEASE_FN(c_release)
