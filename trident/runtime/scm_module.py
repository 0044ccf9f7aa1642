"""One SCM at run time: its IR, its native region, its compiled host programs, its miss path.

The hit path is entirely native (trident._C: prologue, generated host program, launches). This
object is entered only on a miss: it explains the miss, checks that the captured program can
serve the new inputs, builds a specialization (Triton compiles the kernels) and compiles its
host program alone, appended to the region's table (Note [One host program per
specialization], trident/csrc/scm_runtime.h): a miss never rebuilds the others.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from typing import Optional, Sequence

import torch
from torch_mlir import ir

from .. import knobs, logs
from ..errors import GuardError, TridentError, UnsupportedError
from ..kernels.copy import index_write_checks, parameter_role
from ..lowering import check_region_steps, compile_host, emit_host_module, import_region, import_size_programs
from ..lowering.host_plan import HostPlan, RegionTables, format_plan
from ..scm.guards import CapturedLayout, DisjointInputs, first_failure
from ..scm.ir import SCM, RegionProgram, Specialization, TensorFacts, TensorGuard
from ..scm.printer import format_dtype, format_guard, format_scm
from ..scm.serialize import SerializationError, specialization_from_data, specialization_to_data
from ..scm.sizes import SizeExpr
from ..scm.specialize import build_specialization, triton_compile_seconds
from . import graphs, native
from .persistent import PlanCache

_REGISTRY: dict[int, "SCMRuntime"] = {}


def check_verbose(guard: TensorGuard, value) -> Optional[str]:
    """Python twin of one native guard: None when it holds, else why not (Dynamo's wording)."""
    name = guard.name
    if not isinstance(value, torch.Tensor):
        return f"input {name!r} type mismatch: expected Tensor, got {type(value).__name__}"
    f = guard.facts
    if value.dtype != f.dtype:
        return f"tensor {name!r} dtype mismatch: expected {format_dtype(f.dtype)}, got {format_dtype(value.dtype)}"
    if value.device != f.device:
        return f"tensor {name!r} device mismatch: expected {f.device}, got {value.device}"
    if value.dim() != len(f.sizes):
        return f"tensor {name!r} rank mismatch: expected {len(f.sizes)}, got {value.dim()}"
    for i, (want, got) in enumerate(zip(f.sizes, value.shape)):
        if want != got and i not in guard.free_sizes:
            return f"tensor {name!r} size mismatch at index {i}. expected {want}, actual {got}"
    for i, (want, got) in enumerate(zip(f.strides, value.stride())):
        if want != got and i not in guard.free_strides:
            return f"tensor {name!r} stride mismatch at index {i}. expected {want}, actual {got}"
    if guard.residue16 is not None and value.data_ptr() % 16 != guard.residue16:
        return (
            f"tensor {name!r} alignment mismatch: expected address % 16 == {guard.residue16}, "
            f"got {value.data_ptr() % 16}"
        )
    if guard.aligned16 is not None:
        offset = value.data_ptr() % 16
        if guard.aligned16 and offset:
            return f"tensor {name!r} alignment mismatch: expected 16-byte aligned, got offset {offset}"
        if not guard.aligned16 and not offset:
            return f"tensor {name!r} alignment mismatch: expected not 16-byte aligned, got aligned"
    return None


# Note [Inputs a lowered index write must not overlap]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Eager index_copy_ / index_put_ refuse a source (or index) that overlaps the tensor they write
# (at::assert_no_overlap: "unsupported operation: some elements of the input tensor and the
# written-to tensor refer to a single memory location"). Once lower_copies has made them Triton
# launches, that check is gone, and a caller passing overlapping tensors as two graph inputs
# would get an unspecified result. So each call checks, natively, that the bytes spanned by
# every input such a launch writes and by every input it reads do not intersect, and raises the
# same error otherwise (also for layouts ATen's check finds too hard and lets through). Which
# parameters one call keeps apart is the kernel's to say (trident/kernels/copy.py,
# index_write_checks).


def disjoint_input_guards(program: RegionProgram) -> list[DisjointInputs]:
    """A DisjointInputs guard (Note [One guard table]) per lowered index write between two region inputs."""
    pairs = []
    for step in program.launches:
        checks = index_write_checks(step.kernel_name, step.args, step.writes)
        refs = {name: v for name, v in step.args.items() if getattr(v, "kind", None) == "input"}
        for w_name, r_name, eager in checks:
            w, r = refs.get(w_name), refs.get(r_name)
            if w is not None and r is not None and r.index != w.index:
                what = (
                    f"{step.name} writes input {program.inputs[w.index].name!r} "
                    f"({parameter_role(step.kernel_name, w_name)}) and reads input "
                    f"{program.inputs[r.index].name!r} ({parameter_role(step.kernel_name, r_name)})"
                    if not eager else
                    f"{step.name} writes input {program.inputs[w.index].name!r} and reads input "
                    f"{program.inputs[r.index].name!r} ({r_name})"
                )
                pairs.append(DisjointInputs(w.index, r.index, what, eager))
    return pairs


def _static_layout(program: RegionProgram, i: int) -> tuple:
    """Captured sizes and strides of input i, None where symbolic (Note [Symbolic sizes])."""
    f = program.captured_inputs[i]
    if not program.symbolic:
        return f.sizes, f.strides
    sizes, strides = program.input_exprs[i]
    return (tuple(None if isinstance(e, SizeExpr) else e for e in sizes),
            tuple(None if isinstance(e, SizeExpr) else e for e in strides))


def _handles(plan: HostPlan) -> list:
    """The region-local native table indices a specialization's host program and plan bake in."""
    return json.loads(json.dumps(plan.handles.record() + [plan.handle]))  # as a record reads back


class SCMRuntime:
    def __init__(self, program: RegionProgram):
        self.program = program
        max_rank = max([len(f.sizes) for f in program.captured_inputs] + [0])
        self.scm = SCM(program, max_rank)
        self.binaries: list = []  # every host ever installed stays alive (another thread may run it)
        self.last_miss_reason: Optional[str] = None
        # per specialization built: seconds of planning, Triton's compiler, torch-dialect import,
        # host MLIR emission and LLVM (the miss-cost split; tools/bench_miss.py)
        self.build_costs: list[dict] = []
        self.torch_mlir: str = ""
        self.size_mlirs: list[str] = []  # the size programs in torch dialect, of the symbolic specializations
        self._torch_module = None  # the region in torch dialect, imported once
        self._plans = PlanCache.for_region(self.scm)  # Note [Persistent plans]; None when off
        self._records: dict[int, str] = {}  # specialization index -> its record's name in self._plans
        self.host_mlirs: list[str] = []  # per specialization: its host program
        self.host_plans: list[HostPlan] = []  # per specialization: its step table (Note [Host plans])
        self._lock = threading.Lock()
        self.region_id = native.C.create_region(
            program.name,
            len(program.inputs),
            max_rank,
            len(program.value_names),
            [o.index for o in program.outputs],
            self._on_miss,
        )
        # Note [A specialization proves itself] (csrc/scm_runtime.cpp): index -> why it was retired
        self.retired: dict[int, str] = {}
        self._planned_for: dict[int, tuple] = {}  # index -> the input facts a miss planned it for
        self._retired_facts: set = set()
        native.C.set_first_run_handler(self.region_id, self._on_first_run)
        self.tables = RegionTables(self.region_id, program.name)  # the region's native entries
        _REGISTRY[self.region_id] = self
        self.guards = disjoint_input_guards(program)  # the region's native call guards
        self.layout_guards = [
            CapturedLayout(i, inp.name, *_static_layout(program, i), program.name)
            for i, (inp, f) in enumerate(zip(program.inputs, program.captured_inputs))
        ] + list(program.size_guards)  # checked on a miss (Note [Symbolic sizes]: the program's size guards)
        # the native check raises the guard's own failure text (Note [One guard table])
        native.C.set_disjoint_inputs(self.region_id, [(g.written, g.read, g.failure()) for g in self.guards])
        enabled, emulate, self.graph_reason = graphs.policy(program)
        native.C.set_graph_policy(
            self.region_id, enabled, emulate, knobs.graph_limit(), knobs.graph_bytes(), graphs.RECORD_AFTER,
            [i.mutated for i in program.inputs], graphs.STAGING_LIMIT, knobs.graph_stage_written_bytes(),
            functools.partial(
                graphs.record, emulate=emulate, program=program, min_saving_us=knobs.graph_min_saving_us()
            ),
        )

    @staticmethod
    def release(region_ids) -> None:
        """Forgets regions whose optimized graph was garbage collected (Note [Released regions],
        scm_runtime.cpp): their graphs retired, their plans and host programs freed."""
        for region_id in region_ids:
            if _REGISTRY.pop(region_id, None) is None:
                continue
            graphs.forget(region_id)
            native.C.release_region(region_id)

    @staticmethod
    def get(region_id: int) -> "SCMRuntime":
        try:
            return _REGISTRY[region_id]
        except KeyError:
            raise TridentError(f"no SCM region {region_id} in this process") from None

    # -- building -------------------------------------------------------------------------
    def add_specialization(self, facts: Sequence[TensorFacts], residues: Sequence[int]) -> Specialization:
        """residues: data_ptr % 16 of each input."""
        t0, triton0 = time.perf_counter(), triton_compile_seconds()
        spec = build_specialization(
            self.program, facts, residues, len(self.scm.specializations), compile_kernels=self._compile_kernels(f.device for f in facts)
        )
        triton_s = triton_compile_seconds() - triton0
        spec = self.install_specialization(spec, {"plan_s": time.perf_counter() - t0 - triton_s, "triton_s": triton_s})
        self._persist(spec)  # removed again if its first run fails (_on_first_run)
        return spec

    def _on_first_run(self, region_id: int, index: int, error: Optional[str]) -> None:
        """Note [A specialization proves itself]: the first run of specialization `index` failed
        (`error`; None: it succeeded, nothing to do). It is retired natively and its persistent
        record removed -- except when a specialization planned for the same input facts was
        retired before: planning is deterministic, so this one is kept and the calls it serves
        fail at once, as eager fails, instead of planning again on every call."""
        if error is None:
            return
        with self._lock:
            facts = self._planned_for.get(index)
            if facts is not None and facts in self._retired_facts:
                return
            native.C.retire_host(self.region_id, index)
            self.retired[index] = error.splitlines()[0] if error else "its first run failed"
            if facts is not None:
                self._retired_facts.add(facts)
            if self._plans is not None and index in self._records:
                self._plans.reject(self._records.pop(index), f"its first run failed: {self.retired[index]}")
            logs.misses.debug("%s: specialization %d retired: its first run failed: %s", self.program.name, index,
                              self.retired[index])

    def _persist(self, spec: Specialization) -> None:
        """Note [Persistent plans]: writes `spec`'s record and its host program's library."""
        if self._plans is None:
            return

        try:
            payload = specialization_to_data(self.program, spec)
        except SerializationError as e:
            logs.misses.debug("%s: specialization %d not persisted: %s", self.program.name, spec.index, e)
            return
        binary = self.binaries[-1]  # persisted right after its host program was installed
        native_record = self._plans.store_native(binary.engine) if hasattr(binary, "engine") else None
        if native_record is not None:
            native_record["handles"] = _handles(self.host_plans[spec.index])
        self._records[spec.index] = self._plans.store(payload, native_record)

    def restore_cached(self) -> int:
        """Restores the specializations TRIDENT_CACHE_DIR holds for this region, in the order
        their writers selected them; a record that does not fit is removed and skipped (Note
        [Persistent plans]); how many were restored."""
        if self._plans is None:
            return 0
        try:
            entries = self._plans.entries()
        except Exception as e:  # never fatal: the specializations are built instead
            logs.misses.warning("%s: persistent plans unreadable (%s); building them again", self.program.name, e)
            return 0
        restored = 0
        for name, data, native_record in entries:
            index = len(self.scm.specializations)
            try:  # Note [Records named by what they serve]: the index is the position it gets here
                spec = self.restore_specialization({**data, "index": index}, native_record)
            except Exception as e:  # a record that does not fit is rebuilt, never fatal
                self._plans.reject(name, f"{type(e).__name__}: {e}")
                continue
            restored += 1
            self._records[spec.index] = name
            self.build_costs[-1]["restored"] = True
            if not self.build_costs[-1].get("native_restored"):
                self._persist(spec)  # its host program was built again: keep that one
        return restored

    def restore_specialization(self, data: dict, native_record: Optional[dict] = None) -> Specialization:
        """Installs the specialization a record describes (Note [A closed plan]): its plan as
        recorded; its kernels from Triton (its cache serves those compiled before); its host
        program from `native_record` (Note [Persistent plans]) when that fits, else built."""
        t0, triton0 = time.perf_counter(), triton_compile_seconds()
        if data.get("index") != len(self.scm.specializations):
            raise TridentError(
                f"{self.program.name}: a record of specialization {data.get('index')} cannot be installed as "
                f"specialization {len(self.scm.specializations)}"
            )
        devices = [torch.device(d) for d in data.get("devices", ())]
        spec = specialization_from_data(self.program, data, compile_kernels=self._compile_kernels(devices))
        self._check_restored_layouts(spec)
        triton_s = triton_compile_seconds() - triton0
        cost = {"plan_s": time.perf_counter() - t0 - triton_s, "triton_s": triton_s}
        return self.install_specialization(spec, cost, native_record)

    def _check_restored_layouts(self, spec: Specialization) -> None:
        """A restored specialization serves only layouts this region would plan for: each input
        guard's sizes and strides are the captured ones (where they are static; strides of size-1
        dimensions do not count, as in CapturedLayout). A record that says otherwise (another
        region's entry, a bug in a key) is refused before it is installed (Note [Persistent plans])."""
        for g in spec.guards:
            if g.facts is None or g.input >= len(self.program.inputs):
                continue
            want_sizes, want_strides = _static_layout(self.program, g.input)
            sizes, strides = tuple(g.facts.sizes), tuple(g.facts.strides)
            if len(sizes) != len(want_sizes) or any(w is not None and w != v for w, v in zip(want_sizes, sizes)) or any(
                w is not None and w != v and n != 1 for w, v, n in zip(want_strides, strides, sizes)
            ):
                raise TridentError(
                    f"{self.program.name}: a restored specialization guards input {g.name!r} with sizes {list(sizes)} "
                    f"and strides {list(strides)}, not the captured layout {list(want_sizes)} / {list(want_strides)}"
                )

    def install_specialization(self, spec: Specialization, cost: dict, native_record: Optional[dict] = None) -> Specialization:
        """Binds `spec`'s native tables, compiles its host program, makes it selectable."""
        t0 = time.perf_counter()
        table = self.tables.lower(self.scm, spec)  # Note [Host plans]: every native entry it names
        cost["plan_s"] += time.perf_counter() - t0  # native tables
        self.scm.specializations.append(spec)
        self.host_plans.append(table)
        try:
            self._make_selectable(spec, cost, native_record)
        except BaseException:
            self.scm.specializations.pop()  # never listed without a host program
            self.host_plans.pop()
            del self.host_mlirs[len(self.scm.specializations):]
            raise
        return spec

    def _make_selectable(self, spec: Specialization, cost: dict, native_record: Optional[dict]) -> None:
        if logs.guards.isEnabledFor(logging.DEBUG):
            logs.guards.debug(
                "%s: specialization %d guards:\n%s", self.program.name, spec.index,
                "\n".join(f"  {format_guard(g)}" for g in spec.guards),
            )
        loaded = None
        if native_record is not None and self._plans is not None and native_record.get("handles") == _handles(self.host_plans[spec.index]):
            loaded = self._plans.load_native(native_record)
        if loaded is not None:  # Note [Persistent plans]: the host program an earlier process built
            lib, host, select = loaded
            self.binaries.append(lib)
            self.host_mlirs.append(f"// specialization {spec.index}: host program restored from {native_record['file']}")
            native.C.add_host(self.region_id, host, select)
            cost.update({"torch_mlir_s": 0.0, "host_mlir_s": 0.0, "llvm_s": 0.0, "native_restored": True})
        else:
            cost.update(self.build_host(spec))
        cost["specialization"] = spec.index
        self.build_costs.append(cost)

    @staticmethod
    def _compile_kernels(devices) -> bool:
        """Real kernels for CUDA inputs; for CPU ones too unless TRIDENT_COMPILE_CUBIN_ON_CPU=0."""
        return any(d.type == "cuda" for d in devices) or knobs.compile_cubin_on_cpu()

    @property
    def _aten_handles(self) -> dict[str, int]:
        """Step name -> region-local index of its native operator call."""
        return self.tables.atens

    @property
    def host_mlir(self) -> str:
        """The host programs of every specialization, in selection order."""
        return "\n".join(self.host_mlirs)

    def build_host(self, spec: Specialization) -> dict:
        """Builds the host program of `spec` alone and appends it to the region's (Note [One host
        program per specialization]); returns its cost split (seconds): torch-dialect import
        (once per region), host MLIR emission, LLVM (MLIR's LLVM lowering and the
        ExecutionEngine)."""
        t0 = time.perf_counter()
        if self._torch_module is None:  # what the region does: the same for every specialization
            self._torch_module = import_region(self.program, ir.Context())
            self.torch_mlir = str(self._torch_module)
            check_region_steps(self.scm, self._torch_module)
        plans = [self.host_plans[spec.index]]
        size_modules = import_size_programs(self.scm, self._torch_module.context, [spec], plans)
        self.size_mlirs.extend(str(m) for m in size_modules.values())  # Note [Sizes through the torch dialect]
        t1 = time.perf_counter()
        host = emit_host_module(self.scm, self._torch_module, [spec], plans, size_modules)
        self.host_mlirs.append(str(host))
        t2 = time.perf_counter()
        binary = compile_host(host, f"{self.program.name}.{spec.index}", self.host_mlirs[-1])
        t3 = time.perf_counter()
        self.binaries.append(binary)
        native.C.add_host(self.region_id, binary.address, binary.select_address)
        logs.lowering.debug(
            "%s: host program of specialization %d: %d lines of host MLIR, built in %.2f s",
            self.program.name, spec.index, self.host_mlirs[-1].count("\n"), time.perf_counter() - t0,
        )
        self._dump()
        return {"torch_mlir_s": t1 - t0, "host_mlir_s": t2 - t1, "llvm_s": t3 - t2}

    def _dump(self) -> None:
        folder = knobs.dump_dir()
        if not folder:
            return
        os.makedirs(folder, exist_ok=True)
        stem = os.path.join(folder, f"{self.program.name}.{self.region_id}")

        records = []
        for spec in self.scm.specializations:  # Note [A closed plan]
            try:
                records.append((f".spec{spec.index}.json", json.dumps(specialization_to_data(self.program, spec), indent=1)))
            except SerializationError as e:
                records.append((f".spec{spec.index}.json", json.dumps({"not_serializable": str(e)})))
        plans = "\n".join(format_plan(p, i) for i, p in enumerate(self.host_plans))
        texts = [(".scm.txt", format_scm(self.scm)), (".torch.mlir", "\n".join([self.torch_mlir] + self.size_mlirs)),
                 (".host.mlir", self.host_mlir),
                 (".plan.txt", plans)]
        for suffix, text in texts + records:
            with open(stem + suffix, "w") as f:
                f.write(text)

    # -- the miss path --------------------------------------------------------------------
    def explain_miss(self, inputs: Sequence) -> str:
        if not self.scm.specializations:
            return "no specialization compiled yet"
        reasons = []
        names = [i.name for i in self.program.inputs]
        for spec in self.scm.specializations:
            why = next(filter(None, (check_verbose(g, inputs[g.input]) for g in spec.guards)), None)
            if why is None:  # Note [Symbolic sizes]: the size guards, in the caller's names
                failed = first_failure(spec.size_guards, inputs)
                why = failed.failure(inputs, names) if failed is not None else None
            if why:
                reasons.append(f"specialization {spec.index}: {why}")
        return "; ".join(reasons)

    def _check_servable(self, inputs: Sequence) -> None:
        """The captured program is static (CapturedLayout guards, Note [One guard table]):
        inputs must have the captured sizes and strides; dtype, device and alignment may change."""
        failed = first_failure(self.layout_guards, inputs)
        if failed is not None:
            # raised before this region ran any step
            error = GuardError(failed.failure(inputs, [i.name for i in self.program.inputs]), region=self.program.name)
            raise error

    def _on_miss(self, region_id: int, inputs: list) -> None:
        with self._lock:
            self.last_miss_reason = self.explain_miss(inputs)
            self._check_servable(inputs)
            facts = [TensorFacts.of(t) for t in inputs]
            residues = [t.data_ptr() % 16 for t in inputs]
            t0 = time.perf_counter()
            try:
                spec = self.add_specialization(facts, residues)
                self._planned_for[spec.index] = (tuple(map(repr, facts)), tuple(residues))
                logs.misses.debug(
                    "%s: miss (%s): compiled specialization %d in %.2f s",
                    self.program.name, self.last_miss_reason, spec.index, time.perf_counter() - t0,
                )
            except TridentError:
                raise
            except Exception as e:
                raise UnsupportedError(
                    f"{self.program.name}: cannot specialize for inputs "
                    f"{[f'{format_dtype(f.dtype)}{list(f.sizes)}@{f.device}' for f in facts]}: {type(e).__name__}: {e}"
                ) from e

    # -- inspection -----------------------------------------------------------------------
    def stats(self) -> dict:
        hits, misses, last = native.C.region_stats(self.region_id)
        graph = native.C.graph_stats(self.region_id)
        replays = sum(g["replays"] for g in graph["graphs"])
        return {
            "hits": hits,
            "misses": misses,
            "specializations": len(self.scm.specializations),
            "last_specialization": last,
            "last_miss_reason": self.last_miss_reason,
            "graph_replays": replays,
            # calls that ran the host program: misses, and hits that replayed no graph
            "ordinary_calls": hits + misses - replays,
            "graph_bytes": graph["bytes"],
        }

    def probe(self, inputs: Sequence[torch.Tensor]) -> int:
        """Native guard evaluation only: the index of the matching specialization, or -1."""
        return native.C.probe(self.region_id, list(inputs))

    def fake(self, mutated, inputs):
        return list(torch.fx.Interpreter(self.program.graph_module).run(*mutated, *inputs))
