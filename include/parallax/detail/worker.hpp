#pragma once
// A trainer's communication thread: work posted by trainer.ready() (a
// fusion bucket's all-reduce, a table group's push) runs on it, in the
// order posted, while the user's kernels run on the calling thread. The
// trainer drains it before any call of its own that communicates, so one
// thread makes engine calls at a time (MPI_THREAD_SERIALIZED is enough).
// Without a thread (MPI without thread support, or TrainerOptions::
// overlap off) posted work runs at once, in the caller.

#include <omp.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace parallax::detail {

class Worker {
 public:
  /// `threaded`: run posted work on a thread of its own.
  explicit Worker(bool threaded) {
    if (threaded) thread_ = std::thread([this] { loop(); });
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  bool threaded() const noexcept { return thread_.joinable(); }

  /// Runs `work` after everything posted before it.
  void post(std::function<void()> work) {
    if (!threaded()) {
      work();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
    }
    wake_.notify_all();
  }

  /// Waits until everything posted has run. Rethrows the first exception a
  /// posted task threw (the tasks posted after it are dropped).
  void drain() {
    if (!threaded()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return queue_.empty() && !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    // Kernels this thread runs (the reductions of an all-reduce) run on it
    // alone: the user's threads keep the cores.
    omp_set_num_threads(1);
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      const bool failed = error_ != nullptr;
      lock.unlock();
      try {
        if (!failed) work();
      } catch (...) {
        std::lock_guard<std::mutex> relock(mutex_);
        error_ = std::current_exception();
        queue_.clear();
      }
      lock.lock();
      busy_ = false;
      if (queue_.empty()) done_.notify_all();
    }
  }

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<std::function<void()>> queue_;
  std::exception_ptr error_;
  bool busy_ = false, stop_ = false;
};

}  // namespace parallax::detail
