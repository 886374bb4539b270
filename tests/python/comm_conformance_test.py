"""The communicator conformance suite (muon/comm/testing, loaded from
libmuon_conformance.so) against communicators written in Python: a
muon.Communicator over threads (thread_ranks.ThreadComm), and
muon.TorchDistComm over gloo on 3 processes, on the world and on a sub-group
whose ranks are in reverse order. Every rank runs every check on its own
table through ctypes; any failure on any rank fails the test with the
suite's report."""

import ctypes
import os

import muon
from thread_ranks import Hub, ThreadComm, run_ranks


def conformance():
    path = os.environ["MUON_CONFORMANCE_LIBRARY"]
    if "/" not in path:
        path = "./" + path
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.muon_conformance_run.restype = ctypes.c_int
    lib.muon_conformance_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                                         ctypes.c_size_t]
    return lib


def run_suite(comm):
    """The failures the suite reports for `comm` (a muon.Communicator), as text."""
    report = ctypes.create_string_buffer(1 << 16)
    table = comm.table
    failures = conformance().muon_conformance_run(ctypes.addressof(table), 1, report,
                                                  len(report))
    return failures, report.value.decode("utf-8", "replace")


def test_a_python_communicator_over_threads_conforms():
    for n in range(1, 5):
        hub = Hub(n)
        results, errors = run_ranks(n, lambda rank: run_suite(ThreadComm(hub, rank)))
        assert errors == [None] * n, errors
        for rank, (failures, report) in enumerate(results):
            assert failures == 0, "%d ranks, rank %d:\n%s" % (n, rank, report)


def _torch_worker(rank, world_size):
    import torch.distributed as dist

    out = {"world": run_suite(muon.TorchDistComm())}
    reversed_group = dist.new_group(list(reversed(range(world_size))))
    out["reversed"] = run_suite(muon.TorchDistComm(reversed_group))
    return out


def test_torch_dist_comm_over_gloo_conforms():
    import dist_harness

    results = dist_harness.launch(_torch_worker, 3)
    for rank, out in enumerate(results):
        for group, (failures, report) in out.items():
            assert failures == 0, "rank %d, %s group:\n%s" % (rank, group, report)
