"""Which lines of a training step make the host wait for the device or copy from the host (one GPU):
the DCLS-delays networks of bench/delays_gpu.py (with and without delays) and the e-prop step of
bench/eprop_gpu.py (LIF and ALIF, BPTT and e-prop). Patches `Tensor.item`, `__bool__`, `tolist`,
`__float__`, `__int__` and `torch.tensor`/`as_tensor` with a device to count the callers' flexdsl lines.

    python3 bench/host_waits.py [delays] [eprop]
"""
import collections
import sys
import traceback

import torch

sys.path.insert(0, "bench")

SEEN: collections.Counter = collections.Counter()


def where() -> str:
    fr = [f for f in traceback.extract_stack()[:-2] if "flexdsl" in f.filename or "delays_gpu" in f.filename]
    return " <- ".join(f"{f.filename.split('/')[-1]}:{f.lineno}" for f in fr[-3:][::-1]) or "(outside flexdsl)"


def patch():
    for name in ("item", "__bool__", "tolist", "__float__", "__int__"):
        orig = getattr(torch.Tensor, name)

        def g(self, *a, _orig=orig, _name=name, **k):
            if self.is_cuda:
                SEEN[f"{_name}: {where()}"] += 1
            return _orig(self, *a, **k)
        setattr(torch.Tensor, name, g)
    for name in ("tensor", "as_tensor"):
        orig = getattr(torch, name)

        def f(*a, _orig=orig, _name=name, **k):
            dev = k.get("device")
            if dev is not None and "cuda" in str(dev) and not isinstance(a[0] if a else None, torch.Tensor):
                SEEN[f"torch.{_name}(..., device=cuda): {where()}"] += 1
            return _orig(*a, **k)
        setattr(torch, name, f)


def report(label, step):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    SEEN.clear()
    patch_once()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    print(f"==== {label}: host waits and host copies in 5 steps", flush=True)
    for k, v in SEEN.most_common():
        print(f"  {v:3d}  {k}", flush=True)
    SEEN.clear()


def eprop_cases():
    import eprop_gpu as e
    dev = torch.device("cuda")
    x = (torch.rand(100, 64, e.IN, device=dev) < 0.05).float()
    y = torch.randint(0, e.OUT_N, (100, 64), device=dev)
    for model in ("lif", "alif"):
        for learning in ("bptt", "eprop"):
            layer, readout = e.build(model, learning, 256, dev)
            report(f"{model} {learning}", lambda layer=layer, readout=readout: e.step(layer, readout, x, y, None))


def main():
    which = sys.argv[1:] or ["delays", "eprop"]
    if "eprop" in which:
        eprop_cases()
    if "delays" not in which:
        return
    from delays_profile import steps
    for delays, step in steps():
        report(f"delays={delays}", step)


_patched = []


def patch_once():
    if not _patched:
        patch()
        _patched.append(True)


if __name__ == "__main__":
    main()
