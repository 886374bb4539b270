"""Every Python example in README.md runs as written: the quickstart as it
stands, the Megatron TP x DP fragment on 4 gloo processes with the tensors and
groups it names. A new ```python block in README must be added here."""

import os
import re

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from dist_harness import launch, mesh_groups  # noqa: E402

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def blocks():
    with open(README, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_readme_has_the_examples_this_test_runs():
    found = blocks()
    assert len(found) == 2, "README has %d python blocks; run the new ones here" % len(found)
    assert "muon.Muon(model.parameters()" in found[0]
    assert "create_processgroup_config" in found[1]


def test_quickstart_runs_and_trains():
    namespace = {}
    exec(compile(blocks()[0], "README.md (quickstart)", "exec"), namespace)
    model, x, y = namespace["model"], namespace["x"], namespace["y"]
    torch.manual_seed(0)
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    start = torch.nn.functional.mse_loss(fresh(x), y).item()
    assert namespace["loss"].item() < 0.7 * start
    assert set(namespace["opt"].state_dict()["state"]) == set(range(4))  # 2 Muon + 2 AdamW


def _megatron_fragment(rank, world):
    import muon
    (d, t), (dp_group, tp_group) = mesh_groups((2, 2))
    g = torch.Generator().manual_seed(3)
    up, down, head = (torch.randn(8, 6, generator=g), torch.randn(6, 8, generator=g),
                      torch.randn(4, 6, generator=g))
    w_up = torch.nn.Parameter(up.chunk(2, 0)[t].clone())      # column-parallel: rows
    w_down = torch.nn.Parameter(down.chunk(2, 1)[t].clone())  # row-parallel: columns
    w_head = torch.nn.Parameter(head.clone())
    namespace = {"muon": muon, "tp_group": tp_group, "dp_group": dp_group, "w_up": w_up,
                 "w_down": w_down, "w_head": w_head}
    exec(compile(blocks()[1], "README.md (Megatron TP x DP)", "exec"), namespace)
    before = [p.detach().clone() for p in (w_up, w_down, w_head)]
    for p in (w_up, w_down, w_head):
        p.grad = torch.ones_like(p)
    namespace["opt"].step()
    return [not torch.equal(p, b) for p, b in zip((w_up, w_down, w_head), before)]


def test_megatron_fragment_runs_on_4_ranks():
    assert launch(_megatron_fragment, 4) == [[True, True, True]] * 4


def test_every_example_names_an_interpreter_with_torch():
    # A fresh machine's python3 has no torch: each example's run line names
    # the interpreter tools/deps.sh makes (.venv/bin/python).
    examples = os.path.join(os.path.dirname(README), "examples", "python")
    for name in sorted(os.listdir(examples)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(examples, name), encoding="utf-8") as f:
            doc = f.read().split('"""')[1]
        runs = re.findall(r"^\s+(?:PYTHONPATH=\S+ )?(\S*python\S*) examples/python/", doc, re.M)
        assert runs, "%s: its docstring gives no command that runs it" % name
        for interpreter in runs:
            assert interpreter == ".venv/bin/python", "%s: runs with %s" % (name, interpreter)
