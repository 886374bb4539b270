"""External dependencies of libmuon, all taken from the build machine.

Call `muon_dependencies()` from a WORKSPACE. A repository that already exists
(a monorepo's own abseil, googletest, ...) is left alone, so each can be
rebound to another copy by defining it before this call.
"""

load("//third_party:system_repo.bzl", "system_library")
load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

_ABSL_PACKAGES = {
    "absl/base": ["core_headers", "base"],
    "absl/cleanup": ["cleanup"],
    "absl/container": ["flat_hash_map", "flat_hash_set", "inlined_vector", "btree"],
    "absl/hash": ["hash"],
    "absl/status": ["status", "statusor"],
    "absl/strings": ["strings", "str_format", "cord"],
    "absl/synchronization": ["synchronization"],
    "absl/time": ["time"],
    "absl/types": ["span", "optional", "variant"],
}

def _maybe(rule, name, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

def muon_dependencies():
    _maybe(
        native.local_repository,
        name = "rules_cc",
        path = "third_party/shims/rules_cc",
    )
    _maybe(
        native.local_repository,
        name = "rules_java",
        path = "third_party/shims/rules_java",
    )
    _maybe(
        native.local_repository,
        name = "remote_coverage_tools",
        path = "third_party/shims/remote_coverage_tools",
    )
    _maybe(
        system_library,
        name = "com_google_absl",
        headers = ["absl"],
        lib_patterns = ["libabsl_*.so"],
        build_file = "//third_party/absl:absl.BUILD",
        alias_packages = _ABSL_PACKAGES,
        alias_of = "absl",
        package_hint = "libabsl-dev",
    )
    _maybe(
        system_library,
        name = "com_google_googletest",
        headers = ["gtest", "gmock"],
        lib_patterns = ["libgtest.a", "libgtest_main.a"],
        build_file = "//third_party/gtest:gtest.BUILD",
        package_hint = "libgtest-dev",
    )
    _maybe(
        system_library,
        name = "openblas",
        headers = ["cblas.h", "openblas_config.h"],
        include_dirs = [
            "/usr/include/x86_64-linux-gnu/openblas-pthread",
            "/usr/include/aarch64-linux-gnu/openblas-pthread",
            "/usr/include/x86_64-linux-gnu",
            "/usr/include/aarch64-linux-gnu",
            "/usr/include/openblas",
            "/usr/include",
        ],
        lib_patterns = ["libopenblas.so"],
        build_file = "//third_party/openblas:openblas.BUILD",
        package_hint = "libopenblas-dev",
    )
    _maybe(
        system_library,
        name = "dlpack",
        headers = ["dlpack/dlpack.h"],
        build_file = "//third_party/dlpack:dlpack.BUILD",
        package_hint = "libdlpack-dev",
    )
    _maybe(cuda_configure, name = "local_cuda")
