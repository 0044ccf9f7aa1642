"""Programmatic dependent launch (PDL): which launches may start before the one before them ends.

Note [Programmatic dependent launch]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Inside a CUDA graph each kernel boundary leaves the GPU idle for ~1-1.3 us: the next kernel's
blocks are scheduled only after the previous kernel's last block ends. On sm_90 and later a
kernel launched with the attribute CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may
start as soon as every block of the kernel before it has executed `griddepcontrol
.launch_dependents` (or ended); the early kernel's prologue (block scheduling, index arithmetic)
overlaps its predecessor's tail, and its `griddepcontrol.wait` blocks until the predecessor has
completed and its memory is visible. Stream capture records such a launch as a programmatic
edge of the graph (CUDA 12.3+).

The attribute is only safe on a kernel that executes the wait before it touches global memory:
a kernel that read its input before the wait would read the predecessor's output half written,
and one that wrote first could overwrite what the predecessor still reads. So, with
TRIDENT_PDL on, a launch gets the attribute only where its compiled kernel *proves* it waits
first (`waits_before_memory`): in the kernel's PTX, an unpredicated `griddepcontrol.wait` comes
in the entry block -- before any branch, branch target or call -- ahead of every instruction that
may touch global memory (loads and stores other than to parameters, shared and local memory,
atomics, reductions, async copies, prefetches, texture and surface accesses). Every block of
such a kernel waits, so its completion also implies its predecessor's: a kernel launched
without the attribute after it (an ATen operator, cuBLAS, a user kernel) is ordered after both,
as on a stream without PDL.

Which kernels wait first:
- Trident's own kernels (trident/kernels/: copies, cache writes, GEMV, decode attention) take a
  constexpr `PDL`; the passes that emit them set it for CUDA tensors on sm_90+ when TRIDENT_PDL is
  on (`wanted`): `gdc_wait` is their first statement and `gdc_launch_dependents` follows their
  last load (a dependent's blocks should not take SM slots while this kernel's loads still need
  them); off, the branches vanish. On the CPU (TRIDENT_PDL=all, tests) Trident's interpreted
  launches run the two instructions as no-ops (runtime/cpu_launcher.py): launches there run one
  after another anyway.
- Inductor's glue kernels (trident/passes/inductor_glue.py) are launched as twins like user
  kernels (below). With TRIDENT_PDL_USER_KERNELS=0 they are generated with Inductor's own
  `triton.enable_pdl`: it waits before the first access Inductor thinks depends on an earlier
  kernel of *its* graph, which is not always the first access (Inductor does not see the user
  kernels before it); the PTX rule then refuses the attribute for that kernel.
- A user's kernel compiled with `launch_pdl=True` is launched with the attribute exactly as
  Triton launches it (the user's promise, Triton's semantics), in a recorded graph (Note
  [Programmatic edges only in graphs]). One that is not, and that holds no
  grid dependency instruction of its own, is launched as its twin (Note [A user kernel made to
  wait], TRIDENT_PDL_USER_KERNELS, on by default): with it off, it gets the attribute only by the
  PTX rule, like Trident's.

Programmatic launches are recorded as programmatic edges of a captured graph from CUDA 12.3 on:
below it (`torch.version.cuda`; the driver must be at least that) nothing is made programmatic.

Note [A user kernel made to wait]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
In a decode step most kernel boundaries touch a user's kernel (with Liger-Kernel: the norms, the
rotary embedding and SwiGLU around every product), and a kernel that does not wait cannot be
launched early, nor release the one after it early: Trident's kernels alone make ~2 of a layer's
~10 boundaries programmatic. So, with TRIDENT_PDL on, a user's kernel that holds no
`griddepcontrol` instruction is compiled once more, by Triton, for the launch's specialization
with the launch options `launch_pdl=True` and `ir_override=TWIN` (a name that is no IR file:
Triton overrides a stage only with a file named `*.<stage>`, but hashes the option into both its
in-memory and its disk cache keys, so the twin has an entry of its own: no launch of the user's,
with or without `launch_pdl`, is ever served the twin, nor Trident the user's), with the two
instructions `griddepcontrol.wait; griddepcontrol.launch_dependents;` put first in its entry
block (a stage hook rewrites the PTX of compilations carrying that option only,
`with_wait_first`; ptxas compiles the rest as Triton does). Every block of the twin waits until
its predecessor has completed and its memory is visible before it does anything: what the kernel
computes, reads and writes is the original's, in stream order. Releasing its dependents at once
cannot starve this kernel: a dependent is scheduled only after every block of this one has
executed the release, i.e. is resident, and the release comes after the wait, so dependents run
at most one kernel ahead. It is safe for every dependent Trident makes programmatic by the PTX
rule (they wait first); a user kernel the user compiled with `launch_pdl=True` that reads before
its own `gdc_wait` is racy by CUDA's rules whatever precedes it. The twin is used only when its
PTX passes the PTX rule, both when it is compiled and when a persistent plan record names it (an
entry the hook did not rewrite, or a failed compile: the original keeps ordinary ordering). A
user kernel that holds a grid dependency instruction is the user's design and is left as it is;
so is one whose launch sets `ir_override` itself.
Inductor's glue kernels are then generated without Inductor's own PDL and get twins too: one rule
for every Triton kernel Trident did not write.

The decision is made where a launch is planned (scm/specialize.py `plan_launch`), recorded in the
plan (`LaunchPlan.pdl`) and printed by the SCM printer; a restored plan decides again from its
kernel. TRIDENT_PDL is on by default ('cuda') since user kernels run as their waiting twins: on an
H100, Llama-1B + Liger 1.311 -> 1.237 ms/token, Qwen2-0.5B + Liger 1.026 -> 0.904, plain Llama
1.383 -> 1.306, plain Qwen2 1.115 -> 1.020 (results/bench_hf_{llama,qwen2}_liger_75f55ad.json,
results/bench_hf_plain_d4246ab.json). Without the twins it gained nothing with Liger (H200,
b5cf397: 1.086 -> 1.077) and was slower on the H100 (1.311 -> 1.356, `trident_pdl_own`).

Note [Programmatic edges only in graphs]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A plan's `pdl` says what a launch may be; the native runtime makes it programmatic only while its
stream is being captured: Trident's own recording of a region (Note [Graph replay]) or a user's
torch.cuda.graph around the call. An ordinary call -- a region that is not (yet) replayed, a
symbolic region meeting sizes it has not recorded -- launches every kernel in plain stream order,
and a user's kernel as the user wrote it: a plan that launches a waiting twin keeps the user's
own compiled kernel too (`LaunchPlan.ordinary`, Triton's hash, in the plan record as well: a
restored twin reads it from Triton's cache), whose native entry the twin's names
(`set_kernel_ordinary`, which checks the two take the same parameters, warps and CTAs; where
it refuses, the twin serves every call and the miss log says why). The twin's module is loaded at
the first ordinary call that stands in for it, so a recording loads no module while the stream
is captured. What PDL hides
is the device's idle time between kernels, which only a graph leaves as the limit: in an
ordinary call the GPU waits for the host anyway, and the attribute and the twins cost host time.
Measured on an H100 (prefills of 12-24 random lengths through trident.compile with Liger,
tools/bench_dynamic.py --profile-call 5): with programmatic launches in ordinary calls each
prompt length new to the symbolic capture took 89-104 ms, 75 ms of it in cuDNN's attention
planning the new length, against 6-7 ms without PDL (results/bench_dynamic_e0e1395.json); a length
already seen took 8-11 ms against 6. With launches programmatic only in graphs a length seen before
took 5.4 ms against 4.7 (results/bench_dynamic_70fc539.json). Those runs measured every variant in
one process, after eager, whose cold pass had built cuDNN's attention graph of every length, which
later variants could find built. One variant a process, with the user's own
kernels in ordinary calls (4d40404, results/bench_dynamic_4d40404.json), a new length took 74-92 ms
against 53-61 without PDL and eager's 100-118, on a slow machine; both measured in one device call
(0bf8375, results/bench_dynamic_pdl_profile_0bf8375.json) they are the same: 53 against 56-57 ms, the
profiled new length 138 against 147 ms, 42 against 44 ms of it cuDNN's attention planning. The same rule holds for a launch the user compiled with `launch_pdl=True`: stream
order is the stricter ordering, so only overlap is lost, where nothing overlaps anyway.
"""

from __future__ import annotations

import contextlib
import functools
import re

import torch
from triton import knobs as triton_knobs

from . import knobs

MIN_CAPABILITY = (9, 0)
MIN_CUDA = (12, 3)


def enabled() -> bool:
    """TRIDENT_PDL is on and this torch's CUDA (if any) records programmatic launches in captured
    graphs as programmatic edges (CUDA 12.3+): what a launch needs to be made programmatic
    (scm/specialize.py) besides its kernel's proof."""
    return bool(knobs.pdl()) and (torch.version.cuda is None or _cuda_version() >= MIN_CUDA)


def wanted(device) -> bool:
    """Whether kernels generated for tensors on `device` should wait first and release their
    dependents early: `enabled()` and, with TRIDENT_PDL 'cuda', a CUDA device of compute
    capability 9.0 or later (an NVIDIA one: a ROCm build's "cuda" device has no grid dependency
    instructions); with 'all' also any other device (on the CPU the waits are no-ops of the
    interpreter)."""
    if not enabled():
        return False
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return knobs.pdl() == "all"
    if getattr(torch.version, "hip", None) is not None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= MIN_CAPABILITY


def _cuda_version() -> tuple:
    try:
        return tuple(int(p) for p in (torch.version.cuda or "0").split(".")[:2])
    except ValueError:
        return (0,)


# State spaces an ld/st may name that are not global memory.
_PRIVATE_SPACES = {"param", "shared", "local", "const", "reg"}
_MEMORY_OPS = {"ld", "ldu", "st", "atom", "red", "cp", "prefetch", "prefetchu", "multimem", "tex", "tld4", "suld",
               "sust", "sured", "applypriority", "discard", "createpolicy", "tensormap", "mbarrier", "wmma",
               "wgmma", "ldmatrix", "stmatrix", "tcgen05", "bulk"}
_ENDS_BLOCK = {"bra", "brx", "call", "ret", "exit", "trap", "brkpt"}
_BRANCH_TARGET = re.compile(r"\b(?:bra|brx\.idx)(?:\.uni)?\s+([^;]+);")
_ENTRY = re.compile(r"\.entry\s+[\w$]+\s*\(")


def _instructions(body: str):
    """The statements of a PTX function body in order: comments removed, one per `;`, labels
    as their own statements."""
    body = re.sub(r"/\*.*?\*/", " ", body, flags=re.S)  # block comments
    for line in body.splitlines():
        line = line.split("//", 1)[0].strip()
        if not line:
            continue
        for piece in line.split(";"):
            piece = piece.strip()
            while piece:
                # a label is an identifier (no dots) and one colon: `ld.global.L1::evict_last` is not
                m = re.match(r"^([A-Za-z_$%][\w$]*):(?!:)\s*", piece)
                if m is None:
                    break
                yield m.group(1) + ":"
                piece = piece[m.end():]
            if piece:
                yield piece


@functools.lru_cache(maxsize=1024)
def waits_before_memory(ptx: str) -> bool:
    """Whether the kernel of `ptx` (one `.entry`) executes an unpredicated `griddepcontrol.wait`
    in its entry block before any instruction that may touch global memory (Note
    [Programmatic dependent launch]); a prefetch into the L2 reads no value and does not count."""
    entries = list(_ENTRY.finditer(ptx))
    if len(entries) != 1:
        return False
    start = ptx.find("{", ptx.find(")", entries[0].end()))
    if start < 0:
        return False
    body = ptx[start + 1:]
    targets = {t.strip() for m in _BRANCH_TARGET.finditer(body) for t in m.group(1).split(",")}
    for statement in _instructions(body):
        statement = statement.strip("{} \t")
        if not statement:
            continue
        if statement.endswith(":"):
            if statement[:-1] in targets:
                return False  # a branch target: the entry block ends
            continue
        if statement.startswith("."):
            continue  # declarations: .reg, .shared, .local, .loc, .pragma
        predicated = statement.startswith("@")
        if predicated:
            parts = statement.split(None, 1)
            statement = parts[1] if len(parts) > 1 else ""
        opcode = statement.split(None, 1)[0] if statement else ""
        parts = opcode.split(".")
        if parts[0] == "griddepcontrol" and "wait" in parts[1:]:
            if not predicated:
                return True
            continue  # a predicated wait may not run: look on
        if parts[0] in _ENDS_BLOCK:
            return False
        if parts[0] == "prefetch" and parts[1:2] == ["global"] and any(p.startswith("L2") for p in parts[2:]):
            continue  # into the L2, the GPU's point of coherence: no value read (Note [Weights ahead of the wait])
        if parts[0] in _MEMORY_OPS:
            spaces = set(parts[1:]) & (_PRIVATE_SPACES | {"global"})
            if parts[0] in ("ld", "ldu", "st") and spaces and "global" not in spaces:
                continue  # a parameter, shared, local or constant access
            return False
    return False


def twins_wanted(device) -> bool:
    """Whether a user's kernel launched on `device` is launched as its twin (Note [A user kernel
    made to wait]): `wanted(device)` and TRIDENT_PDL_USER_KERNELS."""
    return knobs.pdl_user_kernels() and wanted(device)


def holds_grid_dependency(ptx: str) -> bool:
    """Whether the kernel of `ptx` executes any grid dependency instruction of its own."""
    return "griddepcontrol" in ptx


TWIN = "trident-waiting-twin"  # the twin's ir_override: Note [A user kernel made to wait]

# lines before which the instructions do not go: declarations, blanks and comments, debug
# locations and files
_PREAMBLE = re.compile(r"\s*(?:$|//|\.(?:reg|shared|local|param|const|loc|file)\b)")
_LABEL = re.compile(r"\s*([A-Za-z_$%][\w$]*):(?!:)\s*(?://.*)?$")


def with_wait_first(ptx: str) -> str:
    """`ptx` (one `.entry`) with `griddepcontrol.wait` and `griddepcontrol.launch_dependents`
    the first instructions of its entry block, after the leading declarations, debug locations
    and labels no branch goes to (Note [A user kernel made to wait]); unchanged when it is not one
    entry or already holds either."""
    entries = list(_ENTRY.finditer(ptx))
    if len(entries) != 1 or holds_grid_dependency(ptx):
        return ptx
    start = ptx.find("{", ptx.find(")", entries[0].end()))
    if start < 0:
        return ptx
    targets = {t.strip() for m in _BRANCH_TARGET.finditer(ptx[start:]) for t in m.group(1).split(",")}
    at = ptx.find("\n", start) + 1
    while True:
        end = ptx.find("\n", at)
        if at <= 0 or end < 0:
            return ptx  # no instruction on a line of its own: left as it is
        line = ptx[at:end]
        label = _LABEL.match(line)
        if not (_PREAMBLE.match(line) or (label and label.group(1) not in targets)):
            break
        at = end + 1
    return ptx[:at] + "\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n" + ptx[at:]


@contextlib.contextmanager
def twin_compilation():
    """While inside, Triton's compilations whose options carry `ir_override=TWIN` put the grid
    dependency instructions first in a kernel that holds none (`with_wait_first` on the PTX stage;
    any stage hook already installed runs first); no other compilation is touched. Entered by the
    planner around a twin's compile, under triton_state.exclusive(); on leaving, the hook found
    is put back unless another was installed meanwhile."""
    previous = triton_knobs.runtime.add_stages_inspection_hook

    def hook(backend, stages, options, language, capability):
        if previous is not None:
            previous(backend, stages, options, language, capability)
        if getattr(options, "ir_override", None) != TWIN or "ptx" not in stages:
            return
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: with_wait_first(make_ptx(src, metadata))

    triton_knobs.runtime.add_stages_inspection_hook = hook
    try:
        yield
    finally:
        if triton_knobs.runtime.add_stages_inspection_hook is hook:
            triton_knobs.runtime.add_stages_inspection_hook = previous
