#!/usr/bin/env python3
"""Packs the Python package and the built libraries into one wheel:
libmuon-<version>-py3-none-<platform>.whl holding muon/*.py, muon/py.typed (the
package's type hints are for type checkers, PEP 561), muon/libmuon.so
(found by the package next to itself) and, when given, muon/libmuon_cuda.so
(loaded by libmuon.so from its own directory). Written with zipfile, as the
wheel format (PEP 427) describes: no build backend, nothing from the network.

  make_wheel.py --lib bazel-bin/libmuon.so [--cuda-plugin bazel-bin/libmuon_cuda.so]
                --package python/muon --header include/libmuon/muon.h --out wheelhouse
"""

import argparse
import base64
import hashlib
import os
import re
import sysconfig
import zipfile


def version(header):
    with open(header, encoding="utf-8") as f:
        text = f.read()
    parts = [re.search(r"#define MUON_VERSION_%s (\d+)" % k, text).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--cuda-plugin")
    ap.add_argument("--package", required=True)
    ap.add_argument("--header", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    ver = version(args.header)
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    tag = "py3-none-" + platform
    dist_info = "libmuon-%s.dist-info" % ver
    files = {}  # archive name -> bytes
    for name in sorted(os.listdir(args.package)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(args.package, name), "rb") as f:
                files["muon/" + name] = f.read()
    for path, name in ((args.lib, "libmuon.so"), (args.cuda_plugin, "libmuon_cuda.so")):
        if path:
            with open(path, "rb") as f:
                files["muon/" + name] = f.read()
    files[dist_info + "/METADATA"] = (
        "Metadata-Version: 2.1\nName: libmuon\nVersion: %s\n"
        "Summary: The Muon optimizer behind a stable C ABI (the muon package over libmuon.so)\n"
        "Requires-Python: >=3.9\nRequires-Dist: numpy\n" % ver).encode()
    files[dist_info + "/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: libmuon tools/make_wheel.py\nRoot-Is-Purelib: false\n"
        "Tag: %s\n" % tag).encode()
    files[dist_info + "/top_level.txt"] = b"muon\n"
    record = "".join("%s,%s,%d\n" % (n, digest(d), len(d)) for n, d in files.items())
    files[dist_info + "/RECORD"] = (record + dist_info + "/RECORD,,\n").encode()

    os.makedirs(args.out, exist_ok=True)
    wheel = os.path.join(args.out, "libmuon-%s-%s.whl" % (ver, tag))
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    print(wheel)


if __name__ == "__main__":
    main()
