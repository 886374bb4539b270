"""The C++ rules of libmuon: cc_library, cc_test and cc_binary with the compile
flags every target carries itself, so that a workspace depending on libmuon
builds it without flags of its own.

    load("//muon:copts.bzl", "muon_cc_library", "muon_cc_test")
"""

MUON_COPTS = [
    "-std=c++17",
    "-fvisibility=hidden",
]

def _with_copts(kwargs):
    kwargs["copts"] = MUON_COPTS + kwargs.get("copts", [])
    return kwargs

def muon_cc_library(**kwargs):
    native.cc_library(**_with_copts(kwargs))

def muon_cc_test(**kwargs):
    # LeakSanitizer's suppressions of what is not libmuon's (under --config=asan).
    kwargs["deps"] = kwargs.get("deps", []) + [Label("//muon/common/testing:lsan_suppressions")]
    native.cc_test(**_with_copts(kwargs))

def muon_cc_binary(**kwargs):
    native.cc_binary(**_with_copts(kwargs))
