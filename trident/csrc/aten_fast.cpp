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

#include <unordered_map>

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
  return it == table.end() ? nullptr : it->second;
}

}  // namespace trident
