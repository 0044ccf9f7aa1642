#pragma once

// Note [Messages without ostream]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// TORCH_CHECK formats its message through a std::ostringstream instantiated in this extension.
// On the GPU machine (torch 2.11+cu130) formatting an integer that way crashed the process inside
// libstdc++'s num_put (cuda-gdb: std::ostream::_M_insert<unsigned long> ending in codecvt code),
// while strings went through: a refused input became a segfault instead of an error. The
// extension's checks therefore build their message with std::string and std::to_string only
// (neither touches a locale facet) and hand the finished string to c10, which formats nothing
// more in this library. Every check in trident/csrc uses TRIDENT_CHECK, never TORCH_CHECK.

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace trident::detail {

inline void append(std::string& s, const char* p) { s += p ? p : "(null)"; }
inline void append(std::string& s, const std::string& p) { s += p; }
inline void append(std::string& s, std::string_view p) { s.append(p.data(), p.size()); }
inline void append(std::string& s, char c) { s += c; }
inline void append(std::string& s, bool b) { s += b ? "true" : "false"; }

template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>, int> = 0>
void append(std::string& s, T v) {
  s += std::to_string(v);
}

template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
void append(std::string& s, T v) {
  s += std::to_string(v);
}

template <typename T, std::enable_if_t<std::is_enum_v<T>, int> = 0>
void append(std::string& s, T v) {
  s += std::to_string(static_cast<std::underlying_type_t<T>>(v));
}

template <typename... A>
std::string cat(const A&... a) {
  std::string s;
  (append(s, a), ...);
  return s;
}

}  // namespace trident::detail

// TORCH_CHECK's contract (a c10::Error naming the failed condition's place), message built
// without an ostream (Note [Messages without ostream]).
#define TRIDENT_CHECK(cond, ...)                                                                  \
  do {                                                                                            \
    if (C10_UNLIKELY(!(cond)))                                                                    \
      ::c10::detail::torchCheckFail(__func__, __FILE__, static_cast<uint32_t>(__LINE__),          \
                                    ::trident::detail::cat(__VA_ARGS__));                         \
  } while (false)
