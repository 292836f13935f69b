// eagle3_bench: times every eagle3 op against its baseline in the same run, from a native
// binary (no Python in the loop). Baselines: fused_aux_fc vs cat + linear; tree_attention vs
// SDPA with a dense mask; verify_tree_greedy vs a naive single-threaded walk.
//
// Each case: warm-up, then `repeat` runs alternating baseline and op (so drift hits both);
// median / min / max per side; achieved GB/s and GFLOP/s of the op. CPU: steady_clock. CUDA:
// events on the current stream; weights rotate through copies larger than L2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#ifdef EAGLE3_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace {

struct Options {
  std::string op = "all";
  std::string preset = "decode-8b";
  std::string device = "cpu";
  std::string dtype = "bf16";
  std::string json;
  int warmup = 2;
  int repeat = 10;
  std::map<std::string, int64_t> shape;  // overrides: T, H, k, B, N, S, Hq, Hkv, D, V
};

const char* kUsage =
    "usage: eagle3_bench [--op all|fused_aux_fc|tree_attention|verify] [--preset NAME]\n"
    "                    [--device cpu|cuda] [--dtype fp32|fp16|bf16] [--shape KEY=VALUE,...]\n"
    "                    [--warmup N] [--repeat N] [--json FILE]\n"
    "presets: tiny, decode-8b, prefill-8b, decode-70b, prefill-70b, decode-dsv3, decode-kimi-k2,\n"
    "         decode-gpt-oss, decode-mistral-swa\n"
    "shape keys: T, H, k (fused_aux_fc); B, N, S, Hq, Hkv, D, Dv, W, softcap, sinks (tree_attention;\n"
    "            W = sliding window, 0 none; softcap 0 none; sinks 0/1); B, N, V (verify)\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "eagle3_bench: " << message << "\n" << kUsage;
  std::exit(2);
}

// Presets: sizes of a Llama-3-8B-like (H 4096, 32 q / 8 kv heads) and 70B-like (H 8192,
// 64 q / 8 kv heads) model at decode (few rows, draft-sized trees) and prefill sizes; MLA
// decode (DeepSeek-V3: 128 heads, Dqk 192 / Dv 128; Kimi-K2: 64 heads, a 64-node tree) and
// windowed decode (GPT-OSS: 64 q / 8 kv heads of 64, window 128 and sinks; Mistral: window
// 4096 over a 16k context).
std::map<std::string, int64_t> preset_shape(const std::string& name) {
  std::map<std::string, int64_t> s;
  if (name == "tiny") s = {{"T", 4}, {"H", 64}, {"k", 3}, {"B", 2}, {"N", 8}, {"S", 64}, {"Hq", 4}, {"Hkv", 2}, {"D", 64}, {"V", 256}};
  else if (name == "decode-8b") s = {{"T", 8}, {"H", 4096}, {"k", 3}, {"B", 8}, {"N", 16}, {"S", 4096}, {"Hq", 32}, {"Hkv", 8}, {"D", 128}, {"V", 32000}};
  else if (name == "prefill-8b") s = {{"T", 2048}, {"H", 4096}, {"k", 3}, {"B", 1}, {"N", 64}, {"S", 16384}, {"Hq", 32}, {"Hkv", 8}, {"D", 128}, {"V", 128256}};
  else if (name == "decode-70b") s = {{"T", 8}, {"H", 8192}, {"k", 3}, {"B", 8}, {"N", 16}, {"S", 4096}, {"Hq", 64}, {"Hkv", 8}, {"D", 128}, {"V", 32000}};
  else if (name == "prefill-70b") s = {{"T", 2048}, {"H", 8192}, {"k", 3}, {"B", 1}, {"N", 64}, {"S", 16384}, {"Hq", 64}, {"Hkv", 8}, {"D", 128}, {"V", 128256}};
  else if (name == "decode-dsv3") s = {{"T", 8}, {"H", 7168}, {"k", 3}, {"B", 4}, {"N", 16}, {"S", 4096}, {"Hq", 128}, {"Hkv", 128}, {"D", 192}, {"Dv", 128}, {"V", 129280}};
  else if (name == "decode-kimi-k2") s = {{"T", 8}, {"H", 7168}, {"k", 3}, {"B", 4}, {"N", 64}, {"S", 4096}, {"Hq", 64}, {"Hkv", 64}, {"D", 192}, {"Dv", 128}, {"V", 163840}};
  else if (name == "decode-gpt-oss") s = {{"T", 8}, {"H", 2880}, {"k", 3}, {"B", 8}, {"N", 16}, {"S", 4096}, {"Hq", 64}, {"Hkv", 8}, {"D", 64}, {"W", 128}, {"sinks", 1}, {"V", 201088}};
  else if (name == "decode-mistral-swa") s = {{"T", 8}, {"H", 4096}, {"k", 3}, {"B", 8}, {"N", 16}, {"S", 16384}, {"Hq", 32}, {"Hkv", 8}, {"D", 128}, {"W", 4096}, {"V", 32768}};
  else usage_error("unknown preset '" + name + "'");
  s.emplace("Dv", s.at("D"));  // (emplace keeps a preset's own value)
  s.emplace("W", 0);
  s.emplace("softcap", 0);
  s.emplace("sinks", 0);
  return s;
}

// Keys that may be 0 (a feature switched off); every size must be positive.
bool may_be_zero(const std::string& key) { return key == "W" || key == "softcap" || key == "sinks"; }

int64_t parse_int(const std::string& flag, const std::string& text, bool zero_ok = false) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size() || v < 0 || (v == 0 && !zero_ok)) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    usage_error(flag + (zero_ok ? " expects a non-negative integer, got '" : " expects a positive integer, got '") +
                text + "'");
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--op") o.op = v;
    else if (a == "--preset") o.preset = v;
    else if (a == "--device") o.device = v;
    else if (a == "--dtype") o.dtype = v;
    else if (a == "--json") o.json = v;
    else if (a == "--warmup") o.warmup = static_cast<int>(parse_int(a, v));
    else if (a == "--repeat") o.repeat = static_cast<int>(parse_int(a, v));
    else if (a == "--shape") {
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        const auto eq = item.find('=');
        if (eq == std::string::npos) usage_error("--shape takes KEY=VALUE pairs, got '" + item + "'");
        const std::string key = item.substr(0, eq);
        o.shape[key] = parse_int("--shape " + key, item.substr(eq + 1), may_be_zero(key));
      }
    } else {
      usage_error("unknown argument " + a);
    }
  }
  if (o.op != "all" && o.op != "fused_aux_fc" && o.op != "tree_attention" && o.op != "verify")
    usage_error("unknown --op '" + o.op + "'");
  if (o.device != "cpu" && o.device != "cuda") usage_error("--device must be cpu or cuda");
  if (o.dtype != "fp32" && o.dtype != "fp16" && o.dtype != "bf16") usage_error("--dtype must be fp32, fp16 or bf16");
  auto shape = preset_shape(o.preset);
  for (const auto& [k, v] : o.shape) {
    if (!shape.count(k)) usage_error("unknown shape key '" + k + "'");
    shape[k] = v;
  }
  o.shape = shape;
  return o;
}

struct Stats {
  double median_ms, min_ms, max_ms;
};

Stats summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

class Timer {
 public:
  explicit Timer(bool cuda) : cuda_(cuda) {
#ifdef EAGLE3_WITH_CUDA
    if (cuda_) {
      cudaEventCreate(&start_);
      cudaEventCreate(&stop_);
    }
#endif
  }
  ~Timer() {
#ifdef EAGLE3_WITH_CUDA
    if (cuda_) {
      cudaEventDestroy(start_);
      cudaEventDestroy(stop_);
    }
#endif
  }
  double time_ms(const std::function<void()>& fn) {
#ifdef EAGLE3_WITH_CUDA
    if (cuda_) {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      cudaEventRecord(start_, stream);
      fn();
      cudaEventRecord(stop_, stream);
      cudaEventSynchronize(stop_);
      float ms = 0.f;
      cudaEventElapsedTime(&ms, start_, stop_);
      return ms;
    }
#endif
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  bool cuda_;
#ifdef EAGLE3_WITH_CUDA
  cudaEvent_t start_{}, stop_{};
#endif
};

struct Result {
  std::string op, baseline, shape;
  Stats base, mine;
  double bytes, flops;
};

Result compare(const Options& o, const std::string& op, const std::string& baseline, const std::string& shape,
               double bytes, double flops, const std::function<void()>& base_fn, const std::function<void()>& op_fn) {
  Timer timer(o.device == "cuda");
  for (int i = 0; i < o.warmup; ++i) {
    base_fn();
    op_fn();
  }
  std::vector<double> b, m;
  for (int i = 0; i < o.repeat; ++i) {
    b.push_back(timer.time_ms(base_fn));
    m.push_back(timer.time_ms(op_fn));
  }
  return {op, baseline, shape, summarize(b), summarize(m), bytes, flops};
}

c10::ScalarType dtype_of(const Options& o) {
  return o.dtype == "fp32" ? at::kFloat : (o.dtype == "fp16" ? at::kHalf : at::kBFloat16);
}

c10::OperatorHandle op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

Result bench_fused_aux_fc(const Options& o) {
  const int64_t t = o.shape.at("T"), h = o.shape.at("H"), k = o.shape.at("k");
  const auto opts = at::TensorOptions().dtype(dtype_of(o)).device(o.device);
  const int64_t elem = at::elementSize(dtype_of(o));
  // Rotate weight copies through more memory than a GPU's L2 holds.
  const int64_t w_bytes = h * k * h * elem;
  const int copies = o.device == "cuda" ? static_cast<int>(std::min<int64_t>(8, std::max<int64_t>(1, (256LL << 20) / w_bytes + 1))) : 1;
  std::vector<at::Tensor> weights;
  for (int c = 0; c < copies; ++c) weights.push_back(at::randn({h, k * h}, opts) * (1.0 / std::sqrt(double(k * h))));
  std::vector<at::Tensor> aux;
  for (int s = 0; s < k; ++s) aux.push_back(at::randn({t, h}, opts));
  auto fc = op_handle("eagle3::fused_aux_fc").typed<at::Tensor(at::TensorList, const at::Tensor&, const std::optional<at::Tensor>&)>();
  int i = 0, j = 0;
  std::ostringstream shape;
  shape << "T=" << t << " H=" << h << " k=" << k;
  return compare(o, "fused_aux_fc", "cat+linear", shape.str(),
                 double(w_bytes + (k + 1) * t * h * elem), 2.0 * t * h * k * h,
                 [&] { at::linear(at::cat(aux, -1), weights[i++ % copies]); },
                 [&] { fc.call(aux, weights[j++ % copies], std::nullopt); });
}

// A tree per request: node i's parent is (i - 1) / 2 (a binary tree), mask = ancestors + self.
at::Tensor binary_tree_mask(int64_t b, int64_t n, const std::string& device) {
  auto mask = at::zeros({b, n, n}, at::kBool);
  auto acc = mask.accessor<bool, 3>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t a = i;; a = (a - 1) / 2) {
        acc[r][i][a] = true;
        if (a == 0) break;
      }
  return mask.to(device);
}

Result bench_tree_attention(const Options& o) {
  const int64_t b = o.shape.at("B"), n = o.shape.at("N"), s = o.shape.at("S"), hq = o.shape.at("Hq"),
                hkv = o.shape.at("Hkv"), d = o.shape.at("D"), dv = o.shape.at("Dv"), w = o.shape.at("W");
  const double softcap = static_cast<double>(o.shape.at("softcap"));
  const auto opts = at::TensorOptions().dtype(dtype_of(o)).device(o.device);
  const int64_t elem = at::elementSize(dtype_of(o));
  auto q = at::randn({b, n, hq, d}, opts);
  auto k = at::randn({b, s + n, hkv, d}, opts);
  auto v = at::randn({b, s + n, hkv, dv}, opts);
  auto lens = at::full({b}, s, at::TensorOptions().dtype(at::kLong).device(o.device));
  auto tree = binary_tree_mask(b, n, o.device);
  std::optional<at::Tensor> sinks;
  if (o.shape.at("sinks")) sinks = at::randn({hq}, opts.dtype(at::kFloat));
  // The baseline's dense mask [B, 1, N, S + N] and head-major layouts are built outside the
  // timing; with a window, the binary tree's depths give each node's position.
  auto dense = at::cat({at::ones({b, n, s}, tree.options()), tree}, -1);
  if (w > 0) {
    const auto depth = tree.sum(-1) - 1;                                          // [B, N]
    const auto qpos = depth + s;
    const auto kpos = at::cat({at::arange(s, depth.options()).expand({b, s}), qpos}, -1);  // [B, S + N]
    dense = dense & (kpos.unsqueeze(1) > (qpos - w).unsqueeze(-1));
  }
  dense = dense.unsqueeze(1);
  auto qh = q.transpose(1, 2), kh = k.transpose(1, 2).repeat_interleave(hq / hkv, 1),
       vh = v.transpose(1, 2).repeat_interleave(hq / hkv, 1);
  const double scale = 1.0 / std::sqrt(double(d));
  // SDPA cannot soft-cap or add sinks: then the baseline is the eager form (what Hugging Face
  // runs for Gemma 2 and GPT-OSS), scores materialized.
  const bool eager = softcap > 0 || sinks.has_value();
  auto baseline = [&] {
    if (!eager) {
      at::scaled_dot_product_attention(qh, kh, vh, dense, 0.0, false, scale);
      return;
    }
    auto scores = at::matmul(qh.to(at::kFloat), kh.to(at::kFloat).transpose(-1, -2)) * scale;
    if (softcap > 0) scores = at::tanh(scores / softcap) * softcap;
    scores = scores.masked_fill(dense.logical_not(), -INFINITY);
    if (sinks) scores = at::cat({scores, sinks->view({1, hq, 1, 1}).expand({b, hq, n, 1})}, -1);
    auto probs = at::softmax(scores, -1);
    if (sinks) probs = probs.narrow(-1, 0, s + n);
    at::matmul(probs.to(vh.scalar_type()), vh);
  };
  auto attn = op_handle("eagle3::tree_attention")
                  .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, double, int64_t, double, const std::optional<at::Tensor>&,
                                    const std::optional<at::Tensor>&)>();
  std::ostringstream shape;
  shape << "B=" << b << " N=" << n << " S=" << s << " Hq=" << hq << " Hkv=" << hkv << " D=" << d;
  if (dv != d) shape << " Dv=" << dv;
  if (w > 0) shape << " W=" << w;
  if (softcap > 0) shape << " softcap=" << softcap;
  if (sinks) shape << " sinks";
  // Bytes: the K and V rows a query can see (all of them, or the window) plus q and out.
  const int64_t keys = w > 0 ? std::min(s + n, w + n) : s + n;
  return compare(o, "tree_attention", eager ? "eager+dense mask" : "sdpa+dense mask", shape.str(),
                 double(b * keys * hkv * (d + dv) + b * n * hq * (d + dv)) * elem,
                 2.0 * b * hq * n * keys * (d + dv),
                 baseline, [&] { attn.call(q, k, v, lens, tree, scale, w, softcap, sinks, std::nullopt); });
}

// Chains of N nodes per request (node i's only child is i + 1); the target agrees with the
// first half, so the walk accepts N / 2 tokens.
Result bench_verify(const Options& o) {
  const int64_t b = o.shape.at("B"), n = o.shape.at("N"), vocab = o.shape.at("V");
  const auto lopts = at::TensorOptions().dtype(at::kLong);
  auto candidates = at::randint(vocab, {b, n}, lopts);
  auto retrive_index = at::arange(b * n, lopts).view({b, n});
  auto next_token = at::arange(1, n + 1, lopts).clamp_max(n - 1).expand({b, n}).contiguous();
  next_token.select(1, n - 1).fill_(-1);
  auto next_sibling = at::full({b, n}, -1, lopts);
  auto target = at::roll(candidates, -1, 1).clone();
  target.narrow(1, n / 2, n - n / 2).add_(1).remainder_(vocab);
  auto dev = [&](const at::Tensor& t) { return t.to(o.device); };
  auto c = dev(candidates), ri = dev(retrive_index), nt = dev(next_token), ns = dev(next_sibling), tp = dev(target);
  const auto iopts = at::TensorOptions().dtype(at::kInt).device(o.device);
  auto predicts = at::full({b * n}, -1, iopts), accept_index = at::full({b, n}, -1, iopts), accept_num = at::zeros({b}, iopts);
  auto verify = op_handle("eagle3::verify_tree_greedy").typed<void(at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  std::ostringstream shape;
  shape << "B=" << b << " N=" << n;
  // Naive walk: one request after another, element access through accessors, on the CPU.
  auto naive = [&] {
    auto cc = candidates.accessor<int64_t, 2>(), nta = next_token.accessor<int64_t, 2>(),
         nsa = next_sibling.accessor<int64_t, 2>(), ta = target.accessor<int64_t, 2>();
    std::vector<int32_t> out(b * n, -1);
    for (int64_t r = 0; r < b; ++r) {
      int64_t cur = 0;
      for (int64_t step = 1; step < n; ++step) {
        int64_t child = nta[r][cur];
        while (child != -1 && cc[r][child] != ta[r][cur]) child = nsa[r][child];
        if (child == -1) break;
        out[r * n + step] = static_cast<int32_t>(r * n + child);
        cur = child;
      }
    }
    return out;
  };
  return compare(o, "verify_tree_greedy", "naive walk (cpu)", shape.str(), double(b * n * 8 * 5), 0.0,
                 [&] { naive(); }, [&] { verify.call(predicts, accept_index, accept_num, c, ri, nt, ns, tp); });
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) out += (ch == '"' || ch == '\\') ? std::string("\\") + ch : std::string(1, ch);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
#ifndef EAGLE3_WITH_CUDA
  if (o.device == "cuda") usage_error("this build has no CUDA kernels");
#endif
  std::vector<Result> results;
  try {
    if (o.op == "all" || o.op == "fused_aux_fc") results.push_back(bench_fused_aux_fc(o));
    if (o.op == "all" || o.op == "tree_attention") results.push_back(bench_tree_attention(o));
    if (o.op == "all" || o.op == "verify") results.push_back(bench_verify(o));
  } catch (const std::exception& e) {
    std::cerr << "eagle3_bench: " << e.what() << "\n";
    return 1;
  }
  std::printf("%-20s %-18s %-40s %12s %12s %8s %9s %10s\n", "op", "baseline", "shape", "baseline ms", "op ms",
              "speedup", "GB/s", "GFLOP/s");
  for (const auto& r : results) {
    std::printf("%-20s %-18s %-40s %12.4f %12.4f %7.2fx %9.1f %10.1f\n", r.op.c_str(), r.baseline.c_str(),
                r.shape.c_str(), r.base.median_ms, r.mine.median_ms, r.base.median_ms / r.mine.median_ms,
                r.bytes / r.mine.median_ms / 1e6, r.flops / r.mine.median_ms / 1e6);
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) {
      std::cerr << "eagle3_bench: cannot write " << o.json << "\n";
      return 1;
    }
    f << "{\"benchmark\": \"eagle3_bench\", \"device\": \"" << o.device << "\", \"preset\": \"" << o.preset
      << "\", \"dtype\": \"" << o.dtype << "\", \"repeat\": " << o.repeat << ", \"results\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      f << (i ? ", " : "") << "{\"op\": \"" << json_escape(r.op) << "\", \"baseline\": \"" << json_escape(r.baseline)
        << "\", \"shape\": \"" << r.shape << "\", \"baseline_ms\": {\"median\": " << r.base.median_ms
        << ", \"min\": " << r.base.min_ms << ", \"max\": " << r.base.max_ms << "}, \"op_ms\": {\"median\": "
        << r.mine.median_ms << ", \"min\": " << r.mine.min_ms << ", \"max\": " << r.mine.max_ms
        << "}, \"speedup\": " << r.base.median_ms / r.mine.median_ms << ", \"op_GBps\": "
        << r.bytes / r.mine.median_ms / 1e6 << ", \"op_GFLOPs\": " << r.flops / r.mine.median_ms / 1e6 << "}";
    }
    f << "]}\n";
  }
  return 0;
}
