"""Repository rules that wrap libraries installed on the build machine.

Each rule creates an external repository whose BUILD file exposes the library
under the target names its upstream project uses, so a monorepo can bind the
same repository name to its own copy instead.
"""

_LIB_DIRS = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
]

def _ls(ctx, directory, pattern):
    """Lists the files in `directory` matching the shell glob `pattern`."""
    res = ctx.execute(["/bin/sh", "-c", "cd '%s' 2>/dev/null && ls -1 %s 2>/dev/null" % (directory, pattern)])
    return [f for f in res.stdout.split("\n") if f]

def _first_existing(ctx, candidates):
    for c in candidates:
        if ctx.path(c).exists:
            return c
    return None

def _system_library_impl(ctx):
    # Headers: each entry maps a path below the include root to a name in the repo.
    include_roots = ctx.attr.include_dirs
    for rel in ctx.attr.headers:
        found = _first_existing(ctx, [r + "/" + rel for r in include_roots])
        if not found:
            fail("%s: header '%s' not found under %s; install %s" %
                 (ctx.name, rel, include_roots, ctx.attr.package_hint))
        ctx.symlink(found, "include/" + rel)

    # Libraries: every file matching one of the patterns in the first dir that has any.
    lib_dirs = ctx.attr.lib_dirs or _LIB_DIRS
    for pattern in ctx.attr.lib_patterns:
        files = []
        for d in lib_dirs:
            files = _ls(ctx, d, pattern)
            if files:
                for f in files:
                    ctx.symlink(d + "/" + f, "lib/" + f)
                break
        if not files:
            fail("%s: no library matching '%s' under %s; install %s" %
                 (ctx.name, pattern, lib_dirs, ctx.attr.package_hint))

    ctx.template("BUILD.bazel", ctx.attr.build_file, {})

    # Forwarding targets under the upstream names (e.g. abseil's
    # @com_google_absl//absl/status:statusor). Each key is "package:target",
    # each value the libraries (file name stems under lib/) it links, on top
    # of the headers of `//:<headers_target>`.
    packages = {}
    for key, libs in ctx.attr.targets.items():
        pkg, name = key.split(":")
        srcs = ", ".join(['"//:lib/lib%s.so"' % l for l in libs])
        packages.setdefault(pkg, []).append(
            'cc_library(name = "%s", srcs = [%s], deps = ["//:%s"])' % (name, srcs, ctx.attr.headers_target),
        )
    for pkg, rules in packages.items():
        body = ['package(default_visibility = ["//visibility:public"])', ""] + rules
        ctx.file(pkg + "/BUILD.bazel", "\n".join(body) + "\n")

system_library = repository_rule(
    implementation = _system_library_impl,
    attrs = {
        "headers": attr.string_list(doc = "Header files or directories, relative to an include dir."),
        "include_dirs": attr.string_list(default = ["/usr/include"]),
        "lib_patterns": attr.string_list(doc = "Shell globs of library files to link."),
        "lib_dirs": attr.string_list(),
        "build_file": attr.label(mandatory = True, allow_single_file = True),
        "targets": attr.string_list_dict(doc = "'package:target' -> library stems it links."),
        "headers_target": attr.string(doc = "Target in the repo's root package with the headers."),
        "package_hint": attr.string(default = "the Debian -dev package"),
    },
    local = True,
)
