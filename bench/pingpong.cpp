// Ping-pong between rank 0 and every other rank, plain MPI: the latency of a
// small message and the rate of a large one, each peer labelled by whether
// MPI_COMM_TYPE_SHARED puts it on rank 0's host. scripts/cluster.sh's hosts
// are checked with it: ranks of one host share memory, ranks of two hosts
// cross the shaped TCP link (bench/run_cluster.sh).
//
//   mpiexec -n 4 bench_pingpong [bytes=8388608] [rounds=10]
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// Seconds per round trip of `bytes` between rank 0 and `peer` (0 elsewhere).
double round_trip(int rank, int peer, std::vector<char>& buf, std::size_t bytes, int rounds) {
  const int n = static_cast<int>(bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < rounds; ++i) {
    if (rank == 0) {
      MPI_Send(buf.data(), n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == peer) {
      MPI_Recv(buf.data(), n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
  }
  return (MPI_Wtime() - t0) / rounds;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{8} << 20;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;

  // Which ranks share rank 0's host, as MPI sees it.
  MPI_Comm shared = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
  int leader = rank;
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared);
  std::vector<int> leaders(static_cast<std::size_t>(size));
  MPI_Gather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::vector<char> hosts(static_cast<std::size_t>(size) * 256);
  MPI_Gather(host, 256, MPI_CHAR, hosts.data(), 256, MPI_CHAR, 0, MPI_COMM_WORLD);

  std::vector<char> buf(bytes > 8 ? bytes : 8);
  for (int peer = 1; peer < size; ++peer) {
    round_trip(rank, peer, buf, bytes, 1);  // warm-up: connections and registration
    const double small = round_trip(rank, peer, buf, 8, 100);
    const double large = round_trip(rank, peer, buf, bytes, rounds);
    if (rank == 0)
      std::printf("pingpong: 0 (%s) <-> %d (%s) %s: latency %.1f us (half a round trip of 8 B), %.1f MB/s (%zu B each way)\n",
                  hosts.data(), peer, &hosts[static_cast<std::size_t>(peer) * 256],
                  leaders[static_cast<std::size_t>(peer)] == 0 ? "same host " : "other host",
                  small / 2 * 1e6, 2.0 * static_cast<double>(bytes) / large / 1e6, bytes);
  }
  MPI_Comm_free(&shared);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
