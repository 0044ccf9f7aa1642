// Typed entry points for the operators a decode step calls most: the host program's operator
// calls go through at::_ops::<op>::call (the dispatcher's unboxed path) instead of boxing every
// argument and result through callBoxed. Same kernels, same results; less host time per call.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace trident {

// `args`: the materialized schema arguments, in order. Appends the results to `out`.
using FastCall = void (*)(std::vector<c10::IValue>& args, std::vector<at::Tensor>& out);

// The typed entry of `name` ("aten::mm") / `overload` ("" for default), or nullptr.
FastCall find_fast_call(const std::string& name, const std::string& overload);

}  // namespace trident
