#pragma once
// The timeline: every phase of every step, as spans of time on each rank,
// written as one Chrome trace (chrome://tracing, Perfetto: a track per
// rank) when a trainer is given a path (TrainerOptions::timeline, or
// PARALLAX_TIMELINE=file.json). In nvcc translation units each span is also
// an NVTX range, for Nsight Systems.
//
// One recorder per process. Spans are recorded only while it is on, so
// when it is off a span is one test of a flag. The ranks' clocks start
// together at a barrier; a rank's spans are kept in memory and written by
// rank 0 when the trainer that turned it on is destroyed. Spans come from
// two threads (the caller's, and a trainer's communication thread running
// what ready() started): recording takes a lock, and each rank's track has
// a row per thread (tid 0: the thread that started the timeline, tid 1:
// any other).

#include <parallax/config.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>

#include <mpi.h>

#if PARALLAX_HAS_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace parallax::detail {

class Timeline {
 public:
  struct Event {
    std::string name;
    const char* category;
    double start_us, duration_us;
    int thread;  // 0: the thread that started the timeline; 1: another
  };

  /// The process's recorder.
  static Timeline& get() {
    static Timeline t;
    return t;
  }
  bool on() const noexcept { return on_; }

  /// Starts recording for a job on `comm`, to be written to `path` by the
  /// job's rank 0. Collective (a barrier: the ranks' clocks start together).
  void start(MPI_Comm comm, std::string path) {
    PARALLAX_MPI_CHECK(MPI_Barrier(comm));
    comm_ = comm;
    path_ = std::move(path);
    owner_ = std::this_thread::get_id();
    events_.clear();
    events_.reserve(1 << 14);
    origin_ = std::chrono::steady_clock::now();
    on_ = true;
  }

  /// Microseconds since start().
  double now_us() const noexcept {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
  }
  /// Thread-safe while on (a communication thread records beside the caller).
  void record(std::string name, const char* category, double start_us, double end_us) {
    if (!on_) return;
    const int thread = std::this_thread::get_id() == owner_ ? 0 : 1;
    const std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(Event{std::move(name), category, start_us, end_us - start_us, thread});
  }

  /// Stops recording; rank 0 gathers every rank's spans and writes the
  /// trace. Collective on the job's communicator. Returns the bytes written
  /// (0 on other ranks).
  std::size_t finish() {
    if (!on_) return 0;
    on_ = false;
    int me = 0, n = 1;
    PARALLAX_MPI_CHECK(MPI_Comm_rank(comm_, &me));
    PARALLAX_MPI_CHECK(MPI_Comm_size(comm_, &n));
    std::string mine;
    for (const Event& e : events_) {
      char head[160];
      std::snprintf(head, sizeof head, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"%s\",\"name\":\"",
                    me, e.thread, e.start_us, e.duration_us, e.category);
      mine += head;
      for (char c : e.name) {  // a JSON string
        if (c == '"' || c == '\\') mine += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) mine += c;
      }
      mine += "\"},\n";
    }
    events_.clear();
    int length = static_cast<int>(mine.size());
    std::vector<int> lengths(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n));
    PARALLAX_MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm_));
    std::string all;
    if (me == 0) {
      int total = 0;
      for (int r = 0; r < n; ++r) {
        displs[static_cast<std::size_t>(r)] = total;
        total += lengths[static_cast<std::size_t>(r)];
      }
      all.resize(static_cast<std::size_t>(total));
    }
    PARALLAX_MPI_CHECK(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR,
                                   0, comm_));
    if (me != 0) return 0;
    std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    for (int r = 0; r < n; ++r) {  // name each rank's track and its threads' rows
      text += concat("{\"ph\":\"M\",\"pid\":", r, ",\"name\":\"process_name\",\"args\":{\"name\":\"rank ", r, "\"}},\n");
      text += concat("{\"ph\":\"M\",\"pid\":", r, ",\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":\"caller\"}},\n");
      text += concat("{\"ph\":\"M\",\"pid\":", r,
                     ",\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"communication thread\"}},\n");
    }
    text += all;
    if (text.size() >= 2 && text.compare(text.size() - 2, 2, ",\n") == 0) text.resize(text.size() - 2);
    text += "\n]}\n";
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) throw error(concat("timeline: cannot write ", path_));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    std::fclose(f);
    if (!ok) throw error(concat("timeline: writing ", path_, " failed"));
    return text.size();
  }

 private:
  bool on_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string path_;
  std::chrono::steady_clock::time_point origin_;
  std::thread::id owner_;  // the thread that called start()
  std::mutex mutex_;       // guards events_ while on
  std::vector<Event> events_;
};

/// A span of the timeline, from construction to destruction (or end()).
class Span {
 public:
  Span(const char* name, const char* category = "parallax") : Span(std::string(), name, category) {}
  /// A span whose name is built only when the timeline is on.
  template <class... Parts>
  static Span named(const char* category, Parts&&... parts) {
#if !PARALLAX_HAS_CUDA  // NVTX names every range
    if (!Timeline::get().on()) return Span(std::string(), nullptr, category);
#endif
    return Span(concat(std::forward<Parts>(parts)...), nullptr, category);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  Span(Span&& o) noexcept : name_(std::move(o.name_)), literal_(o.literal_), category_(o.category_), start_(o.start_),
                            open_(std::exchange(o.open_, false)) {}
  ~Span() { end(); }
  void end() {
    if (!open_) return;
    open_ = false;
#if PARALLAX_HAS_CUDA
    nvtxRangePop();
#endif
    Timeline& t = Timeline::get();
    if (t.on()) t.record(literal_ ? std::string(literal_) : std::move(name_), category_, start_, t.now_us());
  }

 private:
  Span(std::string name, const char* literal, const char* category)
      : name_(std::move(name)), literal_(literal), category_(category) {
    Timeline& t = Timeline::get();
#if PARALLAX_HAS_CUDA
    nvtxRangePushA(literal_ ? literal_ : name_.c_str());
    open_ = true;
#endif
    if (t.on()) {
      start_ = t.now_us();
      open_ = true;
    }
  }
  std::string name_;
  const char* literal_;
  const char* category_;
  double start_ = 0;
  bool open_ = false;
};

}  // namespace parallax::detail
