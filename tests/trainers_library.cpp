// Trains each architecture of parallax::trainers (with an optimizer each) on a
// tiny model and prints, on rank 0, its last loss and its variables' sums as
// hexadecimal floats (every bit). Built twice, header-only and over
// parallax::trainers; trainers_library_np* check both print the same.
#include <parallax/parallax.hpp>
#include <cstdio>
#include <vector>
namespace px = parallax;
template <class Arch, class Opt>
float train(px::Context& ctx, const char* tag, Opt opt) {
  px::Variable<px::Sparse, float> emb(ctx, std::string(tag) + "_emb", {1000, 8}, px::init::Uniform{-0.1f, 0.1f, 1});
  px::Variable<px::Dense, float> w(ctx, std::string(tag) + "_w", {8, 1}, px::init::Constant{0.1});
  px::Trainer<Arch, Opt> trainer(ctx, opt, emb, w);
  float loss = 0;
  for (int step = 0; step < 30; ++step) {
    std::vector<px::index_t> ids;
    for (int i = 0; i < 4; ++i) ids.push_back((step * 37 + ctx.rank() * 4 + i) % 64 * 15);
    auto x = trainer.lookup(emb, ids.data(), ids.size());
    const float* wv = w.value().data();
    std::vector<float> d_rows(ids.size() * 8);
    loss = 0;
    for (std::size_t r = 0; r < ids.size(); ++r) {
      float y = 0;
      for (int c = 0; c < 8; ++c) y += x.data[r * 8 + c] * wv[c];
      const float err = y - (ids[r] % 2 == 0 ? 1.0f : 0.0f);
      loss += err * err / ids.size();
      for (int c = 0; c < 8; ++c) {
        w.grad()[c] += 2 * err * x.data[r * 8 + c] / ids.size();
        d_rows[r * 8 + c] = 2 * err * wv[c] / ids.size();
      }
    }
    emb.grad().add(ids.data(), d_rows.data(), ids.size());
    trainer.step();
  }
  auto all = trainer.fetch(emb);
  double s = 0;
  for (float v : all) s += v;
  if (ctx.rank() == 0) std::printf("%s loss %a emb sum %a w0 %a\n", tag, loss, s, w.value().data()[0]);
  return loss;
}
int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  train<px::arch::Hybrid, px::optim::Adam>(ctx, "hybrid_adam", px::optim::Adam{0.01f});
  train<px::arch::AllReduce, px::optim::Sgd>(ctx, "allreduce_sgd", px::optim::Sgd{0.1f});
  train<px::arch::PS, px::optim::Momentum>(ctx, "ps_momentum", px::optim::Momentum{0.05f, 0.9f});
  train<px::arch::PS, px::optim::Adagrad>(ctx, "ps_adagrad", px::optim::Adagrad{0.1f});
  return 0;
}
