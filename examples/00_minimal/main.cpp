// Example 00: the smallest parallax program, the one README.md shows. A
// sparse embedding and a dense weight trained data-parallel by every rank on
// its share of the batch, under arch::Hybrid: the weight's gradient is
// all-reduced, the embedding's rows are pulled from and pushed to the ranks
// that own them, then Adagrad updates both.
//
//   mpiexec -n 4 build/host/examples/00_minimal
//
// What it shows: a Context (one MPI process per rank), Variables whose
// sparsity picks their communication, a Trainer of an architecture and an
// optimizer, lookup() of rows, gradients written into the variables, step().
// Each rank exits with status 0 when its last loss is below 0.05.
//
// What it leaves out, and where to find it:
//   * a model with layers and a matrix library, data readers, a command line
//     and --arch chosen at run time (px::with_arch): 01_word_lm, 02_ctr
//     (multi-hot bags), 03_dense_mlp (dense only);
//   * device memory and the CUDA engines: 04_cuda_kernels;
//   * overlap of communication with compute (ready(), prefetch()):
//     01_word_lm and docs/tutorial.md, section 10;
//   * learning-rate schedules, clipping, metrics, checkpoints:
//     docs/tutorial.md, section 8, and docs/design.md;
//   * pipeline stages: 05_pipeline.
// example-begin minimal
#include <parallax/parallax.hpp>

#include <cstdio>
#include <vector>

namespace px = parallax;

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);  // MPI; one process per rank (mpiexec -n 4 ...)

  // The sparsity is part of the type: it picks the communication.
  px::Variable<px::Sparse, float> emb(ctx, "emb", {100000, 16}, px::init::Uniform{-0.1f, 0.1f, 1});
  px::Variable<px::Dense, float> w(ctx, "w", {16, 1}, px::init::Constant{0.0});
  px::Trainer<px::arch::Hybrid, px::optim::Adagrad> trainer(ctx, px::optim::Adagrad{0.1f}, emb, w);

  float loss = 0;
  for (int step = 0; step < 200; ++step) {
    // This rank's share of the global batch: 4 ids, target 1 for even ids.
    std::vector<px::index_t> ids;
    for (int i = 0; i < 4; ++i) ids.push_back((step * 37 + ctx.rank() * 4 + i) % 64 * 1500);

    auto x = trainer.lookup(emb, ids.data(), ids.size());  // rows pulled from their owners
    const float* wv = w.value().data();
    std::vector<float> d_rows(ids.size() * 16);
    loss = 0;
    for (std::size_t r = 0; r < ids.size(); ++r) {  // your kernels go here
      float y = 0;
      for (int c = 0; c < 16; ++c) y += x.data[r * 16 + c] * wv[c];
      const float err = y - (ids[r] % 2 == 0 ? 1.0f : 0.0f);
      loss += err * err / ids.size();
      for (int c = 0; c < 16; ++c) {
        w.grad()[c] += 2 * err * x.data[r * 16 + c] / ids.size();
        d_rows[r * 16 + c] = 2 * err * wv[c] / ids.size();
      }
    }
    emb.grad().add(ids.data(), d_rows.data(), ids.size());
    trainer.step();  // w: all-reduced; emb: rows pushed to their owners; then Adagrad
  }
  if (ctx.rank() == 0) std::printf("last loss on rank 0: %.4f\n", loss);
  return loss < 0.05f ? 0 : 1;
}
// example-end
