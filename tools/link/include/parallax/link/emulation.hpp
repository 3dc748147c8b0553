#pragma once
/// @file
/// Emulated links between emulated hosts, for tests and benchmarks (a tool
/// library beside parallax, parallax::link; the engine over link::Emulated,
/// link/emulated.hpp, runs them): an engine holds back the
/// completion of a call that moved bytes to or from another host until a
/// link of the given bandwidth and latency could have carried them. Each
/// host has one egress and one ingress link (full duplex), shared by its
/// ranks: a transfer reserves the link from max(its start, the end of the
/// previous reservation) for bytes / bandwidth, so concurrent transfers of
/// one host queue behind each other. The reservations live in a shared
/// window of the host's ranks, as clock readings of std::chrono::steady_clock
/// (one clock for every process of a machine).
///
/// An emulation, not a network: the real transfer still runs at memory speed
/// underneath and the wait is added at completion; a rank that only talks to
/// its own host is not held back by a peer's slow link until it next waits
/// for that peer; a call pays the latency once however many messages it
/// sends. docs/cluster.md ("Emulated links") lists the limits.

#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>

namespace parallax::link {

/// One link kind: bandwidth in bytes per second and latency in seconds.
/// A zero bandwidth means no emulation.
struct LinkSpec {
  double bytes_per_second = 0;
  double latency_s = 0;
  bool enabled() const noexcept { return bytes_per_second > 0; }
  /// Seconds a transfer of `bytes` takes alone on the link.
  double seconds(double bytes) const noexcept { return latency_s + bytes / bytes_per_second; }
};

/// Parses "<number><unit>" where the units are `table`'s (name, factor);
/// `what` names the quantity in the error.
template <std::size_t N>
double parse_quantity(std::string_view text, std::string_view what, std::string_view whole,
                      const std::pair<const char*, double> (&table)[N]) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == 'e' || text[i] == 'E' || text[i] == '+' || text[i] == '-'))
    ++i;
  // "e" may start a unit ("10e" is not a number anyway): back off to the last digit.
  while (i > 0 && !std::isdigit(static_cast<unsigned char>(text[i - 1])) && text[i - 1] != '.') --i;
  const std::string number(text.substr(0, i));
  std::string unit(text.substr(i));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double value = 0;
  std::size_t used = 0;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PARALLAX_EXPECTS(!number.empty() && used == number.size() && value >= 0, "link '", whole, "': the ", what,
                   " '", text, "' does not start with a non-negative number");
  std::string known;
  for (const auto& [name, factor] : table) {
    if (unit == name) return value * factor;
    known += known.empty() ? name : std::string(", ") + name;
  }
  throw error(detail::concat("link '", whole, "': the ", what, " '", text, "' has unit '", unit,
                             "'; expected one of ", known));
}

/// Parses "10Gbit/s,20us" (bandwidth, then latency; the latency may be left
/// out: 0). Bandwidth units: bit/s, Kbit/s, Mbit/s, Gbit/s (powers of 1000),
/// B/s, KB/s, MB/s, GB/s (powers of 1000), KiB/s, MiB/s, GiB/s. Latency
/// units: s, ms, us, ns. An empty text or "off": no emulation.
inline LinkSpec parse_link(std::string_view text) {
  LinkSpec s;
  if (text.empty() || text == "off") return s;
  const auto comma = text.find(',');
  const std::string_view bw = text.substr(0, comma);
  static const std::pair<const char*, double> bandwidth_units[] = {
      {"bit/s", 1.0 / 8},   {"Kbit/s", 1e3 / 8},      {"Mbit/s", 1e6 / 8},      {"Gbit/s", 1e9 / 8},
      {"B/s", 1.0},         {"KB/s", 1e3},            {"MB/s", 1e6},            {"GB/s", 1e9},
      {"KiB/s", 1024.0},    {"MiB/s", 1048576.0},     {"GiB/s", 1073741824.0}};
  static const std::pair<const char*, double> latency_units[] = {{"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  s.bytes_per_second = parse_quantity(bw, "bandwidth", text, bandwidth_units);
  PARALLAX_EXPECTS(s.bytes_per_second > 0, "link '", text, "': the bandwidth must be above zero");
  if (comma != std::string_view::npos) s.latency_s = parse_quantity(text.substr(comma + 1), "latency", text, latency_units);
  return s;
}

/// The links of this rank's host: two reservation clocks (egress, ingress)
/// in a shared window over the host's ranks.
class LinkEmulator {
 public:
  LinkEmulator() = default;
  LinkEmulator(const LinkEmulator&) = delete;
  LinkEmulator& operator=(const LinkEmulator&) = delete;
  ~LinkEmulator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (win_ != MPI_WIN_NULL && !finalized) MPI_Win_free(&win_);
  }

  /// Collective over `host_comm` (the ranks of one host, real or emulated,
  /// which must share this machine's memory). A disabled spec makes nothing.
  void start(const LinkSpec& spec, MPI_Comm host_comm) {
    spec_ = spec;
    if (!spec.enabled()) return;
    int rank = 0;
    PARALLAX_MPI_CHECK(MPI_Comm_rank(host_comm, &rank));
    void* base = nullptr;
    const MPI_Aint bytes = rank == 0 ? static_cast<MPI_Aint>(2 * sizeof(std::int64_t)) : 0;
    PARALLAX_MPI_CHECK(MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, host_comm, &base, &win_));
    MPI_Aint size = 0;
    int unit = 0;
    PARALLAX_MPI_CHECK(MPI_Win_shared_query(win_, 0, &size, &unit, &base));
    clocks_ = static_cast<std::int64_t*>(base);
    if (rank == 0) clocks_[0] = clocks_[1] = 0;
    PARALLAX_MPI_CHECK(MPI_Barrier(host_comm));
  }

  bool enabled() const noexcept { return spec_.enabled(); }
  const LinkSpec& spec() const noexcept { return spec_; }

  /// Waits until a transfer that started at `start` and sent `sent` bytes
  /// over this host's egress and received `received` over its ingress
  /// could have finished: both reservations, then the latency.
  void hold(std::chrono::steady_clock::time_point start, std::uint64_t sent, std::uint64_t received) {
    if (!enabled() || (sent == 0 && received == 0)) return;
    const std::int64_t t0 = start.time_since_epoch().count();
    std::int64_t end = t0;
    if (sent) end = std::max(end, reserve(0, t0, sent));
    if (received) end = std::max(end, reserve(1, t0, received));
    const auto until = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(end)) +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(spec_.latency_s));
    // A sleep ends up to the thread's timer slack (50 us by default on
    // Linux) past its time, plus the scheduler's delay: a step of tens of
    // calls would pay that beside every emulated latency. Sleep until
    // shortly before, then yield until the time.
    const auto early = until - std::chrono::microseconds(200);
    if (std::chrono::steady_clock::now() < early) std::this_thread::sleep_until(early);
    while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }

 private:
  /// Reserves link `which` for `bytes` from max(t0, its end), returns the new end.
  std::int64_t reserve(int which, std::int64_t t0, std::uint64_t bytes) {
    const auto busy = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(static_cast<double>(bytes) / spec_.bytes_per_second))
                          .count();
    // An address-free lock-free atomic over the shared word (x86-64, AArch64).
    auto* clock = reinterpret_cast<std::atomic<std::int64_t>*>(&clocks_[which]);
    static_assert(std::atomic<std::int64_t>::is_always_lock_free, "link emulation needs lock-free 64-bit atomics");
    std::int64_t seen = clock->load(std::memory_order_relaxed), end = 0;
    do {
      end = std::max(seen, t0) + busy;
    } while (!clock->compare_exchange_weak(seen, end, std::memory_order_acq_rel, std::memory_order_relaxed));
    return end;
  }

  LinkSpec spec_;
  MPI_Win win_ = MPI_WIN_NULL;
  std::int64_t* clocks_ = nullptr;
};

}  // namespace parallax::link
