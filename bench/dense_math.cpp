// The examples' dense math against the machine's SGEMM: every matrix
// product the examples make in a step, at their default per-rank shapes,
// through examples::gemm as the example calls it (its layouts, transposes
// and leading dimensions), beside cblas_sgemm of the same m, n and k on
// packed operands without transposes (the machine's SGEMM at that shape),
// the hand-written functors the products replaced, and one large square
// SGEMM (the machine's SGEMM rate where it is highest).
//
//   build/host/bench/bench_dense_math --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//   bench/dense_math_report.py out.json     # docs/benchmarks.md's tables ("Dense math")
//
// One process, one thread (OpenMP and the BLAS), no MPI. Benchmarks:
//   gemm/<model>/<product>     examples::gemm, as the model calls it
//   sgemm/<model>/<product>    cblas_sgemm, packed, no transposes, the same m n k
//   functor/<model>/<product>  the functor the product replaced (tests/reference_*.hpp)
//   layer/word_lm/blas|functor the sampled softmax's forward and backward, whole:
//                              SampledSoftmax against the functors
//   sgemm/square/1024          1024^3
// Counter `flops`: 2 m n k per second of the thread's CPU time (on a shared
// machine, not the time it waited for a core), m n k as each variant computes them
// (the functor picks the true and sampled words' logits, 1 + sampled per
// row, where the product computes every candidate's).
// Shapes: word_lm at the demo's (vocabulary 800,000, width 128, 8,192
// sampled, context 2, 1,024 words), its candidates from the example's own
// sampler at step 0; ctr's MLPs at 2,048 samples; dense_mlp's at 1,024.
#include "../examples/01_word_lm/model.hpp"
#include "../examples/01_word_lm/tests/reference_kernels.hpp"
#include "../examples/02_ctr/model.hpp"
#include "../examples/03_dense_mlp/model.hpp"
#include "../examples/common/gemm.hpp"
#include "../examples/common/synthetic.hpp"
#include "../examples/common/tests/reference_layers.hpp"

#include <parallax/parallax.hpp>

#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace px = parallax;
namespace lm = examples::word_lm;
using examples::Op;

namespace {

const px::Exec<px::HostSpace> host;

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["flops"] = benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

/// One product of a model's step: C (m x n) = op(A) op(B), row-major, with
/// the leading dimensions the model gives it.
struct Product {
  std::string model, name;
  Op op_a, op_b;
  std::size_t m, n, k, lda, ldb, ldc;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::size_t a_rows() const { return op_a == Op::none ? m : k; }
  std::size_t b_rows() const { return op_b == Op::none ? k : n; }
};

/// A dense layer's three products at `rows` rows (DenseLayer: forward,
/// backward's weight and input gradients).
void dense_layer(std::vector<Product>& out, const std::string& model, const std::string& layer, std::size_t rows,
                 std::size_t in, std::size_t o, bool input_grad = true) {
  out.push_back({model, layer + "_forward", Op::none, Op::none, rows, o, in, in, o, o});
  out.push_back({model, layer + "_weight_grad", Op::transpose, Op::none, in, o, rows, in, o, o});
  if (input_grad) out.push_back({model, layer + "_input_grad", Op::none, Op::transpose, rows, in, o, o, o, in});
}

/// word_lm's inputs at the demo's shape: a step's batch and candidates.
struct WordLmStep {
  lm::Config cfg;
  std::size_t rows = 1024;
  lm::Batch batch;
  lm::Candidates cand;
  WordLmStep() {
    cfg.vocab = 800000;
    cfg.dim = 128;
    cfg.sampled = 8192;
    cfg.context = 2;
    const auto tokens = examples::SyntheticCorpus{cfg.vocab, 2000000, 1.0, 0.5, 1}.make();
    const lm::Windows windows(tokens, cfg.context, 1);
    batch = windows.training(0, rows, 0, rows);
    cand = lm::make_candidates(examples::LogUniformSampler(cfg.vocab), cfg.sampled, 1, 0, batch);
  }
  static const WordLmStep& get() {
    static const WordLmStep s;
    return s;
  }
};

std::vector<Product> products() {
  std::vector<Product> p;
  const auto& lm_step = WordLmStep::get();
  const std::size_t b = lm_step.rows, d = lm_step.cfg.dim, c = lm_step.cand.ids.size();
  dense_layer(p, "word_lm", "hidden", b, lm_step.cfg.context * d, d);
  p.push_back({"word_lm", "logits", Op::none, Op::transpose, b, c, d + 1, d + 1, d + 1, c});
  p.push_back({"word_lm", "candidate_grad", Op::transpose, Op::none, c, d + 1, b, c, d + 1, d + 1});
  p.push_back({"word_lm", "hidden_grad", Op::none, Op::none, b, d, c, c, d + 1, d});
  const examples::ctr::Config ctr;
  const std::size_t width = (examples::ctr::features + 1) * ctr.dim;
  dense_layer(p, "ctr", "bottom1", 2048, examples::ctr::dense_features, ctr.bottom, false);
  dense_layer(p, "ctr", "bottom2", 2048, ctr.bottom, ctr.dim);
  dense_layer(p, "ctr", "top1", 2048, width, ctr.top);
  dense_layer(p, "ctr", "top2", 2048, ctr.top, 1);
  const examples::dense_mlp::Config mlp;
  dense_layer(p, "dense_mlp", "layer1", 1024, mlp.inputs, mlp.hidden, false);
  dense_layer(p, "dense_mlp", "layer2", 1024, mlp.hidden, mlp.hidden);
  dense_layer(p, "dense_mlp", "layer3", 1024, mlp.hidden, mlp.classes);
  return p;
}

void gemm_as_called(benchmark::State& state, const Product& p) {
  const auto a = examples::uniform_floats(p.a_rows() * p.lda, 1), bm = examples::uniform_floats(p.b_rows() * p.ldb, 2);
  std::vector<float> c(p.m * p.ldc);
  for (auto _ : state) {
    examples::gemm(host, p.op_a, p.op_b, p.m, p.n, p.k, 1.0f, a.data(), p.lda, bm.data(), p.ldb, 0.0f, c.data(), p.ldc);
    benchmark::ClobberMemory();
  }
  set_flops(state, p.flops());
  state.counters["m"] = static_cast<double>(p.m);
  state.counters["n"] = static_cast<double>(p.n);
  state.counters["k"] = static_cast<double>(p.k);
}

void sgemm_packed(benchmark::State& state, std::size_t m, std::size_t n, std::size_t k) {
  const auto a = examples::uniform_floats(m * k, 1), b = examples::uniform_floats(k * n, 2);
  std::vector<float> c(m * n);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mi, ni, ki, 1.0f, a.data(), ki, b.data(), ni, 0.0f, c.data(), ni);
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
}

// ---------------------------------------------------------------- the functors the products replaced

/// word_lm's sampled softmax at the demo's shape, random values in the
/// step's real layout: what both the functors and SampledSoftmax take.
struct SoftmaxInputs {
  std::size_t rows, dim, sampled, n;
  std::vector<float> h, w, dz, log_q;
  const lm::Candidates* cand;
  const lm::Batch* batch;
  SoftmaxInputs() {
    const auto& s = WordLmStep::get();
    rows = s.rows;
    dim = s.cfg.dim;
    sampled = s.cand.sampled;
    n = s.cand.ids.size();
    cand = &s.cand;
    batch = &s.batch;
    h = examples::uniform_floats(rows * dim, 3);
    w = examples::uniform_floats(n * (dim + 1), 4);
    dz = examples::uniform_floats(rows * (1 + sampled), 5);
    log_q = s.cand.log_q;
  }
  lm::SampledSoftmax<px::HostSpace>::Inputs inputs() const {
    return {log_q.data(), cand->sampled_row.data(), cand->label_row.data(), cand->column.data(), n, sampled};
  }
  static const SoftmaxInputs& get() {
    static const SoftmaxInputs s;
    return s;
  }
};

void functor_logits(benchmark::State& state) {
  const auto& s = SoftmaxInputs::get();
  std::vector<float> z(s.rows * (1 + s.sampled));
  for (auto _ : state) {
    px::for_each(host, z.size(),
                 lm::reference::SampledLogits<float>{s.h.data(), s.w.data(), s.log_q.data(), s.cand->sampled_row.data(),
                                                     s.cand->label_row.data(), z.data(), s.rows, s.dim, s.sampled},
                 px::Cost{s.dim});
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * static_cast<double>(s.rows * (1 + s.sampled) * (s.dim + 1)));
}

/// The sampled part of dz as the functors take it (candidates x rows).
std::vector<float> functor_d(const SoftmaxInputs& s) {
  std::vector<float> d(s.n * s.rows);
  px::for_each(host, d.size(), lm::reference::SampledGrad<float>{s.dz.data(), s.cand->column.data(), d.data(), s.rows, s.sampled});
  return d;
}

void functor_candidate_grad(benchmark::State& state) {
  const auto& s = SoftmaxInputs::get();
  const std::vector<float> d = functor_d(s);
  std::vector<float> g(s.n * (s.dim + 1));
  for (auto _ : state) {
    px::for_each(host, s.n,
                 lm::reference::CandidateGrad<float>{s.h.data(), d.data(), s.dz.data(), s.cand->label_row.data(), g.data(),
                                                     s.rows, s.dim, s.sampled},
                 px::Cost{s.rows * s.dim});
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * static_cast<double>(s.n * (s.dim + 1) * s.rows));
}

void functor_hidden_grad(benchmark::State& state) {
  const auto& s = SoftmaxInputs::get();
  const std::vector<float> d = functor_d(s);
  std::vector<float> dh(s.rows * s.dim);
  using HG = lm::reference::HiddenGrad<float>;
  for (auto _ : state) {
    px::for_each(host, HG::calls(s.rows, s.dim),
                 HG{s.w.data(), d.data(), s.dz.data(), s.cand->label_row.data(), dh.data(), s.rows, s.dim, s.sampled, s.n},
                 px::Cost{s.n * HG::work});
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * static_cast<double>(s.rows * s.dim * s.n));
}

/// The whole sampled softmax, forward and backward (the softmax between
/// them left out): the functors as the example ran them, or SampledSoftmax.
void layer_functor(benchmark::State& state) {
  const auto& s = SoftmaxInputs::get();
  std::vector<float> z(s.rows * (1 + s.sampled)), d(s.n * s.rows), g(s.n * (s.dim + 1)), dh(s.rows * s.dim);
  using HG = lm::reference::HiddenGrad<float>;
  for (auto _ : state) {
    px::for_each(host, z.size(),
                 lm::reference::SampledLogits<float>{s.h.data(), s.w.data(), s.log_q.data(), s.cand->sampled_row.data(),
                                                     s.cand->label_row.data(), z.data(), s.rows, s.dim, s.sampled},
                 px::Cost{s.dim});
    std::copy(s.dz.begin(), s.dz.end(), z.begin());
    px::for_each(host, d.size(), lm::reference::SampledGrad<float>{z.data(), s.cand->column.data(), d.data(), s.rows, s.sampled});
    px::for_each(host, s.n,
                 lm::reference::CandidateGrad<float>{s.h.data(), d.data(), z.data(), s.cand->label_row.data(), g.data(),
                                                     s.rows, s.dim, s.sampled},
                 px::Cost{s.rows * s.dim});
    px::for_each(host, HG::calls(s.rows, s.dim),
                 HG{s.w.data(), d.data(), z.data(), s.cand->label_row.data(), dh.data(), s.rows, s.dim, s.sampled, s.n},
                 px::Cost{s.n * HG::work});
    benchmark::ClobberMemory();
  }
}
void layer_blas(benchmark::State& state) {
  const auto& s = SoftmaxInputs::get();
  lm::SampledSoftmax<px::HostSpace> layer;
  std::vector<float> g(s.n * (s.dim + 1)), dh(s.rows * s.dim);
  for (auto _ : state) {
    float* z = layer.logits(host, s.h.data(), s.w.data(), s.rows, s.dim, s.inputs());
    std::copy(s.dz.begin(), s.dz.end(), z);
    layer.backward(host, s.w.data(), s.inputs(), g.data(), dh.data());
    benchmark::ClobberMemory();
  }
}

/// A dense layer's three functors (tests/reference_layers.hpp) at a
/// Product's shape, named by its forward product.
void functor_dense(benchmark::State& state, const Product& p, int which) {
  namespace ref = examples::reference;
  // which: 0 forward (m rows, k in, n out), 1 weight grad (k rows, m in, n out), 2 input grad (m rows, n in, k out)
  const std::size_t rows = which == 1 ? p.k : p.m, in = which == 0 ? p.k : which == 1 ? p.m : p.n,
                    out = which == 0 ? p.n : which == 1 ? p.n : p.k;
  const auto x = examples::uniform_floats(rows * in, 1), w = examples::uniform_floats(in * out, 2), dy = examples::uniform_floats(rows * out, 3);
  std::vector<float> y(rows * out), dw(in * out), db(out), dx(rows * in), b(out);
  for (auto _ : state) {
    if (which == 0)
      px::for_each(host, rows, ref::DenseForward<float>{x.data(), w.data(), b.data(), y.data(), in, out, examples::Activation::none},
                   px::Cost{in * out});
    else if (which == 1)
      px::for_each(host, in + 1, ref::DenseBackwardWeight<float>{x.data(), dy.data(), dw.data(), db.data(), rows, in, out},
                   px::Cost{rows * out});
    else
      px::for_each(host, rows * in, ref::DenseBackwardInput<float>{dy.data(), w.data(), dx.data(), in, out}, px::Cost{out});
    benchmark::ClobberMemory();
  }
  set_flops(state, p.flops());
}

}  // namespace

int main(int argc, char** argv) {
  omp_set_num_threads(1);  // one thread: the single-thread SGEMM rate is the bar
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("gemm", examples::gemm_description<px::HostSpace>());
  for (const Product& p : products()) {
    const std::string id = p.model + "/" + p.name;
    benchmark::RegisterBenchmark(("gemm/" + id).c_str(), [p](benchmark::State& st) { gemm_as_called(st, p); })
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("sgemm/" + id).c_str(), [p](benchmark::State& st) { sgemm_packed(st, p.m, p.n, p.k); })
        ->Unit(benchmark::kMicrosecond);
    const int which = p.name.find("_forward") != std::string::npos       ? 0
                      : p.name.find("_weight_grad") != std::string::npos ? 1
                      : p.name.find("_input_grad") != std::string::npos  ? 2
                                                                        : -1;
    if (which >= 0)
      benchmark::RegisterBenchmark(("functor/" + id).c_str(), [p, which](benchmark::State& st) { functor_dense(st, p, which); })
          ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("functor/word_lm/logits", functor_logits)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("functor/word_lm/candidate_grad", functor_candidate_grad)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("functor/word_lm/hidden_grad", functor_hidden_grad)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("layer/word_lm/functor", layer_functor)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("layer/word_lm/blas", layer_blas)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("sgemm/square/1024", [](benchmark::State& st) { sgemm_packed(st, 1024, 1024, 1024); })
      ->Unit(benchmark::kMicrosecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
