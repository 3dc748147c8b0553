// Example 04: example 01's word language model with its forward and backward
// passes written as plain __global__ kernels, the way a single-GPU training
// loop is usually written by hand, and parallax doing the distributed part:
// the variables live in px::CudaSpace, the trainer uses a CUDA engine, and
// the kernels write gradients into device buffers that the trainer reads.
//
//   mpiexec -n 2 build/cuda/examples/04_cuda_kernels --arch hybrid
//
// CUDA builds only. The trainer's engine is px::engine::MpiStaged (device
// memory through pinned host buffers, any number of ranks per GPU; with one
// GPU per rank px::engine::Nccl is the faster choice). Kernels run on the
// engine's stream, so they are ordered with the trainer's own work. The
// kernels are kept plain to show the pattern, matrix products included; a
// model trained for speed runs those as cuBLAS calls on the same stream, as
// example 01's CUDA twin does (examples/common/gemm.hpp).
#include "01_word_lm/model.hpp"  // Config, Batch, Candidates, Windows: host-side data only
#include "common/options.hpp"
#include "common/progress.hpp"
#include "common/synthetic.hpp"

#include <parallax/parallax.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace px = parallax;
namespace lm = examples::word_lm;

namespace cuda_kernels {

// ---------------------------------------------------------------- kernels
// One thread per output element unless said otherwise; row-major matrices.

constexpr int kThreads = 256;
unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

/// h[r, o] = tanh(x[r, :] . W[:, o] + b[o])
__global__ void hidden_forward(const float* x, const float* w, const float* b, float* h, int rows, int in, int out) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= rows * out) return;
  const int r = e / out, o = e % out;
  float s = b[o];
  for (int i = 0; i < in; ++i) s += x[r * in + i] * w[i * out + o];
  h[e] = tanhf(s);
}

/// z[b, 0]: the true word's logit; z[b, 1 + j]: sampled word j's; minus log Q;
/// accidental hits (a sampled word equal to b's label) get -1e30. Candidate
/// rows are found through sampled_row and label_row (lm::Candidates).
__global__ void sampled_logits(const float* h, const float* w, const float* log_q, const px::index_t* sampled_row,
                               const px::index_t* label_row, float* z, int rows, int dim, int sampled) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  const int width = 1 + sampled;
  if (e >= rows * width) return;
  const int b = e / width, k = e % width;
  const px::index_t row = k == 0 ? label_row[b] : sampled_row[k - 1];
  if (k > 0 && row == label_row[b]) {
    z[e] = -1e30f;
    return;
  }
  const float* wr = w + static_cast<std::size_t>(row) * (dim + 1);
  float s = wr[dim] - log_q[row];
  for (int c = 0; c < dim; ++c) s += h[b * dim + c] * wr[c];
  z[e] = s;
}

/// One block per row: softmax cross-entropy with the label in column 0. The
/// row becomes the gradient of the mean loss; loss[row] its loss.
__global__ void softmax_cross_entropy(float* z, float* loss, int width, float inv_rows) {
  __shared__ float scratch[kThreads];
  float* row = z + static_cast<std::size_t>(blockIdx.x) * width;
  float top = -INFINITY;
  for (int c = threadIdx.x; c < width; c += blockDim.x) top = fmaxf(top, row[c]);
  scratch[threadIdx.x] = top;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
    __syncthreads();
  }
  top = scratch[0];
  __syncthreads();
  float sum = 0.f;
  for (int c = threadIdx.x; c < width; c += blockDim.x) sum += expf(row[c] - top);
  scratch[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
    __syncthreads();
  }
  sum = scratch[0];
  if (threadIdx.x == 0) loss[blockIdx.x] = logf(sum) - (row[0] - top);
  __syncthreads();  // row[0] is read above before it is overwritten below
  for (int c = threadIdx.x; c < width; c += blockDim.x)
    row[c] = (expf(row[c] - top) / sum - (c == 0 ? 1.f : 0.f)) * inv_rows;
}

/// Gradient of candidate row r, column c (c == dim: the bias): each example
/// b adds dz[b, column[r]] if r is a sampled word and dz[b, 0] if r is its label.
__global__ void candidate_grad(const float* h, const float* dz, const std::int32_t* column, const px::index_t* label_row,
                               float* g, int candidates, int rows, int dim, int sampled) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= candidates * (dim + 1)) return;
  const int r = e / (dim + 1), c = e % (dim + 1), width = 1 + sampled, col = column[r];
  float s = 0.f;
  for (int b = 0; b < rows; ++b) {
    const float d = (col ? dz[b * width + col] : 0.f) + (label_row[b] == r ? dz[b * width] : 0.f);
    s += d * (c < dim ? h[b * dim + c] : 1.f);
  }
  g[e] = s;
}

/// Gradient of the hidden layer's pre-activation: (sum_k dz[b, k] w[row_k, c]) * (1 - h^2).
__global__ void hidden_grad(const float* w, const float* dz, const px::index_t* sampled_row, const px::index_t* label_row,
                            const float* h, float* dpre, int rows, int dim, int sampled) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= rows * dim) return;
  const int b = e / dim, c = e % dim, width = 1 + sampled;
  float s = dz[b * width] * w[static_cast<std::size_t>(label_row[b]) * (dim + 1) + c];
  for (int j = 0; j < sampled; ++j)
    s += dz[b * width + 1 + j] * w[static_cast<std::size_t>(sampled_row[j]) * (dim + 1) + c];
  dpre[e] = s * (1.f - h[e] * h[e]);
}

/// dW[i, o] = sum_r x[r, i] dpre[r, o]; row i == in is the bias gradient.
__global__ void weight_grad(const float* x, const float* dpre, float* dw, float* db, int rows, int in, int out) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (in + 1) * out) return;
  const int i = e / out, o = e % out;
  float s = 0.f;
  for (int r = 0; r < rows; ++r) s += (i < in ? x[r * in + i] : 1.f) * dpre[r * out + o];
  if (i < in) dw[e] = s;
  else db[o] = s;
}

/// dx[r, i] = dpre[r, :] . W[i, :]
__global__ void input_grad(const float* dpre, const float* w, float* dx, int rows, int in, int out) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= rows * in) return;
  const int r = e / in, i = e % in;
  float s = 0.f;
  for (int o = 0; o < out; ++o) s += dpre[r * out + o] * w[i * out + o];
  dx[e] = s;
}

}  // namespace cuda_kernels

namespace {

using namespace cuda_kernels;

// ---------------------------------------------------------------- training

struct Args {
  examples::CommonOptions common;
  lm::Config model;
  std::size_t tokens = 1000000;
  double pass_ratio = 0.8;
};

#if defined(PARALLAX_EXAMPLES_CUDA_ENGINE) && PARALLAX_EXAMPLES_CUDA_ENGINE
using Engine = px::engine::MpiStaged;

/// The model's variables in device memory, and device scratch for one step.
struct Model {
  Model(const px::Context& ctx, const lm::Config& cfg)
      : emb(ctx, "emb", {cfg.vocab, cfg.dim}, px::init::Uniform{-0.1f, 0.1f, cfg.seed}),
        hidden_w(ctx, "hidden_w", {cfg.context * cfg.dim, cfg.dim}, px::init::Glorot{cfg.seed}),
        hidden_b(ctx, "hidden_b", {1, cfg.dim}),
        softmax(ctx, "softmax", {cfg.vocab, cfg.dim + 1}, px::init::Uniform{-0.05f, 0.05f, cfg.seed}) {}

  px::Variable<px::Sparse, float, px::CudaSpace> emb;
  px::Variable<px::Dense, float, px::CudaSpace> hidden_w, hidden_b;
  px::Variable<px::Sparse, float, px::CudaSpace> softmax;
  px::Buffer<px::index_t, px::CudaSpace> context_ids, candidate_ids, sampled_row, label_row;
  px::Buffer<std::int32_t, px::CudaSpace> column;
  px::Buffer<float, px::CudaSpace> log_q, h, logits, loss, dpre, grad_x;
  /// --overlap on: the next batch's lookups in flight (Trainer::prefetch),
  /// its ids on the device and, to check the next step is given that batch,
  /// on the host.
  bool ahead_held = false;
  px::Prefetched<px::Variable<px::Sparse, float, px::CudaSpace>> ahead;
  px::Buffer<px::index_t, px::CudaSpace> ahead_context_ids, ahead_candidate_ids;
  std::vector<px::index_t> ahead_context_host, ahead_candidate_host;
};

/// One step on this rank's rows; returns their mean loss. Collective.
/// Given the next step's batch (`next`, `next_cand`, with --overlap on), its
/// lookups start while this batch computes and the next step takes their rows.
template <class Trainer>
double train_step(Trainer& trainer, Model& m, const lm::Config& cfg, const lm::Batch& batch, const lm::Candidates& cand,
                  bool overlap, const lm::Batch* next = nullptr, const lm::Candidates* next_cand = nullptr) {
  const int rows = static_cast<int>(batch.rows), dim = static_cast<int>(cfg.dim), s = static_cast<int>(cand.sampled);
  const int in = static_cast<int>(cfg.context) * dim, n_cand = static_cast<int>(cand.ids.size()), width = 1 + s;
  const cudaStream_t stream = trainer.engine().exec().stream();
  // --overlap on: a gradient is marked ready (trainer.ready) once the kernel
  // that writes it has finished, so the trainer moves it while the later
  // kernels run.
  auto ready = [&](auto&... vars) {
    if (!overlap) return;
    PARALLAX_CUDA_CHECK(cudaStreamSynchronize(stream));
    trainer.ready(vars...);
  };

  // example-begin cuda_step
  const bool prefetched = m.ahead_held;
  if (prefetched) {
    if (batch.context != m.ahead_context_host || cand.ids != m.ahead_candidate_host)
      throw std::invalid_argument("cuda_kernels: this batch is not the `next` batch the step before prefetched");
    std::swap(m.context_ids, m.ahead_context_ids);  // its ids are on the device already
    std::swap(m.candidate_ids, m.ahead_candidate_ids);
  } else {
    m.context_ids.assign_from_host(batch.context.data(), batch.context.size());
    m.candidate_ids.assign_from_host(cand.ids.data(), cand.ids.size());
  }
  m.log_q.assign_from_host(cand.log_q.data(), cand.log_q.size());
  m.sampled_row.assign_from_host(cand.sampled_row.data(), cand.sampled_row.size());
  m.label_row.assign_from_host(cand.label_row.data(), cand.label_row.size());
  m.column.assign_from_host(cand.column.data(), cand.column.size());
  // Device rows of both tables, looked up in one round:
  // rows x (context * dim) and candidates x (dim + 1).
  m.ahead_held = false;
  const auto looked_up = prefetched ? trainer.rows(m.ahead)
                                    : trainer.lookup({px::Lookup{m.emb, m.context_ids}, px::Lookup{m.softmax, m.candidate_ids}});
  if (overlap && next && next_cand) {  // the next batch's lookups go on while this one computes
    m.ahead_context_ids.assign_from_host(next->context.data(), next->context.size());
    m.ahead_candidate_ids.assign_from_host(next_cand->ids.data(), next_cand->ids.size());
    m.ahead_context_host = next->context;
    m.ahead_candidate_host = next_cand->ids;
    m.ahead = trainer.prefetch({px::Lookup{m.emb, m.ahead_context_ids}, px::Lookup{m.softmax, m.ahead_candidate_ids}});
    m.ahead_held = true;
  }
  const auto& x = looked_up[0];
  const auto& w = looked_up[1];
  m.h.resize_discard(static_cast<std::size_t>(rows) * dim);
  m.logits.resize_discard(static_cast<std::size_t>(rows) * width);
  m.loss.resize_discard(static_cast<std::size_t>(rows));
  m.dpre.resize_discard(static_cast<std::size_t>(rows) * dim);
  m.grad_x.resize_discard(static_cast<std::size_t>(rows) * in);
  // The softmax rows' gradient is written straight into the variable's sparse gradient.
  const auto grad_w = m.softmax.grad().add_rows(cand.ids.size());
  PARALLAX_CUDA_CHECK(cudaMemcpyAsync(grad_w.ids, m.candidate_ids.data(), cand.ids.size() * sizeof(px::index_t),
                                      cudaMemcpyDeviceToDevice, stream));

  hidden_forward<<<blocks_for(m.h.size()), kThreads, 0, stream>>>(x.data, m.hidden_w.value().data(),
                                                                   m.hidden_b.value().data(), m.h.data(), rows, in, dim);
  sampled_logits<<<blocks_for(m.logits.size()), kThreads, 0, stream>>>(
      m.h.data(), w.data, m.log_q.data(), m.sampled_row.data(), m.label_row.data(), m.logits.data(), rows, dim, s);
  softmax_cross_entropy<<<rows, kThreads, 0, stream>>>(m.logits.data(), m.loss.data(), width, 1.f / rows);
  candidate_grad<<<blocks_for(grad_w.values.size()), kThreads, 0, stream>>>(
      m.h.data(), m.logits.data(), m.column.data(), m.label_row.data(), grad_w.values.data, n_cand, rows, dim, s);
  ready(m.softmax);
  hidden_grad<<<blocks_for(m.dpre.size()), kThreads, 0, stream>>>(
      w.data, m.logits.data(), m.sampled_row.data(), m.label_row.data(), m.h.data(), m.dpre.data(), rows, dim, s);
  weight_grad<<<blocks_for(static_cast<std::size_t>(in + 1) * dim), kThreads, 0, stream>>>(
      x.data, m.dpre.data(), m.hidden_w.grad().data(), m.hidden_b.grad().data(), rows, in, dim);
  ready(m.hidden_w, m.hidden_b);
  input_grad<<<blocks_for(m.grad_x.size()), kThreads, 0, stream>>>(m.dpre.data(), m.hidden_w.value().data(),
                                                                   m.grad_x.data(), rows, in, dim);
  PARALLAX_CUDA_CHECK(cudaGetLastError());
  PARALLAX_CUDA_CHECK(cudaStreamSynchronize(stream));

  // The embedding's gradient as (device ids, device rows); the dense ones were written in place.
  m.emb.grad().add(m.context_ids.data(), m.grad_x.data(), batch.context.size());
  ready(m.emb);
  trainer.step();
  // example-end

  const std::vector<float> loss = m.loss.to_host();
  double sum = 0;
  for (float l : loss) sum += l;
  return sum / rows;
}

template <class Arch>
int train(px::Context& ctx, const Args& a, const std::vector<std::int32_t>& tokens) {
  const auto& o = a.common;
  const lm::Config& cfg = a.model;
  const examples::Shard shard(o, ctx);  // --batch words per rank
  const lm::Windows windows(tokens, cfg.context, o.seed);
  const examples::LogUniformSampler sampler(cfg.vocab);

  Model m(ctx, cfg);
  px::Trainer<Arch, px::optim::Adagrad, Engine> trainer(ctx, o.trainer_options(), px::optim::Adagrad{o.lr}, m.emb,
                                                        m.hidden_w, m.hidden_b, m.softmax);
  examples::Progress progress(trainer, shard.global, o.log_every, "words", o.warmup);
  auto inputs = [&](std::uint64_t step) {
    lm::Batch b = windows.training(step, shard.global, shard.first, shard.batch);
    lm::Candidates c = lm::make_candidates(sampler, cfg.sampled, o.seed, step, b);
    return std::make_pair(std::move(b), std::move(c));
  };
  std::optional<std::pair<lm::Batch, lm::Candidates>> next;  // --overlap on: the inputs a step ahead
  for (std::uint64_t step = 0; step < o.steps; ++step) {
    const auto [batch, cand] = next ? std::move(*next) : inputs(step);
    next.reset();
    if (o.overlapped() && step + 1 < o.steps) next = inputs(step + 1);
    progress.record(train_step(trainer, m, cfg, batch, cand, o.overlapped(), next ? &next->first : nullptr,
                               next ? &next->second : nullptr));
  }
  const examples::Summary s = progress.finish();
  if (ctx.is_root())
    std::printf("result: example=cuda_kernels arch=%s ranks=%d final_loss=%.7f final_loss_hex=%a samples_per_s=%.1f bytes_per_step=%.0f\n",
                Arch::name, s.ranks, s.final_loss, s.final_loss, s.samples_per_s, s.bytes_per_step);
  const double threshold = a.pass_ratio * s.first_loss;
  char why[160];
  std::snprintf(why, sizeof why, "check: final loss %.4f %s threshold %.4f (%.2f x the step-1 loss)", s.final_loss,
                s.final_loss < threshold ? "<" : ">=", threshold, a.pass_ratio);
  return examples::verdict(ctx, std::isfinite(s.final_loss) && s.final_loss < threshold, why);
}
#endif  // PARALLAX_EXAMPLES_CUDA_ENGINE

const char* const about =
    "04_cuda_kernels: example 01's word language model with hand-written __global__ kernels, variables\n"
    "in device memory (px::CudaSpace) and a CUDA engine (px::engine::MpiStaged). Exits 0 when it learned.";

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.common.steps = 300;
  a.common.lr = 0.5f;
  a.common.log_every = 50;
  examples::po::options_description desc("options");
  examples::add_common_options(desc, a.common);
  desc.add_options()
    ("vocab", examples::po::value(&a.model.vocab)->default_value(a.model.vocab), "vocabulary")
    ("dim", examples::po::value(&a.model.dim)->default_value(a.model.dim), "embedding and hidden width")
    ("sampled", examples::po::value(&a.model.sampled)->default_value(a.model.sampled), "sampled classes per step")
    ("tokens", examples::po::value(&a.tokens)->default_value(a.tokens), "length of the synthetic corpus");
  const auto cl = examples::parse_command_line(argc, argv, desc);
  px::Context ctx(argc, argv, cl.ok() ? a.common.context() : px::ContextOptions{});
  a.model.seed = a.common.seed;
  std::string problem = cl.ok() ? examples::check_common(a.common) : "";
  if (problem.empty() && cl.ok() && (a.model.sampled >= a.model.vocab || a.model.dim == 0))
    problem = "--sampled must be less than --vocab, and --dim at least 1";
  if (const int code = examples::report_command_line(cl, problem, ctx, about, desc); code >= 0) return code;
#if defined(PARALLAX_EXAMPLES_CUDA_ENGINE) && PARALLAX_EXAMPLES_CUDA_ENGINE
  const std::vector<std::int32_t> tokens =
      examples::SyntheticCorpus{a.model.vocab, a.tokens, 1.0, 0.5, a.common.seed}.make();
  return px::with_arch(a.common.arch, [&](auto arch) { return train<decltype(arch)>(ctx, a, tokens); });
#else
  if (ctx.is_root())
    std::printf("04_cuda_kernels was built without px::engine::MpiStaged (not found in this parallax's headers when "
                "configured); it cannot train.\nFailed\n");
  return 1;
#endif
}
