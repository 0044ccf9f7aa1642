#include "region_call.h"

#include "check.h"
#include "graph_replay.h"
#include "scm_runtime.h"

namespace trident {

std::vector<at::Tensor> run_region(int64_t region_id, std::vector<at::Tensor> inputs) {
  ProfScope prof(native_call_counter());  // the whole native call: facts, host program, freeing the value table
  auto rp = get_region(region_id);
  Region& r = *rp;
  TRIDENT_CHECK(static_cast<int64_t>(inputs.size()) == r.num_inputs, "trident: region '", r.name,
                "' expected ", r.num_inputs, " tensor inputs, got ", inputs.size());
  if (!r.disjoint.empty()) check_disjoint_inputs(r, inputs);
  HostCtx ctx;
  c10::OptionalDeviceGuard guard;
  prepare(r, inputs, ctx, guard);
  const bool graphs_on = r.graphs && r.graphs->enabled;
  std::vector<at::Tensor> outputs;
  std::vector<bool> repin;
  if (graphs_on && graphs::try_replay(r, inputs, ctx, outputs, repin)) {
    r.hits.fetch_add(1, std::memory_order_relaxed);
    if (!repin.empty()) graphs::record_pinned(r, inputs, ctx, repin);  // Note [Pinning what stopped moving]
    return outputs;
  }
  outputs = run_prepared(r, region_id, inputs, ctx, guard, /*count=*/true);
  if (graphs_on) graphs::observe(r, inputs, ctx);  // ctx.facts are still those of `inputs`
  return outputs;
}

void release_region(int64_t id) {
  std::shared_ptr<Region> r = unregister_region(id);
  if (!r) return;
  if (r->graphs) graphs::release(*r);
  r->miss_handler = pybind11::none();  // Python objects go now, with the GIL held
  r->first_run_handler = pybind11::none();
}

}  // namespace trident
