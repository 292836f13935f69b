// Dtype dispatch over the three floating types every eagle3 kernel supports. Inputs are
// validated before dispatch, so reaching another dtype here is a bug, not a user error.
#pragma once

#include <ATen/Dispatch.h>

// Runs the lambda body with scalar_t bound to float, c10::Half or c10::BFloat16.
#define EAGLE3_DISPATCH_FLOAT_TYPES(dtype, name, ...)               \
  AT_DISPATCH_SWITCH(dtype, name,                                   \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)      \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)       \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))
