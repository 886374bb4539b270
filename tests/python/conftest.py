"""Makes `import muon` work when pytest runs these files straight from a checkout
(the Bazel targets set PYTHONPATH and MUON_LIBRARY themselves)."""

import os
import sys

_PACKAGE_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "capi",
                             "python")
if os.path.isdir(_PACKAGE_ROOT) and not any(
        os.path.isdir(os.path.join(p, "muon")) and os.path.samefile(p, _PACKAGE_ROOT)
        for p in sys.path if os.path.isdir(p)):
    sys.path.insert(0, os.path.normpath(_PACKAGE_ROOT))
