#include "aten_fast.h"

#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/index_copy_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/where_ops.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace trident {
namespace {

const at::Tensor& T(c10::IValue& v) { return v.toTensor(); }

std::optional<at::MemoryFormat> memory_format(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toMemoryFormat();
}

void mm(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) { out.push_back(at::_ops::mm::call(T(a[0]), T(a[1]))); }

void bmm(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) { out.push_back(at::_ops::bmm::call(T(a[0]), T(a[1]))); }

void addmm(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  out.push_back(at::_ops::addmm::call(T(a[0]), T(a[1]), T(a[2]), a[3].toScalar(), a[4].toScalar()));
}

void index_copy_(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  at::Tensor self = T(a[0]);
  out.push_back(at::_ops::index_copy_::call(self, a[1].toInt(), T(a[2]), T(a[3])));
}

void index_select(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  out.push_back(at::_ops::index_select::call(T(a[0]), a[1].toInt(), T(a[2])));
}

void clone(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  out.push_back(at::_ops::clone::call(T(a[0]), memory_format(a[1])));
}

void where_self(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  out.push_back(at::_ops::where_self::call(T(a[0]), T(a[1]), T(a[2])));
}

void add_tensor(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  out.push_back(at::_ops::add_Tensor::call(T(a[0]), T(a[1]), a[2].toScalar()));
}

void mul_tensor(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  out.push_back(at::_ops::mul_Tensor::call(T(a[0]), T(a[1])));
}

void le_tensor(std::vector<c10::IValue>& a, std::vector<at::Tensor>& out) {
  out.push_back(at::_ops::le_Tensor::call(T(a[0]), T(a[1])));
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

FastCall find_fast_call(const std::string& name, const std::string& overload) {
  static const std::unordered_map<std::string, FastCall> table = {
      {"aten::mm.", &mm},
      {"aten::bmm.", &bmm},
      {"aten::addmm.", &addmm},
      {"aten::index_copy_.", &index_copy_},
      {"aten::index_select.", &index_select},
      {"aten::clone.", &clone},
      {"aten::where.self", &where_self},
      {"aten::add.Tensor", &add_tensor},
      {"aten::mul.Tensor", &mul_tensor},
      {"aten::le.Tensor", &le_tensor},
  };
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
