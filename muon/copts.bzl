"""Compiler flags every C++ target of libmuon carries itself, so that a
workspace depending on libmuon builds it without flags of its own."""

MUON_COPTS = [
    "-std=c++17",
    "-fvisibility=hidden",
]
