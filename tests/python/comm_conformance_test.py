"""The communicator conformance suite (muon/comm/testing, loaded from
libmuon_conformance.so) against communicators written in Python: a
muon.Communicator over threads (thread_ranks.ThreadComm) at 1 to 4 ranks,
and muon.TorchDistComm over gloo on 3 processes, on the world and on two
sub-groups whose group ranks differ from the world ranks ([0, 2] and [1, 2]). Every rank runs every check on its
own table (`.table`) through ctypes; any failure or skipped check on any rank
fails the test with the suite's report."""

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
    """(failures, report) of the suite on `comm` (a muon.Communicator): the
    number of failed checks, and the report, one line per failure or skipped
    check ("skipped: ...")."""
    report = ctypes.create_string_buffer(1 << 16)
    table = comm.table
    failures = conformance().muon_conformance_run(ctypes.addressof(table), 1, report,
                                                  len(report))
    return failures, report.value.decode("utf-8", "replace")


def assert_conforms(result, where):
    failures, report = result
    assert failures == 0 and report == "", "%s:\n%s" % (where, report)


def test_a_python_communicator_over_threads_conforms():
    for n in range(1, 5):
        hub = Hub(n)
        results, errors = run_ranks(n, lambda rank: run_suite(ThreadComm(hub, rank)))
        assert errors == [None] * n, errors
        for rank, result in enumerate(results):
            assert_conforms(result, "%d ranks, rank %d" % (n, rank))


def _torch_worker(rank, world_size):
    import torch.distributed as dist

    out = {"world": run_suite(muon.TorchDistComm())}
    # torch numbers a group's members in world-rank order: sub-groups whose
    # group ranks are not the world ranks (non-adjacent members; an offset).
    for members in ([0, world_size - 1], [1, world_size - 1]):
        group = dist.new_group(members)  # every rank creates every group
        if rank in members:
            out["ranks %s" % members] = run_suite(muon.TorchDistComm(group))
    return out


def test_torch_dist_comm_over_gloo_conforms():
    import dist_harness

    results = dist_harness.launch(_torch_worker, 3)
    assert [sorted(out) for out in results] == [
        ["ranks [0, 2]", "world"], ["ranks [1, 2]", "world"],
        ["ranks [0, 2]", "ranks [1, 2]", "world"]]
    for rank, out in enumerate(results):
        for group, result in out.items():
            assert_conforms(result, "rank %d, %s group" % (rank, group))
