#pragma once
/// @file
/// Exceptions thrown by parallax and the macros that check calls into MPI,
/// CUDA and NCCL. Every error derives from parallax::error, so one catch
/// clause serves a whole training loop.

#include <parallax/config.hpp>

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace parallax {

/// The base of every exception parallax throws. `what()` is a full sentence
/// naming the variable, the rank and the value that was wrong where known.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& message) : std::runtime_error(message) {}
};

/// A call into a communication or device runtime failed.
/// Carries the runtime's status code, the call text, and where it was made.
class runtime_call_error : public error {
 public:
  runtime_call_error(const std::string& runtime, int status, const std::string& description,
                     const char* call, const char* file, int line)
      : error(format(runtime, status, description, call, file, line)),
        status_(status),
        call_(call),
        file_(file),
        line_(line) {}

  int status() const noexcept { return status_; }
  const std::string& call() const noexcept { return call_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  static std::string format(const std::string& runtime, int status, const std::string& description,
                            const char* call, const char* file, int line) {
    std::ostringstream os;
    os << runtime << " call failed with status " << status << " (" << description << "): " << call
       << " at " << file << ":" << line;
    return os.str();
  }
  int status_;
  std::string call_;
  const char* file_;
  int line_;
};

/// An MPI call returned something other than MPI_SUCCESS.
class mpi_error : public runtime_call_error {
 public:
  using runtime_call_error::runtime_call_error;
};

/// A CUDA runtime call or kernel launch failed.
class cuda_error : public runtime_call_error {
 public:
  using runtime_call_error::runtime_call_error;
};

/// An NCCL call failed, or an asynchronous NCCL error was found.
class nccl_error : public runtime_call_error {
 public:
  using runtime_call_error::runtime_call_error;
};

/// A collective did not complete before its deadline.
class timeout_error : public error {
 public:
  using error::error;
};

namespace detail {

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

[[noreturn]] inline void throw_precondition(std::string message) { throw error(std::move(message)); }

}  // namespace detail
}  // namespace parallax

/// Throws parallax::error with the streamed message parts when `cond` is false.
/// The message is what the user reads: name the variable and the bad value.
#define PARALLAX_EXPECTS(cond, ...)                                                 \
  do {                                                                              \
    if (!(cond)) ::parallax::detail::throw_precondition(::parallax::detail::concat(__VA_ARGS__)); \
  } while (0)
