"""Choosing the config of a multi-config @triton.autotune launch, once per specialization.

Note [Autotuned launches]
~~~~~~~~~~~~~~~~~~~~~~~~~
`kernel[grid](...)` on an Autotuner picks a config per *tuning key* -- the values of the
autotuner's `key` arguments plus the dtype of every tensor argument -- by timing every config
that survives `early_config_prune` / `perf_model` on the call's own arguments, caches the winner
in `autotuner.cache[key]`, and launches it. Every input of that key is fixed within one
specialization (static sizes, guarded dtypes), so Trident decides once, at the miss that builds
the specialization, and the native launch is the winner's cubin with the winner's grid (torch's
tracer records one grid per config) -- no Python, no key hashing per call.

The decision reuses Triton's own machinery:
  * the key is computed the way `Autotuner.run` computes it (`tuning_key`), and a key already in
    `autotuner.cache` (tuned by an eager call, an earlier specialization, or Triton's on-disk
    cache) is taken as is, like Triton would;
  * otherwise, on CUDA, the autotuner itself runs (`autotuner[grid](...)`), so pruning, the
    benchmarker, `reset_to_zero` / `restore_value` / hooks and `cache_results` behave exactly as
    in eager; it runs on *stand-in* tensors (zeros, with the specialization's dtypes, sizes,
    strides and 16-byte alignment) since the region's intermediates do not exist at miss time.
    Zeros keep data-dependent addressing (indices, offsets) in bounds; a kernel whose speed
    depends on its data is timed on zeros;
  * without a GPU nothing can be timed: the first config left by Triton's pruning is taken (a
    process may install a timer with `set_cpu_timer` -- the tests do, to prove the plumbing).
The choice and how it was made print in the SCM IR and in explain().
A config with a pre_hook (Python before every launch) keeps the launch out of regions.

@triton.heuristics values are computed at capture from the launch's arguments (trident.capture
evaluates them like `Heuristics.run`; below an autotuner torch's tracer folds them into every
config, as in torch.compile). A value may depend on what a later specialization changes (a
dtype, an alignment), so for each specialization the heuristics captured by trident.capture are
evaluated again on the stand-ins; a different value raises UnsupportedError (capture again with
such inputs) instead of running a kernel compiled for other inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from ..errors import UnsupportedError
from .ir import LaunchStep
from .refs import live

# (autotuner, config, stand-in args) -> a time; None: take the first pruned config on the CPU.
_cpu_timer: Optional[Callable[[Any, Any, dict], float]] = None


def set_cpu_timer(timer: Optional[Callable[[Any, Any, dict], float]]) -> None:
    """Install (or remove, with None) the function that times a config on the CPU."""
    global _cpu_timer
    _cpu_timer = timer


def call_order(tuner, args: dict) -> tuple[list, dict]:
    """(positional, keyword) arguments the way torch's launch of a captured kernel passes them
    (triton_kernel_wrapper_mutation_dense: leading parameters positionally, the rest by name)."""
    positional, rest = [], dict(args)
    for name in tuner.arg_names:
        if name not in rest:
            break
        positional.append(rest.pop(name))
    return positional, rest


def tuning_key(tuner, args: dict) -> tuple:
    """The key `Autotuner.run` caches a config under, for a launch with these arguments."""
    positional, kwargs = call_order(tuner, args)
    all_args = {**dict(zip(tuner.arg_names, positional)), **kwargs}
    named = {k: v for k, v in all_args.items() if k in tuner.arg_names}
    key = [named[k] for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def _config_index(tuner, config) -> int:
    for i, c in enumerate(tuner.configs):
        if c is config:
            return i
    for i, c in enumerate(tuner.configs):
        if c.all_kwargs() == config.all_kwargs():
            return i
    raise AssertionError(f"config {config} is not one of the autotuner's")


def describe(tuner, index: int) -> str:
    c = tuner.configs[index]
    kw = ", ".join(f"{k}={v}" for k, v in c.all_kwargs().items())
    return f"config {index + 1}/{len(tuner.configs)} ({kw})"


def _grid_fn(tuner, grids):
    def grid(meta):
        for c, g in zip(tuner.configs, grids):
            if all(meta.get(k) == v for k, v in c.kwargs.items()):
                return g
        raise AssertionError(f"no captured grid for {meta}")

    return grid


def choose(step: LaunchStep, args: dict, device: torch.device) -> tuple[int, str]:
    """(config index, how it was chosen) for `step` with `args`: parameter name -> stand-in
    tensor (`TensorFacts.allocate`, zeroed) or the constant passed."""
    tuner = step.autotuner
    key = tuning_key(tuner, args)
    if key in tuner.cache:
        return _config_index(tuner, tuner.cache[key]), f"autotuner cache, key {key}"
    positional, kwargs = call_order(tuner, args)
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return 0, "first config: a CUDA graph was being captured, nothing could be timed"
        with torch.cuda.device(device):
            tuner[_grid_fn(tuner, step.grids)](*positional, **kwargs)
        torch.cuda.synchronize(device)
        return _config_index(tuner, tuner.cache[key]), f"timed by the autotuner on stand-ins, key {key}"
    tuner.nargs = dict(zip(tuner.arg_names, positional))
    try:
        pruned = tuner.prune_configs(kwargs)
    finally:
        tuner.nargs = None
    if _cpu_timer is None:
        return _config_index(tuner, pruned[0]), "first config after pruning (no GPU to time on)"
    times = {_config_index(tuner, c): _cpu_timer(tuner, c, args) for c in pruned}
    best = min(times, key=times.get)
    tuner.cache[key] = tuner.configs[best]
    return best, f"timed by the CPU timer, key {key}"


class HeuristicFailed(Exception):
    """A @triton.heuristics function raised; `name` is its value's name, the cause is chained."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def heuristic_values(h, named: dict) -> dict:
    """The values `Heuristics.run` computes for a launch whose arguments are `named`, in order
    (each heuristic sees the values before it)."""
    values: dict = {}
    for name, heur in h.values.items():
        try:
            values[name] = heur({**named, **values})
        except Exception as e:
            raise HeuristicFailed(name) from e
    return values


def check_heuristics(step: LaunchStep, args: dict) -> None:
    """Raise UnsupportedError when a @triton.heuristics value differs for these arguments from
    the one captured."""
    ref, captured = step.heuristics
    h = live(ref)
    try:
        values = heuristic_values(h, {k: v for k, v in args.items() if k not in captured})
    except HeuristicFailed as e:  # a heuristic that reads what stand-ins lack (data, exact addresses)
        cause = e.__cause__
        raise UnsupportedError(
            f"@triton.heuristics value {e.name!r} of {step.kernel_name} could not be re-evaluated for new inputs "
            f"({type(cause).__name__}: {cause}); capture again with inputs like these"
        ) from cause
    for name, value in values.items():
        if value != captured[name]:
            raise UnsupportedError(
                f"@triton.heuristics value {name!r} of {step.kernel_name} is {value!r} for these inputs, but "
                f"{captured[name]!r} was computed at capture and compiled in. Heuristics are evaluated at capture "
                "(as torch.compile does); capture again with inputs like these, or call with inputs like the captured ones."
            )


def tuned_step(step: LaunchStep, index: int, how: str) -> LaunchStep:
    """The launch of config `index`: its grid, its meta-parameters and launch options."""
    config = step.autotuner.configs[index]
    return dataclasses.replace(
        step,
        grid=step.grids[index],
        args={**step.args, **config.all_kwargs()},
        tuned=f"{describe(step.autotuner, index)}; {how}",
        config=index,
    )
