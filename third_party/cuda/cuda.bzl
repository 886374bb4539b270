"""cuda_library: compiles .cu files with the toolkit's nvcc into a static
archive wrapped as a cc_library. Without a CUDA toolkit (see
cuda_configure.bzl) it is an empty library, so CPU-only builds never need nvcc.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "NVCC")

# Architectures the kernels are built for: Ampere (A100) and Hopper (H100/H200)
# as machine code, and PTX of the newest, which the driver compiles for GPUs
# newer than these.
CUDA_ARCHS = ["80", "90"]
CUDA_PTX_ARCH = "90"

# nvcc_hdrs: headers of other packages the .cu files include (their labels).
def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], nvcc_hdrs = [], **kwargs):
    if not CUDA_ENABLED:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    gencode = " ".join(["-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS] +
                       ["-gencode arch=compute_%s,code=compute_%s" % (CUDA_PTX_ARCH, CUDA_PTX_ARCH)])
    objs = []
    for src in srcs:
        obj = "_%s_%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = "_%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = ("%s -c -O3 -std=c++17 %s -Xcompiler -fPIC -Xcompiler -fvisibility=hidden " +
                   "-I. -I$(GENDIR) %s $(location %s) -o $@") % (NVCC, gencode, " ".join(copts), src),
        )
        objs.append(obj)
    native.genrule(
        name = "_%s_archive" % name,
        srcs = objs,
        outs = ["lib_%s_cuda.a" % name],
        cmd = "ar rcs $@ $(SRCS)",
    )
    native.cc_library(
        name = name,
        srcs = ["lib_%s_cuda.a" % name],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        alwayslink = True,
        **kwargs
    )
