"""The optimizer of a sharded DataParallel: the user's own, updating this rank's shard, saved and loaded whole.

:mod:`gpurig.parallel.zero` cuts the buckets into shards and moves them;
this wraps the optimizer so ``optimizer.step()`` updates only this rank's shard
and then allgathers the parameters, and converts its state to and from the plain
optimizer's format for checkpoints.

>>> model = gpurig.DataParallel(torch.nn.Linear(4, 2), shard="optimizer")
>>> optimizer = ZeroRedundancyOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), model)
>>> model(torch.ones(8, 4)).sum().backward(); optimizer.step()
>>> sorted(optimizer.state_dict()["state"][1])          # the bias's whole state
['exp_avg', 'exp_avg_sq', 'step']
"""

from __future__ import annotations

import json

import torch

class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """A torch optimizer that updates only this rank's shard of a sharded DataParallel's parameters.

    Wrap the optimizer you would use anyway, built on ``model.parameters()``;
    then write ``optimizer.step()``, ``zero_grad()``, LR schedulers as usual. The
    wrapped optimizer's parameter groups then hold this rank's shard, in runs
    (``param_groups`` and ``state`` are its own); its state is per element, so
    SGD, Adam, AdamW, RMSprop or Adagrad give the same updates as unsharded.
    :meth:`step` updates the shard, then allgathers the parameters.
    :meth:`state_dict` (every rank calls it) returns the whole state in the plain
    optimizer's format, and :meth:`load_state_dict` takes one: checkpoints load
    into any rank count, sharded or not. PyTorch's own
    ``ZeroRedundancyOptimizer`` shards whole parameters among ranks; this one
    cuts the flat buckets exactly, as DeepSpeed does.

    >>> model = gpurig.DataParallel(torch.nn.Linear(4, 2), shard="gradients")
    >>> optimizer = ZeroRedundancyOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
    >>> model(torch.ones(8, 4)).sum().backward(); optimizer.step(); optimizer.zero_grad()
    >>> [len(g["params"]) for g in optimizer.param_groups]   # one run of this rank's shard: weight and bias
    [1]
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model):
        sharded = getattr(model, "zero", None)
        if sharded is None:
            raise ValueError("ZeroRedundancyOptimizer needs a model wrapped as DataParallel(shard='optimizer') or "
                             "DataParallel(shard='gradients')")
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            raise ValueError("the optimizer is sharded already")
        if any(optimizer.state.values()):
            raise ValueError("wrap the optimizer before its first step (its state would be lost)")
        self._in_buckets = in_buckets = {id(p) for bucket in sharded.buckets for p in bucket.params}
        # a frozen parameter of the model (``model.parameters()`` holds it) never gets a gradient: a torch
        # optimizer leaves it alone, and so does this one
        frozen = {id(p) for p in model.module.parameters() if not p.requires_grad}
        self.optim, self.sharded = optimizer, sharded
        self.whole_groups = [list(group["params"]) for group in optimizer.param_groups]
        group_of = {}
        for g, params in enumerate(self.whole_groups):
            for p in params:
                if id(p) not in in_buckets and id(p) not in frozen:
                    raise ValueError(f"the optimizer holds a parameter of shape {list(p.shape)} that the model does "
                                     "not shard (not one of its parameters)")
                if id(p) in in_buckets:
                    group_of[id(p)] = g
        self.segments = sharded.segments(group_of)
        for g, group in enumerate(optimizer.param_groups):
            group["params"] = [s.tensor for s in self.segments if s.group == g]
        sharded.optimizer = self
        self.defaults = optimizer.defaults
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    @property
    def param_groups(self) -> list[dict]:
        """The wrapped optimizer's groups (their hyperparameters, this rank's segments): LR schedulers change them."""
        return self.optim.param_groups

    @property
    def state(self):
        """The wrapped optimizer's state: this rank's shard's only."""
        return self.optim.state

    def __repr__(self) -> str:
        return f"ZeroRedundancyOptimizer({self.optim!r})"

    def step(self, closure=None):
        """The wrapped optimizer's step on this rank's shard, then every rank's updated shard to every rank."""
        loss = self.optim.step(closure)
        self.sharded.gather_parameters()
        return loss

    def add_param_group(self, param_group: dict) -> None:
        """Not possible after wrapping: the shards are cut once; add the group to the optimizer before wrapping it."""
        raise NotImplementedError("add the parameter group to the optimizer before wrapping it in "
                                  "ZeroRedundancyOptimizer (its shards are cut once)")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the shard's gradients and any the whole parameters accumulated (inside ``no_sync``)."""
        self.optim.zero_grad(set_to_none=set_to_none)
        for params in self.whole_groups:
            for p in params:
                p.grad = None

    # -- checkpoints: the whole state, in the plain optimizer's format ---------------------------------
    def state_dict(self) -> dict:
        """The whole optimizer state, as the unsharded optimizer's ``state_dict()`` would give it (every rank
        calls it: one allgather per bucket and per state tensor)."""
        comm, sharded = self.sharded.comm, self.sharded
        kinds = {}
        for segment in self.segments:
            for key, value in self.optim.state.get(segment.tensor, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == segment.tensor.numel():
                    kinds[key] = ["element", str(value.dtype).removeprefix("torch.")]
                elif isinstance(value, torch.Tensor):
                    kinds[key] = ["scalar", str(value.dtype).removeprefix("torch."), value.item()]
                else:
                    kinds[key] = ["constant", value]
        everyone = [json.loads(raw) for raw in comm.allgather_bytes(json.dumps(kinds).encode(), name="optimizer keys")] \
            if comm.size > 1 else [kinds]
        merged: dict = {}
        for theirs in everyone:
            for key, kind in theirs.items():
                merged.setdefault(key, kind)
        whole: dict = {}
        for key in sorted(k for k, kind in merged.items() if kind[0] == "element"):
            dtype = getattr(torch, merged[key][1])
            for b, flat in enumerate(sharded.flat_params):
                lo, hi = sharded.bounds[b]
                mine = torch.zeros(hi - lo, dtype=dtype, device=flat.device)
                for segment in self.segments:
                    value = self.optim.state.get(segment.tensor, {}).get(key)
                    if segment.bucket == b and value is not None:
                        mine[segment.start - lo: segment.end - lo] = value
                whole[key, b] = comm.allgather(mine, sizes=[hi - lo] * comm.size,
                                               name=f"bucket {b} optimizer {key}") if comm.size > 1 else mine
        state, groups, index = {}, [], 0
        for g, params in enumerate(self.whole_groups):
            indices = []
            for p in params:
                if merged and id(p) in self._in_buckets:
                    b, offset = sharded.where(p)
                    entry = {}
                    for key, kind in merged.items():
                        if kind[0] == "element":
                            entry[key] = whole[key, b][offset: offset + p.numel()].view_as(p).clone()
                        elif kind[0] == "scalar":
                            entry[key] = torch.tensor(kind[2], dtype=getattr(torch, kind[1]))
                        else:
                            entry[key] = kind[1]
                    state[index] = entry
                indices.append(index)
                index += 1
            groups.append({**{k: v for k, v in self.optim.param_groups[g].items() if k != "params"},
                           "params": indices})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take a whole optimizer state (this class's :meth:`state_dict`, or a plain optimizer's over the same
        parameters) and keep this rank's shard of it."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(params) for params in self.whole_groups]:
            raise ValueError(f"the optimizer state holds groups of {[len(g['params']) for g in groups]} parameters, "
                             f"this optimizer {[len(params) for params in self.whole_groups]}")
        saved_index = {}
        for group, saved, params in zip(self.optim.param_groups, groups, self.whole_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
            saved_index.update({id(p): i for p, i in zip(params, saved["params"])})
        self.optim.state.clear()
        for segment in self.segments:
            entries = [state_dict["state"].get(saved_index[id(p)]) for p, _, _ in segment.pieces]
            if any(e is None for e in entries):
                continue
            built = {}
            for key, value in entries[0].items():
                p = segment.pieces[0][0]
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == p.shape:
                    built[key] = torch.cat([e[key].reshape(-1)[a:b] for e, (_, a, b) in zip(entries, segment.pieces)]) \
                        .to(segment.tensor.device)
                elif isinstance(value, torch.Tensor):
                    built[key] = value.clone()
                else:
                    built[key] = value
            self.optim.state[segment.tensor] = built
