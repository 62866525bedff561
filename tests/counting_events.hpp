// An EventSource that counts the blocks it hands out, so that a test can
// hold a report to the number of reads of the events it promises.
#pragma once

#include <cstddef>
#include <span>

#include "cachealloc/analyzer/event_source.hpp"

namespace test_support {

class CountingEvents final : public cachealloc::analyzer::EventSource {
 public:
  explicit CountingEvents(cachealloc::analyzer::EventSource& inner) : inner_(inner) {}
  const cachealloc::snapshot::Snapshot& head() const override { return inner_.head(); }
  std::size_t event_count() const override { return inner_.event_count(); }
  std::size_t block_count() const override { return inner_.block_count(); }
  std::size_t block_begin(std::size_t block) const override { return inner_.block_begin(block); }
  std::span<const cachealloc::snapshot::Event> block(std::size_t block) override {
    ++reads;
    return inner_.block(block);
  }
  std::size_t reads = 0;

 private:
  cachealloc::analyzer::EventSource& inner_;
};

}  // namespace test_support
