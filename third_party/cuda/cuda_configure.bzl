"""Finds the CUDA toolkit on the build machine.

Looks at $CUDA_PATH, then /usr/local/cuda. When found, the repository exposes
`:cuda_headers`, `:cudart`, `:cublas`, `:cublasLt`, `:nccl_headers` and the
path of nvcc, and `defs.bzl` sets CUDA_ENABLED = True. When absent (or when
MUON_CPU_ONLY=1), every target is an empty library and CUDA_ENABLED = False,
so the CPU-only build needs nothing from CUDA.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "") or "/usr/local/cuda"
    cpu_only = ctx.os.environ.get("MUON_CPU_ONLY", "0") not in ["", "0"]
    found = (not cpu_only) and ctx.path(root + "/include/cuda_runtime.h").exists

    if not found:
        ctx.file("defs.bzl", "CUDA_ENABLED = False\nCUDA_ROOT = \"\"\nNVCC = \"\"\n")
        names = ["cuda_headers", "cudart", "cublas", "cublasLt", "nccl_headers"]
        ctx.file("BUILD.bazel", "\n".join(
            ['package(default_visibility = ["//visibility:public"])', ""] +
            ['cc_library(name = "%s")' % n for n in names],
        ) + "\n")
        return

    ctx.symlink(root + "/include", "include")
    lib = root + "/lib64" if ctx.path(root + "/lib64").exists else root + "/lib"
    ctx.symlink(lib, "lib")
    # NCCL may sit beside the toolkit's lib64 (as in CUDA 13 bundles) or in the system dirs.
    nccl_header = ctx.path(root + "/include/nccl.h").exists
    ctx.file("defs.bzl", "CUDA_ENABLED = True\nCUDA_ROOT = \"%s\"\nNVCC = \"%s/bin/nvcc\"\n" % (root, root))
    ctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp", "include/*.hpp",
                 "include/cuda/**", "include/cub/**", "include/thrust/**", "include/nv/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    srcs = ["lib/libcudart.so"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    srcs = ["lib/libcublas.so"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublasLt",
    srcs = ["lib/libcublasLt.so"],
    deps = [":cuda_headers"],
)

# Headers only: the NCCL adapter resolves NCCL's symbols at run time from the
# copy the host process already loaded, so we never link a second NCCL.
cc_library(
    name = "nccl_headers",
    hdrs = %s,
    deps = [":cuda_headers"],
)
""" % ('["include/nccl.h"]' if nccl_header else "[]"))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "MUON_CPU_ONLY"],
    local = True,
)
