// Input checks shared by every op. Each message names the op and the argument, says what
// was expected and what came, so that a wrong call is fixed from the message alone.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

// EAGLE3_CHECK(op, cond, message parts...): "eagle3.<op>: <message>", raised in Python as a
// ValueError (a wrong shape, size or value); EAGLE3_CHECK_DTYPE raises a TypeError (a wrong
// dtype). Faults of the machine (a failed launch, too little shared memory) stay RuntimeError.
#define EAGLE3_CHECK(op, cond, ...) TORCH_CHECK_VALUE((cond), "eagle3.", op, ": ", __VA_ARGS__)
#define EAGLE3_CHECK_DTYPE(op, cond, ...) TORCH_CHECK_TYPE((cond), "eagle3.", op, ": ", __VA_ARGS__)

namespace eagle3 {

inline bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

inline void check_float_tensor(const char* op, const char* name, const at::Tensor& t) {
  EAGLE3_CHECK_DTYPE(op, is_float_type(t.scalar_type()), name,
               " must be float32, float16 or bfloat16, got ", t.scalar_type());
}

inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim) {
  EAGLE3_CHECK(op, t.dim() == dim, name, " must have ", dim, " dimensions, got shape ",
               t.sizes());
}

inline void check_same_dtype(const char* op, const char* name, const at::Tensor& t,
                             const char* ref_name, const at::Tensor& ref) {
  EAGLE3_CHECK_DTYPE(op, t.scalar_type() == ref.scalar_type(), name, " has dtype ", t.scalar_type(),
               " but ", ref_name, " has ", ref.scalar_type(), "; they must match");
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t,
                              const char* ref_name, const at::Tensor& ref) {
  EAGLE3_CHECK(op, t.device() == ref.device(), name, " is on ", t.device(), " but ", ref_name,
               " is on ", ref.device(), "; they must be on the same device");
}

}  // namespace eagle3
