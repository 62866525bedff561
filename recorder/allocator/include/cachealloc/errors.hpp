// Error types thrown by the recorder. Every what() is one line.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace cachealloc {

// Base of every cachealloc error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad argument from the caller: an impossible size, a bad fraction, a
// pointer we never returned.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A bad CACHEALLOC_CONF string or config value. The message names the key.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A device call failed for a reason other than running out of memory. The
// message carries file:line, the call and the backend's own error string.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// The allocator could not satisfy a request after freeing its cache and
// retrying. The figures are those at the moment of failure.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& message, std::size_t requested, std::size_t allocated,
                   std::size_t reserved, std::size_t device_free, std::size_t cap)
      : Error(message), requested_(requested), allocated_(allocated), reserved_(reserved),
        device_free_(device_free), cap_(cap) {}
  std::size_t requested() const noexcept { return requested_; }
  std::size_t allocated() const noexcept { return allocated_; }
  std::size_t reserved() const noexcept { return reserved_; }
  std::size_t device_free() const noexcept { return device_free_; }
  // The memory-fraction cap in bytes, 0 when none is set.
  std::size_t cap() const noexcept { return cap_; }

 private:
  std::size_t requested_, allocated_, reserved_, device_free_, cap_;
};

}  // namespace cachealloc
