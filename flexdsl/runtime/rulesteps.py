"""A rule's steps for a caller that runs the time loop itself (a layer's online loop, `runtime/plastic.py`):

- `ProductSteps`: a rule whose change factors (`ir/rule.py`): its presynaptic side over the whole call
  first, then per step the postsynaptic states and one product per term (a rank-batch update);
- `Stepper`: the rule's whole step per synapse and sample (`Rule._steps` runs it too);
- `on_device`: a number or tensor as a tensor of the call's dtype and device, a number filled there (a copy
  from the host would wait for the device's queued work).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from . import ruleparams as rp

_MAX_PER_SYNAPSE = 2**31  # values a per-synapse step may hold (batch x n_post x n_pre x states)


def on_device(v: Any, like: torch.Tensor) -> torch.Tensor:
    """`v` (a number or a tensor) as a tensor of `like`'s dtype and device. A number is filled on the
    device (no copy from the host: a host-to-device copy waits for the device's queued work)."""
    if isinstance(v, torch.Tensor):
        return v.to(dtype=like.dtype, device=like.device)
    return torch.full((), float(v), dtype=like.dtype, device=like.device)


class ProductSteps:
    """See `Rule.product_stepper`: `s.step(post_t [B, n_post], w, modulators_t)` is the weight after the
    step (bounded), `s.keep()` keeps the states in the rule."""

    def __init__(self, rule: Any, pre: torch.Tensor, mods: Mapping[str, Any]) -> None:
        from ..ir.rule import NEXT

        self.rule = rule
        T, B, n_pre = pre.shape
        pb, pa = rule._side_states("pre", pre, mods)
        env_b: dict[str, Any] = {**rule._env(pre), "pre": pre}
        for s in pa:
            env_b[s], env_b[NEXT + s] = pb.get(s), pa[s]
        b = rule._call("terms_b", env_b)
        k = rule._gen[1]["terms"]
        self.b = [torch.broadcast_to(on_device(b[f"b{i}"], pre), (T, B, n_pre))
                  for i in range(k)]
        self.k, self.B, self.t = k, B, 0
        self.NEXT = NEXT
        self.names = [s for s, side in rule.sides.items() if side in ("post", "global")]
        self.env = rule._env(pre)
        self.st: dict[str, torch.Tensor] | None = None
        self.lo, self.hi = rp.clamp_bounds(rule, pre)
        self.params = rule._env(pre)

    def step(self, post_t: torch.Tensor, w: torch.Tensor, mods_t: Mapping[str, Any]) -> torch.Tensor:
        rule, env, B = self.rule, self.env, self.B
        n_post = post_t.shape[-1]
        if self.st is None:
            self.st = {s: rule._state(s, (B, n_post) if rule.sides[s] == "post" else (B, 1), post_t)
                       for s in self.names}
        env["post"] = post_t
        for k, v in mods_t.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                v = v.reshape(B, n_post) if k in rule.post_inputs else v.reshape(B, 1)
            env[k] = v
        env.update(self.st)
        new = rule._call("side_post", env) if self.names else {}
        for s in self.names:
            env[self.NEXT + s] = new[s]
        a = rule._call("terms_a", env)
        c = rule._call("terms_c", {**self.params, rule.weight_name: w})
        t = self.t
        dw = None
        for i in range(self.k):
            ai = torch.broadcast_to(on_device(a[f"a{i}"], w), (B, n_post))
            term = c[f"c{i}"] * (ai.T @ self.b[i][t])
            dw = term if dw is None else dw + term
        self.st = {s: new[s] for s in self.names}
        self.t += 1
        w = w if dw is None else w + dw
        return rp.clamp(w, self.lo, self.hi)

    def keep(self) -> None:
        if self.st is not None:
            self.rule._states.update(self.st)


class Stepper:
    """One call's steps of a rule, per synapse and sample (see `Rule.stepper`): the params, the bounds and
    the states held for the call (a step is one generated function and the batch's sum)."""

    def __init__(self, rule: Any, B: int, n_pre: int, n_post: int, like: torch.Tensor) -> None:
        self.rule = rule
        self.B, self.n_pre, self.n_post = B, n_pre, n_post
        self.shape = {"pre": (B, 1, n_pre), "post": (B, n_post, 1), "global": (B, 1, 1),
                      "synapse": (B, n_post, n_pre)}
        self.kept = {"pre": (B, n_pre), "post": (B, n_post), "global": (B, 1), "synapse": (B, n_post, n_pre)}
        self.wname = rule.weight_name
        sides = rule.sides
        self.sides = sides
        self.names = [s for s in rule._gen[1]["states"] if s != self.wname]
        per_synapse = 1 + sum(sides[s] == "synapse" for s in self.names)
        if B * n_pre * n_post * per_synapse > _MAX_PER_SYNAPSE:
            gib = B * n_pre * n_post * per_synapse * like.element_size() / 2**30
            raise rule._error(f"rule `{rule.name}` runs per synapse and sample here: {per_synapse} value(s) of "
                              f"[batch {B}, {n_post}, {n_pre}], {gib:.1f} GiB a step",
                              "a smaller batch or layer (a rule whose change factors into presynaptic and "
                              "postsynaptic parts runs as products instead)")
        self.st = {s: rule._state(s, self.kept[sides[s]], like).reshape(self.shape[sides[s]]) for s in self.names}
        self.env = rule._env(like)
        mod, meta = rule._gen
        self.fn = mod.step
        self.args = meta["args"]["step"]
        self.rets = meta["returns"]["step"]
        self.lo, self.hi = rp.clamp_bounds(rule, like)
        self.post = set(rule.post_inputs)

    def step(self, pre_t: torch.Tensor, post_t: torch.Tensor, w: torch.Tensor, mods_t: Mapping[str, Any]
             ) -> torch.Tensor:
        B, n_pre, n_post = self.B, self.n_pre, self.n_post
        env = self.env
        env["pre"] = pre_t.reshape(B, 1, n_pre)
        env["post"] = post_t.reshape(B, n_post, 1)
        for k, v in mods_t.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                v = v.reshape(B, n_post, 1) if k in self.post else v.reshape(B, 1, 1)
            env[k] = v
        env.update(self.st)
        env[self.wname] = w
        r = dict(zip(self.rets, self.fn(*[env[a] for a in self.args])))
        for s in self.names:
            self.st[s] = torch.broadcast_to(r[s], self.shape[self.sides[s]])
        new = r[self.wname]
        if not isinstance(new, torch.Tensor) or new.dim() < 3:
            return torch.broadcast_to(on_device(new, w), w.shape) * B - B * w
        return (new - w).sum(0)

    def bound(self, w: torch.Tensor) -> torch.Tensor:
        return rp.clamp(w, self.lo, self.hi)

    def keep(self) -> None:
        self.rule._states.update({s: (v.reshape(self.B, -1) if self.sides[s] in ("pre", "post", "global") else v)
                                  for s, v in self.st.items()})


__all__ = ["ProductSteps", "Stepper"]
