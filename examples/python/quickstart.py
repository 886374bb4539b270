"""libmuon from Python: train a tiny torch model with Muon for its weight matrices
and AdamW for its biases.

Run it from the repository root after `bazel build //:libmuon.so`:

    PYTHONPATH=python .venv/bin/python examples/python/quickstart.py

(.venv: torch and the rest, made by tools/deps.sh; a system python3 has no torch)

(the package finds bazel-bin/libmuon.so; elsewhere set MUON_LIBRARY=/path/to/libmuon.so).
"""

import torch

import muon

print("libmuon %s from %s" % (muon.__version__, muon.library_path))
torch.manual_seed(0)

# A toy regression: a random "teacher" network makes the targets.
x = torch.randn(256, 16)
with torch.no_grad():
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    y = teacher(x)

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))

# Muon orthogonalizes matrices; biases (1-D) go to AdamW.
matrices = [(name, p) for name, p in model.named_parameters() if p.ndim >= 2]
others = [p for p in model.parameters() if p.ndim < 2]

# libmuon borrows the gradient tensors: allocate them once, then zero them in
# place every step (never set them to None), so backward() accumulates into the
# registered storage.
for _, p in matrices:
    p.grad = torch.zeros_like(p)

opt = muon.Optimizer(lr=0.02, weight_decay=0.01)
for name, p in matrices:
    opt.register(p, p.grad, name=name)  # e.g. "0.weight", used in error messages
adamw = torch.optim.AdamW(others, lr=0.01, weight_decay=0.0)

losses = []
for step in range(60):
    for _, p in matrices:
        p.grad.zero_()
    adamw.zero_grad()  # only touches the biases
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()  # updates the weight matrices in place
    adamw.step()
    losses.append(loss.item())
    if step % 10 == 0 or step == 59:
        print("step %2d  loss %.5f" % (step, loss.item()))

opt.close()
print("loss %.5f -> %.5f" % (losses[0], losses[-1]))
assert losses[-1] < 0.25 * losses[0], "the loss did not go down enough"
