// A region's call as the optimized graph makes it: the runtime's host program (scm_runtime) with
// graph replay (graph_replay) in front of it. The layer above both: neither names this one.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace trident {

// Runs the region on `inputs`: a recorded graph's replay when one matches, else the host program
// (on a miss the Python miss handler once, then a retry), then the graph policy's observation.
// Throws c10::Error with an explained message on failure.
std::vector<at::Tensor> run_region(int64_t region_id, std::vector<at::Tensor> inputs);

// Note [Released regions]: removes the region from the registry, retires its graphs and drops
// its miss handler (GIL held).
void release_region(int64_t id);

}  // namespace trident
