"""Graph replay, the Python side (Note [Graph replay] in trident/csrc/graph_replay.cpp).

The native runtime decides when a region's calls are steady enough to record and replays the
recordings behind its guards; this module says whether a region may use graphs at all
(`policy`) and makes a recording when asked (`record`): staging buffers, the capture of the
region's host program with torch.cuda.graph (its private memory pool keeps the intermediates),
and the checks that would make a replay differ from the ordinary call.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

from .. import knobs, logs
from ..scm.guards import GRAPH_MISS_REASONS, GraphFacts
from ..scm.ir import DEFAULT, AtenStep, LaunchStep, RegionProgram, TensorFacts
from ..capture.collectives import is_collective, process_group_backend
from . import native

RECORD_AFTER = 2  # consecutive ordinary calls with equal facts (but addresses) before recording

# Note [When a graph pays off]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A replay is not free: one cuGraphLaunch (2.6 µs of host time on the H200 for a one-kernel
# graph, results/bench_launch.json), then per staged input a copy into the graph's buffer and per
# output storage an allocation and a copy out (~2.5 µs each). The ordinary call it replaces costs
# per step roughly what the host spends issuing it: ~3.3 µs a cuLaunchKernel, 8-20 µs an
# operator call (cuBLASLt, cuDNN, a typed ATen entry; README's profile), views next to nothing.
# So a region of one small kernel returning a fresh tensor runs *slower* as a graph, and a decode
# step of hundreds of calls runs many times faster. At recording time (when the staged inputs are
# known) the recorder estimates both with the constants below and refuses when the replay would
# not save more than TRIDENT_GRAPH_MIN_SAVING_US (default 0 µs): the region then stays on the
# ordinary path for good, and explain() gives both estimates. The constants are host costs
# measured on the H200; an estimate only has to rank the two paths, not time them.
LAUNCH_US = 3.3  # one Triton launch (cuLaunchKernel)
OPERATOR_US = 8.0  # one operator call that does device work (cheapest typed/cuBLASLt calls seen)
VIEW_US = 0.3  # a view or a metadata-only operator
REPLAY_US = 2.7  # one cuGraphLaunch
COPY_US = 2.5  # one staging copy in, or one output storage allocated and copied out


def policy(program: RegionProgram) -> tuple[bool, bool, Optional[str]]:
    """(enabled, emulate on the CPU, why not) for a region, from TRIDENT_GRAPHS and its steps."""
    mode = knobs.graphs()
    if not mode:
        return False, False, "off (TRIDENT_GRAPHS='')"
    for step in program.steps:
        if isinstance(step, AtenStep) and _draws_random(step):
            # A replay would repeat the recorded random numbers; the ordinary path draws new ones.
            return False, False, f"never: {step.name} ({step.op}) draws random numbers"
        if isinstance(step, AtenStep) and is_collective(step.op):
            why = _collective_not_capturable(step)
            if why is not None:
                return False, False, why
    return True, mode == "all", None


def _collective_not_capturable(step: AtenStep) -> Optional[str]:
    """Why a region with this functional collective cannot be replayed as a CUDA graph, or None
    (Note [Collectives in regions]): NCCL supports graph capture, other backends do not (CPU
    regions' emulated graphs, TRIDENT_GRAPHS=all, run on gloo: refused like the others)."""
    names = [a.name for a in step.op._schema.arguments]
    if "group_name" not in names:  # wait_tensor: the collective it waits for decides
        return None
    group = step.args[names.index("group_name")]
    try:
        backend = process_group_backend(group)
    except Exception as e:  # noqa: BLE001 - a group this process cannot resolve
        return f"never: {step.name} ({step.op}) on process group {group!r}, which cannot be resolved here ({e})"
    if backend != "nccl":
        return (f"never: {step.name} ({step.op}) runs on process group {group!r} with backend {backend!r}; "
                "only NCCL collectives can be recorded into CUDA graphs")
    return None


def ordinary_cost_us(program: RegionProgram) -> float:
    """Estimated host µs of one ordinary call's steps (Note [When a graph pays off])."""
    cost = 0.0
    for step in program.steps:
        if isinstance(step, LaunchStep):
            cost += LAUNCH_US
        elif isinstance(step, AtenStep):
            cost += VIEW_US if _metadata_only(step) else OPERATOR_US
    return cost


def replay_cost_us(program: RegionProgram, staged: int) -> float:
    """Estimated host µs of one replay with `staged` staged inputs."""
    return REPLAY_US + COPY_US * (staged + len(program.outputs))


def _metadata_only(step: AtenStep) -> bool:
    return bool(getattr(step.op, "is_view", False))


def _draws_random(step: AtenStep) -> bool:
    """Whether an operator call draws random numbers: seeded operators do, except attention
    with a constant dropout_p of 0 (scaled_dot_product_attention's variants are all tagged)."""
    if torch.Tag.nondeterministic_seeded not in step.op.tags:
        return False
    for arg, value in zip(step.op._schema.arguments, step.args):
        if arg.name == "dropout_p":
            if value is DEFAULT:
                value = arg.default_value
            return not (isinstance(value, (int, float)) and value == 0)
    return True


_capture_streams: dict[int, torch.cuda.Stream] = {}


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    s = _capture_streams.get(device.index)
    if s is None:
        s = _capture_streams[device.index] = torch.cuda.Stream(device)
    return s


STAGING_LIMIT = 64 << 20  # bytes: a larger moving read-only input is pinned (a copy per call would cost more)


def staging_buffer(t: torch.Tensor) -> Optional[torch.Tensor]:
    """A buffer with t's sizes, strides and address residue mod 16 (so the same specialization
    serves it), or None (pin it instead) when the residue is not a whole number of elements.
    Which inputs are staged at all the native runtime decides (Note [Staging written inputs])."""
    residue = t.data_ptr() % 16
    if residue % t.element_size():
        return None
    return TensorFacts.of(t).allocate(residue)


def record(region_id: int, inputs: Sequence[torch.Tensor], staged: Sequence[bool], **kwargs) -> Optional[str]:
    """Records one graph of the region (`_record`), logging the outcome (TRIDENT_LOG=graphs)."""
    why = _record(region_id, inputs, staged, **kwargs)
    if logs.graphs.isEnabledFor(logging.DEBUG):
        st = native.C.graph_stats(region_id)
        program = kwargs.get("program")
        name = program.name if program is not None else f"region {region_id}"
        if why:
            logs.graphs.debug("%s: no graph: %s", name, why)
        elif st["graphs"]:
            g = st["graphs"][-1]
            retired = sum(x["retired"] for x in st["graphs"])
            logs.graphs.debug(
                "%s: recorded graph %d (%s): staged inputs %s (written back %s), %d pinned, %s held; "
                "%d retired so far",
                name, len(st["graphs"]) - 1, "emulated" if st["emulated"] else "CUDA", g["staged"],
                g["written_back"], len(inputs) - len(g["staged"]), _mib(g["bytes"]), retired,
            )
    return why


def _record(
    region_id: int,
    inputs: Sequence[torch.Tensor],
    staged: Sequence[bool],
    emulate: bool = False,
    program: Optional[RegionProgram] = None,
    min_saving_us: float = 0.0,
) -> Optional[str]:
    """Records one graph of the region for calls like this one. None when done (or skipped
    this time); a reason string when the region must never use graphs. With `emulate`, CPU
    regions get an emulated graph (the host program reruns on the static inputs). With
    `program`, a replay must be estimated to save more than `min_saving_us` of host time
    (Note [When a graph pays off])."""
    staged = list(staged)
    static: list[torch.Tensor] = []
    for i, (t, s) in enumerate(zip(inputs, staged)):
        buf = staging_buffer(t) if s else None
        if buf is None:
            staged[i] = False
        static.append(buf if buf is not None else t)
    C = native.C
    if C.probe(region_id, static) != C.probe(region_id, list(inputs)):
        # A buffer keeps its input's layout and residue, so this should not happen; pinning the
        # moving inputs instead would record a graph that never replays.
        return "never: a staging buffer would select another specialization than its input"
    staging_bytes = sum(t.untyped_storage().nbytes() for t, s in zip(static, staged) if s)
    if program is not None:
        ordinary, replay = ordinary_cost_us(program), replay_cost_us(program, sum(staged))
        if ordinary - replay <= min_saving_us:
            return (
                f"never: a replay would not pay off (estimated host cost {replay:.1f} µs per replay vs "
                f"{ordinary:.1f} µs per ordinary call; TRIDENT_GRAPH_MIN_SAVING_US={min_saving_us:g})"
            )
    devices = {t.device for t in inputs}
    if all(d.type == "cpu" for d in devices) and emulate:
        C.add_graph(region_id, static, staged, [], 0, 0, staging_bytes, None)  # emulated: the host program reruns
        _add_guard(region_id, static, staged, program)
        return None
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return f"never: inputs on {sorted(map(str, devices))}; a graph needs every input on one CUDA device"
    device = next(iter(devices))
    with torch.cuda.device(device):
        user = torch.cuda.current_stream()
        cap = _capture_stream(device)
        graph = torch.cuda.CUDAGraph()
        cap.wait_stream(user)
        # cuBLASLt inside the graph uses the caller's stream's workspace: replays and ordinary
        # calls on that stream are ordered, so they may share it.
        C.reserve_gemm_workspace(device.index, user.cuda_stream)
        C.set_workspace_stream(user.cuda_stream)
        reserved = torch.cuda.memory_reserved(device)  # the private pool's segments are new
        # capture_begin/end rather than torch.cuda.graph(): that also synchronizes the device,
        # collects garbage and empties the allocator's cache, none of which a capture that runs
        # nothing needs, and all of which would stall the caller's steady state.
        try:
            with torch.cuda.stream(cap):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    outs = C.run_native(region_id, static)
                except BaseException:
                    try:
                        graph.capture_end()  # ends the (invalidated) capture; its own error is secondary
                    except Exception:
                        pass
                    raise
                graph.capture_end()
        finally:
            C.set_workspace_stream(0)
        pool_bytes = torch.cuda.memory_reserved(device) - reserved  # an estimate: other threads allocate too
        user.wait_stream(cap)
        held = {t.untyped_storage().data_ptr() for t in static}
        for k, o in enumerate(outs):
            if o is not None and o.untyped_storage().data_ptr() in held:
                return f"never: output {k} shares memory with an input; a replay returns copies"
        # (on its device: retiring a graph it supersedes waits for that device's stream)
        C.add_graph(
            region_id, static, staged, outs, graph.raw_cuda_graph_exec(), user.cuda_stream,
            staging_bytes + pool_bytes, graph,
        )
        _add_guard(region_id, static, staged, program)
    return None


# Note [One guard table]: each recorded graph's GraphFacts, per region, in the native entries' order
_graph_guards: dict[int, list[GraphFacts]] = {}


def _add_guard(region_id: int, static: Sequence[torch.Tensor], staged: Sequence[bool], program) -> None:
    guards = _graph_guards.setdefault(region_id, [])
    recorded = len(native.C.graph_stats(region_id)["graphs"])
    if recorded != len(guards) + 1:  # the native table took no entry (its bound): nothing to describe
        return
    written = [i.mutated for i in program.inputs] if program is not None else [False] * len(static)
    guards.append(GraphFacts.of(len(guards), static, staged, written))


def forget(region_id: int) -> None:
    """Drops what this module keeps of a released region (Note [Released regions])."""
    _graph_guards.pop(region_id, None)


def graph_guards(region_id: int) -> list[GraphFacts]:
    """The GraphFacts of every graph the region recorded (retired ones included), in order."""
    return list(_graph_guards.get(region_id, ()))


def describe(
    region_id: int,
    input_names: Sequence[str],
    static_reason: Optional[str],
    devices: Sequence[torch.device] = (),
) -> list[str]:
    """Lines for trident.explain; `devices`: where the region's specializations run."""
    if static_reason:
        return [f"graphs: {static_reason}"]
    st = native.C.graph_stats(region_id)
    if devices and not st["emulated"] and all(d.type == "cpu" for d in devices):
        return ["graphs: none on the CPU (TRIDENT_GRAPHS=cuda; 'all' emulates them there, for tests)"]
    lines = []
    mode = "emulated" if st["emulated"] else "CUDA"
    if st["off_reason"]:
        lines.append(f"graphs: off after recording was refused: {st['off_reason']}")
    if not st["graphs"] and not st["off_reason"]:
        lines.append(f"graphs: none recorded yet ({mode}; recorded after {RECORD_AFTER} calls with equal shapes)")
    n = len(input_names)
    for k, g in enumerate(st["graphs"]):
        if g["retired"]:
            why = (
                "evicted, the least recently used, to keep the bound (Note [Graph bound])" if g.get("evicted")
                else "superseded by a later graph that stages more inputs (Note [Graph lifetimes])"
            )
            lines.append(f"graph {k} ({mode}): retired after {g['replays']} replay(s), {why}")
            continue
        staged = ", ".join(input_names[i] + (" (written back)" if i in g["written_back"] else "") for i in g["staged"])
        lines.append(
            f"graph {k} ({mode}): {g['replays']} replay(s), {_mib(g['bytes'])} held; staged: {staged or 'none'}; "
            f"pinned: the other {n - len(g['staged'])} input(s)"
            + (f"; {g['lent']} output storage(s) lent, not copied (Note [Lent outputs])" if g.get("lent") else "")
            + ("; rotates with another graph: the state it lends comes back as an input (Note [Carried state "
               "in rotation])" if g.get("rotating") else "")
        )
    for i, code, span in st["pinned_moving"]:
        why = {
            "undefined": "it is not a tensor",
            "residue": "its address % 16 is not a whole number of elements",
            "read_too_large": f"it spans {span} bytes > {st['stage_read_limit']}",
            "written_too_large": f"it is written and spans {span} bytes > "
            f"TRIDENT_GRAPH_STAGE_WRITTEN_BYTES={st['stage_written_limit']}",
            "written_not_dense": "it is written and its elements do not cover its span exactly (a view with gaps "
            "or overlaps)",
            "aliased": "it shares memory with an input the region writes (or is written and shares memory with "
            "another input)",
        }[code]
        lines.append(f"graphs: input {input_names[i]!r} moves between calls but is pinned: {why}")
    if st.get("evicted"):
        bound = f"TRIDENT_GRAPH_LIMIT={st['max_graphs']} live graphs"
        if st["max_bytes"]:
            bound += f", TRIDENT_GRAPH_BYTES={st['max_bytes']}"
        lines.append(f"graphs: bound reached ({bound}): {st['evicted']} graph(s) evicted, least recently used first")
    if st.get("lent_held"):
        lines.append(f"graphs: {st['lent_held']} graph(s) found a lent output still referenced and left the call to "
                     "the ordinary path (Note [Lent outputs])")
    if st["retire_error"]:
        lines.append(f"graphs: waiting for a retired graph's work failed: {st['retire_error']}")
    if st["moving"]:
        lines.append("graphs: inputs seen moving between calls: " + ", ".join(input_names[i] for i in st["moving"]))
    if st["declined"]:
        lines.append(f"graphs: {st['declined']} call(s) matched no recorded graph (ordinary path)")
    why, i = st["last_ordinary"]
    name = input_names[i] if 0 <= i < n else "?"
    if why in GRAPH_MISS_REASONS:
        lines.append(f"graphs: the last ordinary call replayed no graph: {GRAPH_MISS_REASONS[why].format(name=name)}")
    return lines


def _mib(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
