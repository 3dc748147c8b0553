// Soak: trains many steps of a hybrid model (a sharded embedding, a dense
// layer, Adam) and reports each rank's resident memory after warm-up and at
// the end. Long jobs must not grow: every buffer a step needs is sized in
// the first steps and reused, so the resident set must stay flat.
//
//   mpiexec -n 2 build/host/bench/bench_soak                 # 10,000 steps
//   mpiexec -n 2 build/host/bench/bench_soak --steps 2000 --json soak.json
//
// Prints one line per report interval (step, memory of the largest rank) and
// a summary; exits 1 when the largest growth of any rank's private memory
// from the end of warm-up to the last step reaches --max-growth (default 1%).
//
// Private memory is RssAnon (/proc/self/status): the heap and anonymous
// mappings, everything parallax, the program, MPI and the C++ runtime
// allocate. The resident set also counts shared pages: MPICH maps its
// intra-node shared-memory segments in full at MPI_Init and they become
// resident as its message queues first touch them, a few KiB at a time over
// thousands of steps (seen at 4 ranks on 2 cores, where ranks fall out of
// step and queues run deeper), never beyond the mapped size. Those are
// reported apart (RssShmem, and the mapped size of the shared segments)
// along with the whole RSS, so nothing is hidden. The ids change
// every step (a random batch) and a checkpoint is written every
// --checkpoint-every steps (and once during warm-up, which sizes the save's
// buffers), so the resizing paths, the partition exchange and the checkpoint
// files are all exercised.
#include <parallax/parallax.hpp>

#include <boost/program_options.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace px = parallax;
namespace po = boost::program_options;

namespace {

/// Resident memory of this process in bytes: all of it (VmRSS), private
/// (RssAnon) and shared-memory pages (RssShmem), from /proc/self/status; and
/// the mapped size of its shared segments (rw-s mappings of no regular file,
/// /proc/self/maps), the bound on what RssShmem can reach.
struct Memory {
  double rss = 0, private_ = 0, shmem = 0, shmem_mapped = 0;
};
Memory memory() {
  Memory m;
  std::ifstream f("/proc/self/status");
  std::string key;
  double kib = 0;
  while (f >> key) {
    if (key == "VmRSS:" || key == "RssAnon:" || key == "RssShmem:") {
      f >> kib;
      (key == "VmRSS:" ? m.rss : key == "RssAnon:" ? m.private_ : m.shmem) = kib * 1024;
    }
    f.ignore(1 << 20, '\n');
  }
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && perms[3] == 's' &&
        (line.find("/SYSV") != std::string::npos || line.find("/dev/shm/") != std::string::npos))
      m.shmem_mapped += double(hi - lo);
  }
  return m;
}

double max_over(double v, MPI_Comm c) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, c);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  long steps = 10000, warmup = 1000, report_every = 1000, checkpoint_every = 2500;
  std::size_t rows = 200000, cols = 32, batch = 512;
  double max_growth = 0.01;
  std::string json, dir;
  po::options_description desc("bench_soak: resident memory over a long hybrid training run");
  desc.add_options()("help", "this text")("steps", po::value(&steps)->default_value(steps), "training steps")(
      "warmup", po::value(&warmup)->default_value(warmup), "steps before the first RSS reading")(
      "report-every", po::value(&report_every)->default_value(report_every), "progress line every N steps")(
      "checkpoint-every", po::value(&checkpoint_every)->default_value(checkpoint_every),
      "save a checkpoint every N steps (0: never)")("rows", po::value(&rows)->default_value(rows),
                                                     "embedding rows")(
      "cols", po::value(&cols)->default_value(cols), "embedding width")(
      "batch", po::value(&batch)->default_value(batch), "ids per rank per step")(
      "max-growth", po::value(&max_growth)->default_value(max_growth), "largest tolerated growth of private memory (fraction)")(
      "json", po::value(&json), "write the result as JSON to this file (rank 0)")(
      "dir", po::value(&dir), "checkpoint directory (default: a temporary one)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "bench_soak: " << e.what() << "\n" << desc;
    return 2;
  }
  px::Context ctx(argc, argv);
  if (vm.count("help")) {
    if (ctx.rank() == 0) std::cout << desc;
    return 0;
  }
  const MPI_Comm comm = ctx.comm();
  const bool root = ctx.rank() == 0;
  if (dir.empty()) {  // one folder for the job: rank 0's process id, sent to every rank
    long id = static_cast<long>(getpid());
    MPI_Bcast(&id, 1, MPI_LONG, 0, comm);
    dir = (std::filesystem::temp_directory_path() / ("parallax-soak-" + std::to_string(id))).string();
  }

  px::Variable<px::Sparse, float> emb(ctx, "emb", {rows, cols}, px::init::Uniform{-0.1f, 0.1f, 1});
  px::Variable<px::Dense, float> w(ctx, "w", {cols, cols}, px::init::Glorot{2});
  px::Variable<px::Dense, float> b(ctx, "b", {1, cols}, px::init::Zeros{});
  px::TrainerOptions options;
  options.checkpoint.dir = dir;
  options.checkpoint.keep_last = 2;
  px::Trainer<px::arch::Hybrid, px::optim::Adam> trainer(ctx, options, px::optim::Adam{1e-3f}, emb, w, b);

  std::mt19937_64 rng(17 + static_cast<unsigned>(ctx.rank()));
  std::uniform_int_distribution<px::index_t> pick(0, static_cast<px::index_t>(rows) - 1);
  std::vector<px::index_t> ids(batch);
  std::vector<float> grad;
  Memory start_max, mine_start;
  double start_time = 0;
  auto max_of = [&](const Memory& m) {
    return Memory{max_over(m.rss, comm), max_over(m.private_, comm), max_over(m.shmem, comm),
                  max_over(m.shmem_mapped, comm)};
  };
  for (long s = 1; s <= steps; ++s) {
    // A batch of a random size around `batch`, so buffers see new sizes.
    ids.resize(batch / 2 + static_cast<std::size_t>(rng() % batch));
    for (auto& id : ids) id = pick(rng);
    const auto x = trainer.lookup(emb, ids);
    grad.assign(x.size(), 0.f);
    for (std::size_t i = 0; i < x.size(); ++i) grad[i] = 1e-2f * x.data[i];
    emb.grad().add(ids, grad);
    for (std::size_t i = 0; i < w.grad().size(); ++i) w.grad()[i] = 1e-3f * float(i % 7);
    for (std::size_t i = 0; i < b.grad().size(); ++i) b.grad()[i] = 1e-3f;
    trainer.step();
    // Warm-up runs every path once, a save included: the first save sizes
    // the buffers the later ones reuse.
    if (checkpoint_every > 0 && (s % checkpoint_every == 0 || s == warmup / 2)) trainer.save();
    if (s == warmup) {
      mine_start = memory();
      start_max = max_of(mine_start);
      start_time = MPI_Wtime();
    }
    if (s % report_every == 0 || s == steps) {
      const Memory m = max_of(memory());
      if (root)
        std::printf("step %6ld  max over ranks: private %8.2f MiB, rss %8.2f MiB (shared segments %6.2f of %6.2f MiB)\n",
                    s, m.private_ / 1048576.0, m.rss / 1048576.0, m.shmem / 1048576.0, m.shmem_mapped / 1048576.0);
    }
  }
  // Growth of each rank from warm-up to the end; the largest over the ranks.
  const Memory mine_end = memory(), end_max = max_of(mine_end);
  auto growth_of = [&](double from, double to) { return max_over(from > 0 ? (to - from) / from : 0, comm); };
  const double growth = growth_of(mine_start.private_, mine_end.private_);
  const double rss_growth = growth_of(mine_start.rss, mine_end.rss);
  const double elapsed = MPI_Wtime() - start_time;
  const bool ok = growth < max_growth;
  if (root) {
    const double MiB = 1048576.0;
    std::printf("soak: %d ranks, %ld steps (%.1f steps/s after warm-up); max over ranks after step %ld -> %ld: "
                "private %.2f -> %.2f MiB, growth %+.3f%% (limit %.2f%%): %s; rss %.2f -> %.2f MiB (%+.3f%%), of "
                "which MPI's shared segments %.2f -> %.2f MiB resident of %.2f MiB mapped\n",
                ctx.size(), steps, double(steps - warmup) / elapsed, warmup, steps, start_max.private_ / MiB,
                end_max.private_ / MiB, 100 * growth, 100 * max_growth, ok ? "flat" : "GROWING", start_max.rss / MiB,
                end_max.rss / MiB, 100 * rss_growth, start_max.shmem / MiB, end_max.shmem / MiB,
                end_max.shmem_mapped / MiB);
    if (!json.empty()) {
      std::ofstream f(json);
      f << "{\"ranks\": " << ctx.size() << ", \"steps\": " << steps << ", \"warmup\": " << warmup
        << ", \"private_start_bytes\": " << start_max.private_ << ", \"private_end_bytes\": " << end_max.private_
        << ", \"growth\": " << growth << ", \"rss_start_bytes\": " << start_max.rss
        << ", \"rss_end_bytes\": " << end_max.rss << ", \"rss_growth\": " << rss_growth
        << ", \"shmem_start_bytes\": " << start_max.shmem << ", \"shmem_end_bytes\": " << end_max.shmem
        << ", \"shmem_mapped_bytes\": " << end_max.shmem_mapped << ", \"steps_per_s\": "
        << double(steps - warmup) / elapsed << ", \"flat\": " << (ok ? "true" : "false") << "}\n";
    }
  }
  MPI_Barrier(comm);
  if (root) std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
