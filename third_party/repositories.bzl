"""External dependencies of libmuon, all taken from the build machine.

Call `muon_dependencies()` from a WORKSPACE. A repository that already exists
(a monorepo's own abseil, googletest, ...) is left alone, so each can be
rebound to another copy by defining it before this call.
"""

load("//third_party:system_repo.bzl", "system_library")
load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

# Abseil targets we use, under upstream's labels, with the shared libraries
# each needs to link (their own dependencies come along as DT_NEEDED).
_ABSL_TARGETS = {
    "absl/base:core_headers": [],
    "absl/base:base": ["absl_base", "absl_raw_logging_internal", "absl_spinlock_wait"],
    "absl/cleanup:cleanup": [],
    "absl/container:flat_hash_map": ["absl_raw_hash_set", "absl_hash", "absl_city", "absl_low_level_hash"],
    "absl/container:flat_hash_set": ["absl_raw_hash_set", "absl_hash", "absl_city", "absl_low_level_hash"],
    "absl/container:inlined_vector": [],
    "absl/functional:function_ref": [],
    "absl/hash:hash": ["absl_hash", "absl_city", "absl_low_level_hash"],
    "absl/status:status": ["absl_status", "absl_strings", "absl_cord"],
    "absl/status:statusor": ["absl_statusor", "absl_status", "absl_strings"],
    "absl/strings:strings": ["absl_strings", "absl_strings_internal", "absl_int128", "absl_throw_delegate"],
    "absl/strings:str_format": ["absl_str_format_internal", "absl_strings"],
    "absl/synchronization:synchronization": ["absl_synchronization", "absl_time", "absl_base"],
    "absl/time:time": ["absl_time", "absl_time_zone", "absl_civil_time"],
    "absl/types:span": [],
    "absl/types:optional": ["absl_bad_optional_access"],
    "absl/types:variant": ["absl_bad_variant_access"],
}

def _maybe(rule, name, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

def _shim_repo_impl(ctx):
    # Offline stand-ins for the rule sets Bazel 4 asks for by default. The
    # files come from //third_party/shims, so this works from any workspace.
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD.bazel", "")
    for label, dest in ctx.attr.files.items():
        ctx.template(dest, label, {}, executable = dest.endswith(".sh"))
    for pkg in ctx.attr.empty_packages:
        ctx.file(pkg + "/BUILD.bazel", "")

_shim_repo = repository_rule(
    implementation = _shim_repo_impl,
    attrs = {
        "files": attr.label_keyed_string_dict(allow_files = True),
        "empty_packages": attr.string_list(),
    },
)

def muon_dependencies():
    _maybe(
        _shim_repo,
        name = "rules_cc",
        files = {Label("//third_party/shims:rules_cc.defs.bzl"): "cc/defs.bzl"},
        empty_packages = ["cc"],
    )
    _maybe(
        _shim_repo,
        name = "rules_java",
        files = {Label("//third_party/shims:rules_java.defs.bzl"): "java/defs.bzl"},
        empty_packages = ["java"],
    )
    _maybe(
        _shim_repo,
        name = "remote_coverage_tools",
        files = {
            Label("//third_party/shims:remote_coverage_tools.BUILD"): "BUILD.bazel",
            Label("//third_party/shims:coverage_stub.sh"): "stub.sh",
        },
    )
    _maybe(
        system_library,
        name = "com_google_absl",
        headers = ["absl"],
        lib_patterns = ["libabsl_*.so"],
        build_file = Label("//third_party/absl:absl.BUILD"),
        targets = _ABSL_TARGETS,
        headers_target = "absl_headers",
        package_hint = "libabsl-dev",
    )
    _maybe(
        system_library,
        name = "com_google_googletest",
        headers = ["gtest", "gmock"],
        lib_patterns = ["libgtest.a", "libgtest_main.a"],
        build_file = Label("//third_party/gtest:gtest.BUILD"),
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
        build_file = Label("//third_party/openblas:openblas.BUILD"),
        package_hint = "libopenblas-dev",
    )
    # The handshake's compressed parameter tables.
    _maybe(
        system_library,
        name = "zlib",
        headers = ["zlib.h", "zconf.h"],
        include_dirs = ["/usr/include"],
        lib_patterns = ["libz.so"],
        build_file = Label("//third_party/zlib:zlib.BUILD"),
        package_hint = "zlib1g-dev",
    )
    # Native bf16 matrix products of the CPU backend (oneDNN 2.x's C API).
    _maybe(
        system_library,
        name = "onednn",
        headers = ["oneapi"],
        include_dirs = ["/usr/include"],
        lib_patterns = ["libdnnl.so"],
        build_file = Label("//third_party/onednn:onednn.BUILD"),
        package_hint = "libdnnl-dev",
    )
    # Only //capi:libmuon_mpi.so and the MPI tests use it (libmuon.so never does).
    _maybe(
        system_library,
        name = "mpi",
        headers = ["mpi.h", "mpi_portable_platform.h"],
        include_dirs = [
            "/usr/lib/x86_64-linux-gnu/openmpi/include",
            "/usr/lib/aarch64-linux-gnu/openmpi/include",
            "/usr/include/openmpi-x86_64",
            "/usr/include/openmpi-aarch64",
            "/usr/include/openmpi",
        ],
        lib_patterns = ["libmpi.so"],
        lib_dirs = [
            "/usr/lib/x86_64-linux-gnu/openmpi/lib",
            "/usr/lib/aarch64-linux-gnu/openmpi/lib",
            "/usr/lib64/openmpi/lib",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
        ],
        build_file = Label("//third_party/mpi:mpi.BUILD"),
        package_hint = "libopenmpi-dev (and openmpi-bin for mpirun)",
    )
    _maybe(
        system_library,
        name = "dlpack",
        headers = ["dlpack/dlpack.h"],
        build_file = Label("//third_party/dlpack:dlpack.BUILD"),
        package_hint = "libdlpack-dev",
    )
    _maybe(cuda_configure, name = "local_cuda")
