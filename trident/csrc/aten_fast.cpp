#include "check.h"
#include "aten_fast.h"

// One header per operator (at::_ops::<op>): the generated, faithful (schema order) signatures.
#include <ATen/ops/_fused_rms_norm_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_safe_softmax_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/abs_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/all_ops.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/amin_ops.h>
#include <ATen/ops/any_ops.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/argmin_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bitwise_and_ops.h>
#include <ATen/ops/bitwise_not_ops.h>
#include <ATen/ops/bitwise_or_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/constant_pad_nd_ops.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/flip_ops.h>
#include <ATen/ops/floor_divide_ops.h>
#include <ATen/ops/full_like_ops.h>
#include <ATen/ops/full_ops.h>
#include <ATen/ops/gather_ops.h>
#include <ATen/ops/ge_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/index_copy_ops.h>
#include <ATen/ops/index_ops.h>
#include <ATen/ops/index_put_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/lift_fresh_copy_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/logical_and_ops.h>
#include <ATen/ops/logical_not_ops.h>
#include <ATen/ops/logical_or_ops.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/min_ops.h>
#include <ATen/ops/minimum_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/new_zeros_ops.h>
#include <ATen/ops/ones_like_ops.h>
#include <ATen/ops/ones_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/reciprocal_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/remainder_ops.h>
#include <ATen/ops/repeat_ops.h>
#include <ATen/ops/roll_ops.h>
#include <ATen/ops/round_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/rsub_ops.h>
#include <ATen/ops/scatter_add_ops.h>
#include <ATen/ops/scatter_ops.h>
#include <ATen/ops/select_scatter_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/sign_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/slice_scatter_ops.h>
#include <ATen/ops/softmax_ops.h>
#include <ATen/ops/sort_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/stack_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/topk_ops.h>
#include <ATen/ops/tril_ops.h>
#include <ATen/ops/triu_ops.h>
#include <ATen/ops/var_mean_ops.h>
#include <ATen/ops/var_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>
#include <ATen/ops/zeros_like_ops.h>
#include <ATen/ops/zeros_ops.h>

#include <ATen/core/boxing/impl/make_boxed_from_unboxed_functor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace trident {
namespace {

const at::Tensor& T(c10::IValue& v) { return v.toTensor(); }

// Results in schema order; SymInt results take an undefined tensor's place (never kept).
template <class Tuple, size_t... I>
void push_all(Tuple&& t, std::vector<at::Tensor>& out, std::index_sequence<I...>) {
  auto push = [&](auto&& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, at::Tensor>) {
      out.push_back(std::move(v));
    } else {
      out.emplace_back();
    }
  };
  (push(std::get<I>(std::forward<Tuple>(t))), ...);
}
template <class Tuple>
void push_results(Tuple&& t, std::vector<at::Tensor>& out) {
  push_all(std::forward<Tuple>(t), out, std::make_index_sequence<std::tuple_size_v<std::decay_t<Tuple>>>{});
}

// One result (in-place operators return `self`, pushed like any other result) or a tuple.
void push_result(at::Tensor t, std::vector<at::Tensor>& out) { out.push_back(std::move(t)); }
template <class... R>
void push_result(std::tuple<R...>&& t, std::vector<at::Tensor>& out) {
  push_results(std::move(t), out);
}

// Note [Typed entries from the generated signatures]
// Most entries call at::_ops::<op>::call, the typed (unboxed) dispatcher entry torch generates
// for every operator overload: its C++ signature (Op::schema, schema order, kwarg-only
// arguments included) comes from the headers of the torch the extension is built against, so an
// entry follows that torch's signature with no code here naming its parameter types. Each
// materialized argument is converted the way the boxed kernel wrapper converts it
// (c10::impl::ivalue_to_arg: tensors by reference, int[] / SymInt[] / int[]? into vectors,
// Scalar, optionals, ScalarType / Layout / Device / MemoryFormat, str, Tensor[] and Tensor?[]
// lists), so a typed call gets exactly the values a boxed call would. Only operators that exist
// in every torch this builds against (years-old schemas) are listed; an operator that is not
// generated everywhere needs a runtime-checked handle instead (see the attention backends below).
template <class P>
struct ArgOf {
  using type = std::decay_t<P>;
};
template <>
struct ArgOf<at::Tensor&> {
  using type = at::Tensor&;
};
template <>
struct ArgOf<const at::Tensor&> {
  using type = const at::Tensor&;
};

template <class P>
decltype(auto) arg(c10::IValue& v) {
  return c10::impl::ivalue_to_arg<typename ArgOf<P>::type, false>::call(v);
}

template <class Op, class Sig = typename Op::schema>
struct Direct;

template <class Op, class R, class... P>
struct Direct<Op, R(P...)> {
  static void call(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
    run(a, out, std::index_sequence_for<P...>{});
  }
  template <size_t... I>
  static void run(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out, std::index_sequence<I...>) {
    TRIDENT_CHECK(a.size() == sizeof...(P), Op::name, ".", Op::overload_name, " takes ", sizeof...(P),
                " arguments, the call has ", a.size());
    push_result(Op::call(arg<P>(a[I])...), out);
  }
};

template <class Op>
std::pair<const std::string, FastCall> direct() {
  return {std::string(Op::name) + "." + Op::overload_name, &Direct<Op>::call};
}

// Attention backends: the op SDPA's dispatcher chose at capture, called unboxed. Their generated
// at::_ops signatures differ across torch versions, so the typed handle is resolved against the
// running torch's schema (OperatorHandle::typed checks it) and the entry stays boxed when the
// signature below does not match.
using CudnnAttention = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                                  at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                          const std::optional<at::Tensor>&, bool, double, bool, bool,
                                                          std::optional<double>);
using EfficientAttention = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, bool, double, bool,
    std::optional<double>);
using FlashAttention = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                                  at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                                          bool, bool, std::optional<double>);

using CpuFlashAttention = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                               double, bool, const std::optional<at::Tensor>&,
                                                               std::optional<double>);

template <class Sig>
std::optional<c10::TypedOperatorHandle<Sig>> typed_handle(const char* name) {
  try {
    auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    if (!op) return std::nullopt;
    return op->template typed<Sig>();
  } catch (const std::exception&) {
    return std::nullopt;  // this torch's signature differs: stay boxed
  }
}

const auto& cudnn_handle() {
  static auto h = typed_handle<CudnnAttention>("aten::_scaled_dot_product_cudnn_attention");
  return h;
}
const auto& efficient_handle() {
  static auto h = typed_handle<EfficientAttention>("aten::_scaled_dot_product_efficient_attention");
  return h;
}
const auto& flash_handle() {
  static auto h = typed_handle<FlashAttention>("aten::_scaled_dot_product_flash_attention");
  return h;
}

const auto& cpu_flash_handle() {
  static auto h = typed_handle<CpuFlashAttention>("aten::_scaled_dot_product_flash_attention_for_cpu");
  return h;
}

std::optional<at::Tensor> opt_tensor(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toTensor();
}
std::optional<double> opt_double(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toDouble();
}

void cudnn_attention(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  push_results(cudnn_handle()->call(T(a[0]), T(a[1]), T(a[2]), opt_tensor(a[3]), a[4].toBool(), a[5].toDouble(),
                                    a[6].toBool(), a[7].toBool(), opt_double(a[8])),
               out);
}

void efficient_attention(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  push_results(efficient_handle()->call(T(a[0]), T(a[1]), T(a[2]), opt_tensor(a[3]), a[4].toBool(), a[5].toDouble(),
                                        a[6].toBool(), opt_double(a[7])),
               out);
}

void flash_attention(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  push_results(flash_handle()->call(T(a[0]), T(a[1]), T(a[2]), a[3].toDouble(), a[4].toBool(), a[5].toBool(),
                                    opt_double(a[6])),
               out);
}

void cpu_flash_attention(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  push_results(cpu_flash_handle()->call(T(a[0]), T(a[1]), T(a[2]), a[3].toDouble(), a[4].toBool(), opt_tensor(a[5]),
                                        opt_double(a[6])),
               out);
}

}  // namespace

#define D(op) direct<at::_ops::op>()

FastCall find_fast_call(const std::string& name, const std::string& overload) {
  static const std::unordered_map<std::string, FastCall> table = {
      // matrix products
      D(mm), D(bmm), D(addmm), D(baddbmm),
      // arithmetic (a Python number where a Tensor goes arrives as a wrapped-number tensor)
      D(add_Tensor), D(add_Scalar), D(add__Tensor), D(add__Scalar),
      D(sub_Tensor), D(sub_Scalar), D(sub__Tensor), D(rsub_Tensor), D(rsub_Scalar),
      D(mul_Tensor), D(mul_Scalar), D(mul__Tensor), D(mul__Scalar),
      D(div_Tensor), D(div_Scalar), D(div_Tensor_mode), D(div_Scalar_mode), D(div__Tensor), D(div__Scalar),
      D(floor_divide), D(remainder_Tensor), D(remainder_Scalar),
      D(pow_Tensor_Scalar), D(pow_Tensor_Tensor), D(pow_Scalar),
      D(neg), D(abs), D(sign), D(round), D(rsqrt), D(sqrt), D(reciprocal), D(exp), D(log),
      D(minimum), D(maximum), D(clamp),
      // activations
      D(silu), D(gelu), D(sigmoid), D(tanh), D(relu),
      // comparisons and logic
      D(eq_Tensor), D(eq_Scalar), D(ne_Tensor), D(ne_Scalar),
      D(lt_Tensor), D(lt_Scalar), D(gt_Tensor), D(gt_Scalar),
      D(le_Tensor), D(le_Scalar), D(ge_Tensor), D(ge_Scalar),
      D(logical_not), D(logical_and), D(logical_or),
      D(bitwise_not), D(bitwise_and_Tensor), D(bitwise_or_Tensor),
      D(where_self), D(masked_fill_Scalar), D(masked_fill_Tensor),
      // reductions, normalizations, sorting
      D(mean_dim), D(mean), D(sum_dim_IntList), D(sum),
      D(amax), D(amin), D(argmax), D(argmin), D(max), D(min), D(max_dim), D(min_dim),
      D(any), D(any_dim), D(all), D(all_dim),
      D(var_correction), D(var_mean_correction), D(cumsum),
      D(_softmax), D(_safe_softmax), D(softmax_int), D(_log_softmax), D(native_layer_norm), D(_fused_rms_norm),
      D(topk), D(sort),
      // indexing, gathering, scattering, joining
      D(embedding), D(index_select), D(index_Tensor), D(gather),
      D(index_put), D(index_put_), D(index_copy_),
      D(scatter_src), D(scatter_value), D(scatter_add),
      D(slice_scatter), D(select_scatter), D(cat), D(stack),
      D(triu), D(tril), D(constant_pad_nd), D(repeat), D(flip), D(roll),
      // copies, conversions, fills, factories
      D(clone), D(copy_), D(copy), D(_to_copy), D(lift_fresh_copy),
      D(fill_Scalar), D(fill__Scalar), D(zero_),
      D(zeros), D(ones), D(full), D(zeros_like), D(ones_like), D(full_like),
      D(new_zeros), D(arange), D(arange_start), D(arange_start_step),
  };
#undef D
  auto it = table.find(name + "." + overload);
  if (it != table.end()) return it->second;
  if (!overload.empty()) return nullptr;
  if (name == "aten::_scaled_dot_product_cudnn_attention" && cudnn_handle()) return &cudnn_attention;
  if (name == "aten::_scaled_dot_product_efficient_attention" && efficient_handle()) return &efficient_attention;
  if (name == "aten::_scaled_dot_product_flash_attention" && flash_handle()) return &flash_attention;
  if (name == "aten::_scaled_dot_product_flash_attention_for_cpu" && cpu_flash_handle()) return &cpu_flash_attention;
  return nullptr;
}

}  // namespace trident
